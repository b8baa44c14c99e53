"""``telescope run``: from a validated config to a finished (or cleanly stopped) run.

Order: run directory and store (resolved config, status, ``metadata.json`` and the
code snapshot, timeline events to the store, sandbox events to ``logs/sandboxes.log``)
-> loggers (each also subscribed to the timeline events) -> lifecycle hook
``telescope_run_start`` -> Ray (attach or start) -> workers and the infrastructure
monitor (:mod:`telescope.runtime.monitoring`) -> initial weights -> the training
loop -> evals -> shutdown. Whatever happens, the status
file says how the run ended, ``telescope_run_end`` is called, loggers are closed,
every actor and server is stopped, and a local Ray cluster this run started is shut
down. Exit codes: 0 completed, 1 failed (the message and the path of the full
traceback are printed), 2 a user error found at start (bad kwargs, missing
checkpoint, workers that cannot be placed), 130 interrupted (Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from telescope.config.loader import LoadedConfig
from telescope.config.render import render_resolved
from telescope.config.schema import TelescopeConfig

if TYPE_CHECKING:
    from telescope.plugins.facade import Plugins

log = logging.getLogger("telescope.run")


class _Terminated(Exception):
    """SIGTERM, turned into an exception so cleanup runs as for Ctrl-C."""


def _setup_file_logging(run_dir: Path, debug: bool) -> Callable[[], None]:
    """The orchestrator's logs (``logs/orchestrator.log``, ``detailed/``, ``stdout/``);
    the main log is at DEBUG with ``debug: true`` (or ``telescope --debug``).
    Returns the function that undoes it."""
    from telescope.recording.run_logs import capture_process_logs

    verbose = debug or bool(os.environ.get("TELESCOPE_DEBUG"))
    return capture_process_logs(run_dir, "orchestrator", main_level=logging.DEBUG if verbose else logging.INFO)


def _record_metadata(run_dir: Path, config: TelescopeConfig, plugins: Plugins) -> None:
    """``metadata.json`` and ``code/`` (a failure is a warning: the run goes on without them)."""
    from telescope.recording.run_metadata import write_run_metadata

    try:
        write_run_metadata(run_dir, config, plugins)
    except Exception as exc:
        log.warning("could not write the run metadata: %s: %s", type(exc).__name__, exc)


def _prepare_model(config: TelescopeConfig) -> None:
    """Check the model can be had here, and resolve ``tiny:`` models (built on first use), before Ray starts."""
    from telescope.config.checks import model_problems
    from telescope.models.tiny import resolve_model_path

    problems = model_problems(config.model, hub_cache=True)
    if problems:
        raise FileNotFoundError("; ".join(problems))
    config.model = resolve_model_path(config.model)


async def _train(
    config: TelescopeConfig, run_dir: Path, store: Any, loggers: list[Any], plugins: Plugins
) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from telescope.orchestrator.assembly import build_orchestrator
    from telescope.recording.progress import StepProgress
    from telescope.runtime.ray_services import RayServices

    services = RayServices(config, run_dir)
    progress = StepProgress(config.number_of_steps)
    monitor = None
    try:
        await asyncio.to_thread(services.start)
        monitor = services.infra_monitor().start()  # system, torch memory, inference metrics -> the run store
        await services.connect_weights()
        tokenizer = AutoTokenizer.from_pretrained(config.model)
        run = build_orchestrator(
            config, services.generation, services, plugins=plugins, tokenizer=tokenizer, store=store,
            loggers=loggers, progress=progress,
        )  # fmt: skip
        try:
            await run.run()
        finally:
            run.prompts.close()
        return run.summary()
    finally:
        progress.close()
        if monitor is not None:
            await monitor.stop()
        await services.close()


def launch_run(loaded: LoadedConfig) -> int:
    """Run training for a validated config; returns the process exit code."""
    import ray

    from telescope.orchestrator.run_checkpoints import RunCheckpointError
    from telescope.plugins.facade import get_plugins
    from telescope.plugins.registry import PluginError
    from telescope.recording import events
    from telescope.recording.run_logs import SandboxLog
    from telescope.recording.run_store import RunStatus, RunStore, resolve_run_dir_from_config
    from telescope.runtime.ray_services import RayStartError, connect_ray

    config = loaded.config.model_copy(deep=True)
    run_dir = resolve_run_dir_from_config(config)  # resuming continues in the same directory
    config.run_dir = str(run_dir)
    store = RunStore.from_config(run_dir, config)
    store.write_config(render_resolved(loaded.config, loaded.provenance), config.model_dump(mode="json"))
    store.set_status("running", pid=os.getpid(), step=0)
    release_logs = _setup_file_logging(run_dir, config.debug)
    unsubscribe = store.capture_events()
    sandbox_log = SandboxLog(store.log_path("sandboxes"))
    unsubscribers = [unsubscribe, events.subscribe(sandbox_log)]
    plugins = get_plugins()
    _record_metadata(run_dir, config, plugins)
    loggers = plugins.create_loggers(config, run_dir)
    unsubscribers += [events.subscribe(logger.log_event) for logger in loggers]
    previous_sigterm = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise _Terminated()

    status: RunStatus = "completed"
    code = 0
    error: BaseException | None = None
    started_ray = started_run = False
    print(f"telescope: run directory {run_dir}", file=sys.stderr)
    try:
        _prepare_model(config)
        plugins.run_start(config, run_dir)
        started_run = True
        started_ray = connect_ray(config, run_dir)
        signal.signal(signal.SIGTERM, on_sigterm)  # after ray.init, which installs its own handler
        summary = asyncio.run(_train(config, run_dir, store, loggers, plugins))
        log.info("run completed: %s", summary)
    except (KeyboardInterrupt, _Terminated) as exc:
        status, code, error = "interrupted", 130, exc
        print("telescope: interrupted; workers stopped, the run directory is intact", file=sys.stderr)
    except (RunCheckpointError, RayStartError, PluginError, ValueError, FileNotFoundError) as exc:
        status, code, error = "failed", 2, exc
        print(f"error: {exc}", file=sys.stderr)
        log.error("run failed:\n%s", traceback.format_exc())
    except Exception as exc:
        status, code, error = "failed", 1, exc
        log.error("run failed:\n%s", traceback.format_exc())
        if config.debug:  # debug: true puts the traceback on the terminal too
            traceback.print_exc(file=sys.stderr)
        print(
            f"error: the run failed: {type(exc).__name__}: {exc}\n"
            f"(full traceback in {run_dir / 'logs' / 'orchestrator.log'})",
            file=sys.stderr,
        )
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
        store.set_status(status, error=str(error) if error else None)
        if started_run:  # observers see run_end only for a run they saw start
            plugins.run_end(run_dir, status, error)
        for stop in unsubscribers:  # no more events: the loggers flush what they hold as they close
            stop()
        for logger in loggers:
            try:
                logger.close()
            except Exception as exc:
                print(f"warning: logger {getattr(logger, 'name', logger)} failed to close: {exc}", file=sys.stderr)
        sandbox_log.close()
        store.close()
        release_logs()
        if ray.is_initialized() and (started_ray or config.ray_shutdown_on_exit):
            ray.shutdown()
    return code
