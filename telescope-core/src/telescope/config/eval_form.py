"""The standalone eval's config form (``telescope eval``): its defaults and what it requires.

``telescope eval`` reads the same flat schema as a run. Two things differ:

- **Defaults.** A dedicated eval config (one without ``environments``, such as the
  upstream's ``configs/evals/eval.yaml``) starts from :data:`EVAL_DEFAULTS` over the
  declarations' defaults: the values of ``configs/defaults/default_eval.yaml`` where they
  differ from a run's (a test keeps every value of that file equal to the eval default).
  A training run config (one with ``environments``) keeps its run's defaults, so that
  evaluating a run's checkpoints with its own config gives numbers comparable with the
  evals the run made itself.
- **Requirements.** Instead of an environment, an eval needs at least one ``evals``
  entry and a checkpoint source: ``checkpoint_dir`` (its ``step_N`` folders) and/or
  ``checkpoints`` (``[{path, step}]``), unless the command line names one checkpoint
  (``telescope eval CONFIG CHECKPOINT``). Only the rules of the inference servers and the
  evals apply (:func:`telescope.schema.config.cross_field_problems` with ``purpose="eval"``);
  a training run's rules (``seq_len``, the algorithm's) are not asked of an eval.

Whether the folders exist is checked when the eval starts
(:mod:`telescope.runtime.eval_checkpoints`), not at load time, so an eval config
validates on a machine that does not hold the checkpoints.
"""

from __future__ import annotations

from typing import Any

from telescope.schema.config import TelescopeConfig

#: Where ``telescope eval``'s defaults differ from a run's: ``configs/defaults/default_eval.yaml``.
#: (``ray_namespace`` is mirrored for completeness: the standalone eval starts no Ray.)
EVAL_DEFAULTS: dict[str, Any] = {
    "inference_num_workers": 1,
    "max_model_len": 4000,
    "ray_namespace": "telescope-eval",
}


def eval_layer(data: dict[str, Any]) -> dict[str, Any]:
    """The eval defaults that apply under ``data`` (the merged file and command-line values)."""
    if data.get("environments"):
        return {}  # a training run config: evaluated with its run's settings
    return {name: value for name, value in EVAL_DEFAULTS.items() if name not in data}


def eval_problems(config: TelescopeConfig, *, layer: bool = False, checkpoint_argument: bool = False) -> list[str]:
    """What a standalone eval needs beyond the inference rules; one message per missing piece.

    ``layer``: a defaults layer (nothing is required of it). ``checkpoint_argument``: the
    command line names the checkpoint, so the config needs no checkpoint source.
    """
    if layer:
        return []
    problems: list[str] = []
    if not config.evals:
        problems.append("evals: telescope eval needs at least one eval, e.g. evals: [{name: countdown}]")
    if not checkpoint_argument and not config.checkpoint_dir and not config.checkpoints:
        problems.append(
            "no checkpoint to evaluate: set checkpoint_dir (a folder of step_N checkpoints) or checkpoints "
            "([{path: ..., step: N}]), or pass one: telescope eval CONFIG CHECKPOINT"
        )
    return problems
