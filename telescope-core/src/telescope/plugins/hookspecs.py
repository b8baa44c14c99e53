"""Every hook a Telescope plugin can implement, in one place, grouped by phase.

A plugin is a module (or object) with functions decorated by ``telescope.hookimpl``
and named after the specs below. Third-party packages expose their plugin module
in the ``telescope`` entry-point group::

    [project.entry-points.telescope]
    my_package = "my_package.plugin"

The core registers its own built-ins through exactly these hooks, from the tuple
``telescope.plugins.manager.BUILTIN_PLUGINS``.

Phases:

1. Registration (start-up): each ``telescope_register_*`` hook receives a
   :class:`telescope.plugins.registry.Registrar` bound to one plugin kind and one
   plugin, and calls ``register(name, target, **metadata)`` for each name it
   provides. ``target`` is the object itself or a lazy ``"module:attribute"``
   string, so that registering never imports torch, transformers or ray.
   Metadata every kind understands: ``settings`` (the config fields the plugin
   owns, a :class:`telescope.api.settings.PluginSettings` model; composed into the
   one flat config schema and passed to the plugin's constructor) and
   ``install_hint`` (what to install when the target cannot be imported).
2. Command line (start-up): ``telescope_add_commands`` adds click commands.
3. Configuration (load time): ``telescope_validate_config`` adds cross-field rules.
4. Run lifecycle (once per run and once per step; never per sample or token):
   ``telescope_run_start``, ``telescope_step_end``, ``telescope_run_end``.

Hooks are resolved once at start-up; nothing in a per-sample or per-token hot path
goes through pluggy. The core calls them only through the typed facade
:class:`telescope.plugins.facade.Plugins`. An implementation whose name matches no
spec here is an error when the plugin loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import click

    from telescope.plugins.registry import Registrar
    from telescope.schema.config import TelescopeConfig

PROJECT_NAME = "telescope"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --------------------------------------------------------------------------------------
# 1. Registration: one hook per plugin kind.
# --------------------------------------------------------------------------------------


@hookspec
def telescope_register_environments(register: Registrar) -> None:
    """Register environment classes (subclasses of ``telescope.api.EnvironmentBase``).

    Example: ``register("countdown", "telescope_envs.countdown:CountdownEnvironment")``.
    The name is what ``environments[].name`` in a config refers to.
    """


@hookspec
def telescope_register_evals(register: Registrar) -> None:
    """Register dedicated evals (``telescope.api.EvalSpec`` objects), e.g. ``math500``.

    Any registered environment can also be used as an eval by its own name.
    """


@hookspec
def telescope_register_algorithms(register: Registrar) -> None:
    """Register RL algorithms (subclasses of ``telescope.api.Algorithm``).

    The config validator reads the algorithm's declared capabilities
    (``group_based``, ``supports_ppo_clip``, ``ratio_based``, advantage
    normalisations) from the class, so a lazily registered algorithm must pass them
    as metadata: ``register("grpo", "pkg.grpo:GRPO", **GRPO capabilities)``; see
    :class:`telescope.api.algorithm.AlgorithmCapabilities`.
    """


@hookspec
def telescope_register_trainer_backends(register: Registrar) -> None:
    """Register trainer backends (``telescope.api.TrainerBackend``), e.g. ``fsdp``."""


@hookspec
def telescope_register_inference_backends(register: Registrar) -> None:
    """Register inference backends (``telescope.api.InferenceBackend``), e.g. ``embedded``."""


@hookspec
def telescope_register_weight_transports(register: Registrar) -> None:
    """Register weight transports (``telescope.api.WeightTransport``), e.g. ``nccl``."""


@hookspec
def telescope_register_sandbox_providers(register: Registrar) -> None:
    """Register sandbox providers (``telescope.api.SandboxProvider``), e.g. ``local``."""


@hookspec
def telescope_register_browser_providers(register: Registrar) -> None:
    """Register browser providers (``telescope.api.BrowserProvider``), e.g. ``local``.

    The name is what the ``browser_provider`` setting (and a browser environment's own
    ``browser_provider`` keyword argument) refers to.
    """


@hookspec
def telescope_register_loggers(register: Registrar) -> None:
    """Register metric loggers (``telescope.api.Logger``), e.g. ``wandb``."""


@hookspec
def telescope_register_compactions(register: Registrar) -> None:
    """Register context compaction strategies (``telescope.api.compaction.Compactor``), e.g. ``summarize``.

    The name is what the ``compaction`` setting refers to.
    """


# --------------------------------------------------------------------------------------
# 2. Command line.
# --------------------------------------------------------------------------------------


@hookspec
def telescope_add_commands(cli: click.Group) -> None:
    """Add commands to the ``telescope`` command group (``cli.add_command(...)``).

    Keep the module that implements this light: it is imported by every command.
    Import heavy dependencies inside the command function.
    """


# --------------------------------------------------------------------------------------
# 3. Configuration.
# --------------------------------------------------------------------------------------


@hookspec
def telescope_validate_config(config: TelescopeConfig) -> list[str] | None:
    """Return problems with a loaded config (one message per problem), or None.

    Called after the schema and the built-in cross-field rules have passed. Each
    message should name the fields involved and say how to fix it.
    """


# --------------------------------------------------------------------------------------
# 4. Run lifecycle. Called by the orchestrator process, once per run or per step.
# --------------------------------------------------------------------------------------


@hookspec
def telescope_run_start(config: TelescopeConfig, run_dir: Path) -> None:
    """A run is starting: the config is resolved and the run directory exists."""


@hookspec
def telescope_step_end(step: int, metrics: dict[str, Any]) -> None:
    """A training step ended; ``metrics`` holds the step's trainer and orchestrator metrics."""


@hookspec
def telescope_run_end(run_dir: Path, status: str, error: BaseException | None) -> None:
    """A run ended. ``status`` is ``"completed"``, ``"interrupted"`` or ``"failed"``."""
