"""The W&B run a standalone eval logs into (``wandb_run_path: entity/project/run_id``).

As the upstream does, the eval attaches to the run with ``wandb.init(entity=..., project=...,
id=..., resume="allow")``: a run with that id (typically the training run) is resumed and
the eval's results land beside its training curves; an id that does not exist yet makes
a new run with it. The mode is the W&B logger's (:func:`~telescope.recording.wandb_logger.wandb_mode`):
``WANDB_MODE`` when set, else online with credentials and offline without; an offline run
is synced later with ``wandb sync``.

What is logged: after each checkpoint, one history row with every eval's metrics
(``eval/<name>/<metric>``, the keys a training run's evals use) and, for each eval,
``eval/<name>/step`` = the checkpoint's training step, which ``define_metric`` makes the
x axis of ``eval/<name>/*``. The row is logged without ``step=``: W&B drops a row whose
step is below one already logged, and a resumed training run is past every checkpoint
step. The upstream uploads its per-sample tables instead; here those stay in the local
``evals.jsonl``/run store (``--output``).

Failures: a missing ``wandb`` package, or a run W&B will not open, is an
:class:`EvalWandbError` before any server starts (W&B was asked for); an error from W&B
while logging is reported once as a warning and W&B is off for the rest of the eval,
whose results are still written locally.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from telescope.recording.wandb_logger import INSTALL_HINT, wandb_mode

_log = logging.getLogger("telescope.eval.wandb")


class EvalWandbError(RuntimeError):
    """W&B was asked for (``wandb_run_path``) and cannot be used."""


class EvalWandbRun:
    """A W&B run (resumed or created by id) that takes each checkpoint's eval metrics at its step."""

    def __init__(self, run_path: str, directory: Path) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise EvalWandbError(
                f"wandb_run_path is set but the wandb package is not installed ({exc}); install it with "
                f"{INSTALL_HINT} or set wandb_run_path: null"
            ) from None
        entity, project, run_id = run_path.split("/")  # the schema checked the form
        directory.mkdir(parents=True, exist_ok=True)
        self.failure: str | None = None
        self._axes: set[str] = set()
        try:
            self._run: Any = wandb.init(
                entity=entity,
                project=project,
                id=run_id,
                resume="allow",
                dir=str(directory),
                mode=wandb_mode(),  # type: ignore[arg-type]
                reinit="create_new",
            )
        except Exception as exc:
            raise EvalWandbError(
                f"could not open the W&B run {run_path!r} (wandb_run_path): {type(exc).__name__}: {exc}; check the "
                "path and your W&B login, or run offline with WANDB_MODE=offline"
            ) from None

    def log(self, step: int, results: dict[str, dict[str, float]]) -> None:
        """One history row: every eval's metrics of the checkpoint at ``step``, with ``eval/<name>/step``."""
        if self.failure is not None:
            return
        row: dict[str, float] = {}
        try:
            for name, metrics in results.items():
                axis = f"eval/{name}/step"
                if axis not in self._axes:
                    self._run.define_metric(axis, hidden=True)
                    self._run.define_metric(f"eval/{name}/*", step_metric=axis)
                    self._axes.add(axis)
                row.update({key: value for key, value in metrics.items() if isinstance(value, (int, float))})
                row[axis] = step
            self._run.log(row)
        except Exception as exc:
            self._fail(f"W&B log failed: {type(exc).__name__}: {exc}")

    def finish(self) -> None:
        try:
            self._run.finish()
        except Exception as exc:
            self._fail(f"W&B finish failed: {type(exc).__name__}: {exc}")

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message
            _log.warning("%s; W&B logging is off for the rest of this eval (evals.jsonl is unaffected)", message)
