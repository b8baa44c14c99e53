"""The Weights & Biases logger: step metrics, rollout tables, source code and process logs.

Enabled by ``use_wandb``. The local run store records everything regardless; this logger
mirrors it to W&B:

- ``wandb.init(project=wandb_project, name=wandb_run_name, tags=wandb_tags,
  config=<resolved config>, dir=<run dir>)``; W&B writes its own files under
  ``<run dir>/wandb/``. System metrics are sampled every
  ``system_metrics_collection_interval_seconds``. ``WANDB_PROJECT``, ``WANDB_NAME`` and
  ``WANDB_TAGS`` fill the fields the config leaves at their defaults, ``WANDB_ENTITY``,
  ``WANDB_RUN_GROUP`` and ``WANDB_JOB_TYPE`` pass through, and the W&B run id is
  recorded in ``<run dir>/wandb_run.json``: a resumed run continues the same W&B run
  (``WANDB_RUN_ID`` chooses another); see :mod:`telescope.recording.wandb_identity`.
- Mode: the ``WANDB_MODE`` environment variable when set (``online``, ``offline``,
  ``disabled``); otherwise ``online`` when an API key is configured (``WANDB_API_KEY`` or a
  netrc entry for the W&B host, what ``wandb login`` writes) and ``offline`` when not, so a
  run without credentials never blocks on a login prompt. Sync an offline run later with
  ``wandb sync <run dir>/wandb/offline-run-*``.
- :meth:`WandbLogger.log_step` logs scalars with ``step=``; :meth:`WandbLogger.log_rollouts`
  logs one ``wandb.Table`` per call (key ``rollouts_table``), bounded to
  :attr:`WandbLogger.max_table_rows` rows (W&B's own limit per table) and
  :attr:`WandbLogger.max_text_chars` characters per text cell.
- Timeline events (:meth:`WandbLogger.log_event`, subscribed to the run's event bus) are
  buffered and flushed as a ``wandb.Table`` with each step's metrics (key
  ``events_table``; more than :attr:`WandbLogger.max_table_rows` events go to
  ``events_table_2``, ``events_table_3``, ...), and the rest at :meth:`close` (key
  ``events_table_end``). Columns: :data:`EVENT_COLUMNS`; the event's other fields are
  one JSON cell (``fields``).
- Evals (:meth:`WandbLogger.log_eval`) are logged into the current history row
  (``commit=False``) with their own step as a field, ``eval/<name>/step``, which
  ``define_metric`` makes the x axis of ``eval/<name>/*``: W&B drops a ``log`` whose step
  is lower than one already logged, and an eval that ran beside training finishes
  after later steps were logged.
- ``metadata.json`` of the run directory (if written) is saved with the run's files.
- ``wandb_upload_code``: at start, the run directory's code snapshot (``code/``, see
  :mod:`telescope.recording.run_metadata`) through ``run.log_code`` (the run's Code tab);
  without a snapshot, the same selection is made here from the working directory
  (``wandb_code_exclude_patterns`` and ``wandb_code_max_file_size_mb``, core fields read
  from the logger's context) and copied to a temporary folder first, so that W&B does not
  walk ``.venv`` and other excluded trees.
- ``wandb_upload_logs``: at :meth:`close`, the run directory's ``logs/`` as one
  ``logs.tar.gz`` in a ``logs`` artifact: the main logs always, ``logs/detailed/`` with
  ``wandb_upload_logs_detailed`` and ``logs/stdout/`` with ``wandb_upload_logs_stdout``.

Failures never stop a run: a missing ``wandb`` package (the message gives the install
command) or any exception from W&B is reported once (a warning on the
``telescope.loggers.wandb`` logger, kept in :attr:`WandbLogger.failure`) and the logger
disables itself; later calls do nothing. ``wandb`` is imported only when the logger starts.

Limits: W&B drops a ``log`` whose step is lower than one already logged (the steps a
resumed run trains again keep their first values there); two results of the same eval
that land in one history row keep the later one (the run store keeps both). A hung W&B
service can still block ``wandb.init`` or ``finish`` up to W&B's own timeouts.
"""

from __future__ import annotations

import json
import logging
import netrc
import os
import re
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlparse

from telescope.api.logger import Logger
from telescope.api.settings import PluginSettings
from telescope.recording.plugin import WandbSettings
from telescope.recording.run_metadata import CODE_DIR, METADATA_FILE, code_files
from telescope.recording.wandb_identity import record_run, resolve_identity

if TYPE_CHECKING:
    from telescope.api.context import LoggerContext

_log = logging.getLogger("telescope.loggers.wandb")

INSTALL_HINT = "pip install 'telescope-core[wandb]'"
WANDB_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")

TABLE_COLUMNS = [
    "step",
    "group_index",
    "sample_id",
    "environment",
    "prompt",
    "completion",
    "reward",
    "advantage",
    "stop_reason",
    "completion_tokens",
    "policy_version",
    "error",
]

#: Columns of the events table; an event's other fields go into ``fields`` (JSON).
EVENT_COLUMNS = [
    "kind",
    "start",
    "duration_s",
    "component",
    "step",
    "server",
    "rank",
    "group_id",
    "sample_id",
    "request_id",
]


def api_key_configured() -> bool:
    """Whether W&B credentials are set up (``WANDB_API_KEY`` or a netrc entry for the W&B host)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    netrc_path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return host in netrc.netrc(str(netrc_path)).hosts
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode() -> str:
    """``WANDB_MODE`` when set, else ``online`` with credentials and ``offline`` without."""
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if mode:
        if mode not in WANDB_MODES:
            raise ValueError(f"WANDB_MODE={mode!r} is not one of {', '.join(WANDB_MODES)}")
        return mode
    return "online" if api_key_configured() else "offline"


def log_files(logs_dir: Path, *, detailed: bool, stdout: bool) -> list[Path]:
    """Files of ``logs_dir`` to upload: all but ``detailed/`` and ``stdout/`` unless asked for."""
    if not logs_dir.is_dir():
        return []
    selected: list[Path] = []
    for path in sorted(logs_dir.rglob("*")):
        if not path.is_file():
            continue
        top = path.relative_to(logs_dir).parts[0]
        if (top == "detailed" and not detailed) or (top == "stdout" and not stdout):
            continue
        selected.append(path)
    return selected


def _include_all(path: str, root: str) -> bool:
    return True


def _exclude_none(path: str, root: str) -> bool:
    return False


def _artifact_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


def _event_row(event: dict[str, Any]) -> list[Any]:
    """One events-table row: the :data:`EVENT_COLUMNS` (ids that are not numbers as text), then the rest as JSON."""
    row: list[Any] = []
    for column in EVENT_COLUMNS:
        value = event.get(column)
        if column in ("start", "duration_s", "step", "server", "rank"):
            row.append(value if isinstance(value, (int, float)) and not isinstance(value, bool) else None)
        else:
            row.append(None if value is None else str(value))
    rest = {k: v for k, v in event.items() if k not in EVENT_COLUMNS}
    row.append(json.dumps(rest, separators=(",", ":"), default=str))
    return row


def _clip(value: Any, limit: int) -> str:
    if isinstance(value, list):  # chat messages
        value = "\n".join(
            f"{m.get('role', '?')}: {m.get('content', '')}" if isinstance(m, dict) else str(m) for m in value
        )
    text = "" if value is None else str(value)
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


class WandbLogger(Logger):
    """Mirrors the run to Weights & Biases; see the module docstring for what and how."""

    name: ClassVar[str] = "wandb"
    max_table_rows: ClassVar[int] = 10_000
    max_text_chars: ClassVar[int] = 4000
    max_code_files: ClassVar[int] = 5000

    def __init__(self, context: LoggerContext, settings: WandbSettings | None = None) -> None:
        super().__init__(context, settings)
        self.wandb_settings = settings or WandbSettings()
        self.failure: str | None = None
        self._run: Any = None
        self._wandb: Any = None
        self._closed = False
        self._events: list[dict[str, Any]] = []
        self._events_lock = threading.Lock()
        self._eval_axes: set[str] = set()
        self._last_step = -1
        self._start()

    @classmethod
    def enabled(cls, settings: PluginSettings | None) -> bool:
        return isinstance(settings, WandbSettings) and settings.use_wandb

    @property
    def active(self) -> bool:
        """Whether the logger is sending (it started and has not failed or closed)."""
        return self._run is not None and self.failure is None and not self._closed

    # ----------------------------------------------------------------- start

    def _start(self) -> None:
        try:
            import wandb
        except ImportError as exc:
            self._fail(
                f"the wandb package is not installed ({exc}); install it with {INSTALL_HINT} or set use_wandb: false"
            )
            return
        self._wandb = wandb
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            identity = resolve_identity(
                project=self.wandb_settings.wandb_project,
                name=self.context.run_name,
                tags=self.wandb_settings.wandb_tags,
                explicit=self.context.explicit_fields,
                run_dir=self.run_dir,
            )
            self._run = wandb.init(
                **identity.init_kwargs(),
                config=dict(self.context.resolved_config),
                dir=str(self.run_dir),
                mode=wandb_mode(),  # type: ignore[arg-type]
                reinit="create_new",
                settings=wandb.Settings(
                    x_stats_sampling_interval=self.context.system_metrics_interval_s,
                ),
            )
        except Exception as exc:
            self._fail(f"could not start a W&B run: {type(exc).__name__}: {exc}")
            return
        self._guard("run id record", lambda: record_run(self.run_dir, self._run))
        if self.wandb_settings.wandb_upload_code:
            self._guard("code upload", self._upload_code)
        if (self.run_dir / METADATA_FILE).exists():
            self._guard(
                "metadata",
                lambda: self._run.save(str(self.run_dir / METADATA_FILE), base_path=str(self.run_dir), policy="now"),
            )

    def _upload_code(self) -> None:
        """Hand the run's code snapshot to ``run.log_code``, or select and stage the files here.

        ``log_code`` walks its whole root without pruning (a ``.venv`` costs seconds), so
        the selection (with pruning) is done first and only the selected files are walked.
        """
        snapshot = self.run_dir / CODE_DIR
        if snapshot.is_dir():
            self._run.log_code(root=str(snapshot), include_fn=_include_all, exclude_fn=_exclude_none)
            return
        root = Path.cwd()
        files = code_files(
            root,
            self.context.code_max_file_size_mb,
            list(self.context.code_exclude_patterns),
            self.max_code_files,
            skip=self.run_dir,
        )
        if not files:
            return
        with tempfile.TemporaryDirectory(prefix="telescope-code-") as staging:
            for path in files:
                target = Path(staging) / path.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
            self._run.log_code(root=staging, include_fn=_include_all, exclude_fn=_exclude_none)

    # --------------------------------------------------------------- logging

    def log_step(self, step: int, metrics: dict[str, Any]) -> None:
        values = {key: value for key, value in metrics.items() if value is not None}
        self._guard("log", lambda: self._run.log({**values, **self._event_tables("events_table")}, step=step))
        self._last_step = max(self._last_step, step)

    def log_eval(self, name: str, step: int, metrics: dict[str, Any], **extra: Any) -> None:
        """Log into the current row, with ``eval/<name>/step`` as the x axis of ``eval/<name>/*``."""
        axis = f"eval/{name}/step"

        def log() -> None:
            if axis not in self._eval_axes:
                self._run.define_metric(axis, hidden=True)
                self._run.define_metric(f"eval/{name}/*", step_metric=axis)
                self._eval_axes.add(axis)
            values = {key: value for key, value in metrics.items() if isinstance(value, (int, float))}
            self._run.log({**values, axis: step}, commit=False)

        self._guard("eval log", log)

    def log_event(self, event: dict[str, Any]) -> None:
        """Buffer one timeline event (any thread); it goes out with the next step's metrics."""
        if self.active:
            with self._events_lock:
                self._events.append(event)

    def _event_tables(self, key: str) -> dict[str, Any]:
        """The buffered events as tables of at most ``max_table_rows`` rows (``key``, ``key_2``, ...)."""
        with self._events_lock:
            buffered, self._events = self._events, []
        tables: dict[str, Any] = {}
        for chunk, first in enumerate(range(0, len(buffered), self.max_table_rows)):
            rows = [_event_row(e) for e in buffered[first : first + self.max_table_rows]]
            name = key if chunk == 0 else f"{key}_{chunk + 1}"
            tables[name] = self._wandb.Table(columns=[*EVENT_COLUMNS, "fields"], data=rows)
        return tables

    def log_rollouts(self, step: int, rollouts: list[dict[str, Any]]) -> None:
        if not rollouts:
            return

        def log_table() -> None:
            rows = [
                [
                    record.get("step", step),
                    record.get("group_index"),
                    str(record.get("sample_id", "")),
                    str(record.get("environment", "")),
                    _clip(record.get("prompt"), self.max_text_chars),
                    _clip(record.get("completion"), self.max_text_chars),
                    record.get("reward"),
                    record.get("advantage"),
                    str(record.get("stop_reason", "")),
                    record.get("completion_tokens"),
                    record.get("policy_version"),
                    _clip(record.get("error"), self.max_text_chars),
                ]
                for record in rollouts[: self.max_table_rows]
            ]
            table = self._wandb.Table(columns=TABLE_COLUMNS, data=rows)
            self._run.log({"rollouts_table": table}, step=step)

        self._guard("rollout table", log_table)

    def close(self) -> None:
        """Upload the logs (if asked for) and finish the W&B run; safe to call twice."""
        if self._closed:
            return
        if self.active:
            self._guard("events", self._flush_events_at_end)
        if self.active and self.wandb_settings.wandb_upload_logs:
            self._guard("log upload", self._upload_logs)
        if self.active:
            self._guard("finish", self._run.finish)
        self._closed = True

    def _upload_logs(self) -> None:
        logs_dir = self.run_dir / "logs"
        files = log_files(
            logs_dir,
            detailed=self.wandb_settings.wandb_upload_logs_detailed,
            stdout=self.wandb_settings.wandb_upload_logs_stdout,
        )
        if not files:
            return
        handle, archive_name = tempfile.mkstemp(prefix=".logs-", suffix=".tar.gz", dir=self.run_dir)
        os.close(handle)
        archive = Path(archive_name)
        try:
            with tarfile.open(archive, "w:gz") as tar:
                for path in files:
                    tar.add(path, arcname=str(Path("logs") / path.relative_to(logs_dir)))
            artifact = self._wandb.Artifact(_artifact_name(f"logs-{self._run.id}"), "logs")
            artifact.add_file(str(archive), name="logs.tar.gz", policy="mutable")  # copies to W&B's staging
            self._run.log_artifact(artifact)
        finally:
            archive.unlink(missing_ok=True)

    def _flush_events_at_end(self) -> None:
        tables = self._event_tables("events_table_end")
        if tables:
            self._run.log(tables, step=max(self._last_step, 0))

    # ------------------------------------------------------------- failures

    def _guard(self, action: str, call: Callable[[], object]) -> None:
        """Run a W&B call unless disabled; an exception disables the logger (reported once)."""
        if not self.active:
            return
        try:
            call()
        except Exception as exc:
            self._fail(f"W&B {action} failed: {type(exc).__name__}: {exc}")

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message
            _log.warning("%s; W&B logging is off for the rest of this run (the local run store is unaffected)", message)
