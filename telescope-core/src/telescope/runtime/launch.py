"""``telescope run``: from a validated config to a finished (or cleanly stopped) run.

Order: run directory and store (resolved config, status, ``metadata.json`` and the
code snapshot, timeline events to the store, sandbox events to ``logs/sandboxes.log``)
-> loggers (each also subscribed to the timeline events) -> lifecycle hook
``telescope_run_start`` -> Ray (attach or start; the tokenizer, with transformers and
torch, loads on a thread beside it) -> workers and the infrastructure
monitor (:mod:`telescope.runtime.monitoring`) -> the training loop, which a fresh
run starts as soon as the servers answer, the trainer ranks still setting up (see
the orchestrator's start-up) -> evals -> shutdown. The start-up is on the run's
timeline: ``run.ray_start`` (attaching to or starting Ray), ``run.servers_start``
(placing every worker until the servers answer), ``run.workers_start`` (from the same
start until every trainer rank is set up and the weight transport connected) and one
``worker.startup`` per server and trainer rank (its process's start to its
readiness). Whatever happens, the status
file says how the run ended, ``telescope_run_end`` is called, loggers are closed,
every actor and server is stopped, and a local Ray cluster this run started is shut
down. Exit codes: 0 completed, 1 failed (the message and the path of the full
traceback are printed), 2 a user error found at start (bad kwargs, missing
checkpoint, workers that cannot be placed), 130 interrupted (Ctrl-C or SIGTERM).

SIGTERM, as schedulers send it, often goes to the whole process group, and Ray's own
processes (GCS, raylet, the actors' workers) are in it: they die with the run. So on
SIGTERM the run writes ``status: interrupted`` at once, stops its inference server
processes (in sessions of their own, they got no signal) and skips the Ray cleanup
when the GCS no longer accepts connections (else gives it :data:`TERMINATION_CLEANUP_S`)
instead of waiting for a GCS that is gone; when Ray no longer answers, the process
exits right after its own cleanup (``os._exit``), before Ray's core worker would kill
it a minute later. A second
SIGTERM during that cleanup is ignored. While ``ray.init`` runs, Ray's own handler is
installed (it calls ``sys.exit(15)``): that exit is an interruption by SIGTERM too. A
signal's exception can land in the middle of an import in the main thread, leaving
Python's import lock held, and the start-up's tokenizer thread, waiting on that lock,
never finishes; so an interrupted run waits for that thread's imports at most
:data:`TERMINATION_CLEANUP_S`. When the trainer group is lost
(:class:`~telescope.orchestrator.orchestrator.TrainerLost`), the error names the
command that resumes from the last checkpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shlex
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from telescope.config.loader import LoadedConfig
from telescope.config.render import render_resolved
from telescope.schema.config import TelescopeConfig
from telescope.system import event_loop
from telescope.system.garbage_collection import freeze_startup_objects, thaw_startup_objects

if TYPE_CHECKING:
    from telescope.plugins.facade import Plugins

log = logging.getLogger("telescope.run")


#: ``extra`` of a log record for the run's log files only: the terminal gets a one-line error instead.
FILES_ONLY = {"console": False}

#: Seconds the Ray cleanup gets after SIGTERM (Ray's processes may be dying too).
TERMINATION_CLEANUP_S = 10.0


class _Terminated(Exception):
    """SIGTERM, turned into an exception so cleanup runs as for Ctrl-C."""


def _resume_command(run_dir: Path, checkpoint: Path | None) -> str:
    """The command line that resumes this run from its last checkpoint (or, with none, starts it again)."""
    argv = sys.argv[1:]
    args = argv[argv.index("run") + 1 :] if "run" in argv else argv
    kept: list[str] = []
    skip = False
    for arg in args:  # drop an earlier --resume_from_checkpoint and its value
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0].replace("-", "_")
        if name == "__resume_from_checkpoint":
            skip = "=" not in arg
            continue
        kept.append(arg)
    if not any(a.split("=", 1)[0].replace("-", "_") == "__run_dir" for a in kept):
        kept += ["--run_dir", str(run_dir)]
    if checkpoint is not None:
        kept += ["--resume_from_checkpoint", "true"]
    return shlex.join(["telescope", "run", *kept])


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


def _prepare_model(config: TelescopeConfig) -> TelescopeConfig:
    """Check the model can be had here, and resolve ``tiny:`` models (built on first use), before Ray starts.

    Returns the config with the resolved model path (configs are frozen).
    """
    from telescope.config.checks import model_problems
    from telescope.models.tiny import resolve_model_path

    problems = model_problems(config.model, hub_cache=True)
    if problems:
        raise FileNotFoundError("; ".join(problems))
    return config.model_copy(update={"model": resolve_model_path(config.model)})


@dataclasses.dataclass
class _EarlyTokenizer:
    """The run's tokenizer, loading on a daemon thread while Ray starts (:func:`_load_tokenizer_early`)."""

    #: set once transformers and torch are imported (or their import failed)
    imported: threading.Event
    tokenizer: Future[Any]

    def wait_until_imported(self, timeout_s: float = 120.0) -> None:
        """Until the thread's imports are done: transformers' lazy module must not be imported from two threads."""
        self.imported.wait(timeout_s)


def _load_tokenizer_early(model: str) -> _EarlyTokenizer:
    """Start loading the run's tokenizer on a daemon thread; it also imports torch.

    The orchestrator needs both, and their imports (transformers, torch: 3-4 s of CPU on
    a 2-core machine) used to run after ``ray.init``, ahead of the workers' placement,
    so every worker started that much later. ``ray.init`` mostly waits for Ray's own
    processes, so the thread runs beside it. transformers imports its submodules lazily
    and not safely from two threads at once (a concurrent ``from transformers import``
    can fail with an ImportError), so code that may import it waits for
    :meth:`_EarlyTokenizer.wait_until_imported` first, and :func:`launch_run` does not
    return before the imports are done. A daemon thread, not an executor (which is joined
    at exit): a run that fails early does not wait for the tokenizer itself.
    """
    loading = _EarlyTokenizer(threading.Event(), Future())

    def load() -> None:
        try:
            try:
                import torch  # noqa: F401  (the workers' start needs it: the algorithm, the checkpoint settings)
                from transformers import AutoTokenizer
            finally:
                loading.imported.set()
            loading.tokenizer.set_result(AutoTokenizer.from_pretrained(model))
        except BaseException as exc:  # raised where the tokenizer is awaited
            loading.tokenizer.set_exception(exc)

    threading.Thread(target=load, name="telescope-tokenizer", daemon=True).start()
    return loading


async def _train(
    config: TelescopeConfig,
    run_dir: Path,
    store: Any,
    loggers: list[Any],
    plugins: Plugins,
    terminated: threading.Event,
    tokenizer_loading: _EarlyTokenizer,
) -> dict[str, Any]:
    from telescope.api import events
    from telescope.orchestrator.assembly import build_orchestrator
    from telescope.recording.progress import StepProgress
    from telescope.runtime.ray_services import RayServices

    loop = asyncio.get_running_loop()
    main = asyncio.current_task()

    def on_sigterm() -> None:  # in the loop: the run stops at its next await
        if terminated.is_set():
            return
        terminated.set()
        log.warning("SIGTERM: stopping the run")
        store.set_status("interrupted", error="terminated by SIGTERM")
        if main is not None:
            main.cancel()

    fatal: list[BaseException] = []

    def on_fatal(error: BaseException) -> None:  # a server that cannot be kept running ends the run
        if not fatal:
            fatal.append(error)
            if main is not None:
                main.cancel()

    previous = signal.getsignal(signal.SIGTERM)
    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    services = RayServices(config, run_dir)
    progress = StepProgress(config.number_of_steps)
    monitor = None

    try:
        await asyncio.to_thread(tokenizer_loading.wait_until_imported)  # the workers' start imports plugins
        workers_started = time.time()
        with events.timed("run.servers_start", component="orchestrator"):  # every worker placed, servers up
            await asyncio.to_thread(services.start)
        # the ranks' set-up goes on; then the weight transport, and dead servers restarted
        # (inference_health_check_interval_s); the orchestrator awaits it (wait_ready)
        services.start_trainers(on_fatal, started=workers_started)
        monitor = services.infra_monitor().start()  # system, torch memory, inference metrics -> the run store
        tokenizer = await asyncio.wrap_future(tokenizer_loading.tokenizer)
        run = build_orchestrator(
            config,
            services.generation,
            services,
            plugins=plugins,
            tokenizer=tokenizer,
            store=store,
            loggers=loggers,
            progress=progress,
        )
        freeze_startup_objects("orchestrator")  # Ray, transformers, the datasets: out of every later collection
        try:
            await run.run()
        finally:
            run.prompts.close()
            thaw_startup_objects()  # a caller in this process (a test, a notebook) gets its collector back
        return run.summary()
    except asyncio.CancelledError:
        if terminated.is_set():
            raise _Terminated() from None
        if fatal:
            raise fatal[0] from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, previous)
        progress.close()
        if monitor is not None:
            await monitor.stop(flush=not terminated.is_set())  # a last drain would wait on Ray
        if terminated.is_set():  # Ray's processes may be gone: stop what is ours, do not wait on Ray
            await services.close(budget_s=TERMINATION_CLEANUP_S)
        else:
            await services.close()


def launch_run(loaded: LoadedConfig) -> int:
    """Run training for a validated config; returns the process exit code."""
    import ray

    from telescope.api import events
    from telescope.orchestrator.orchestrator import TrainerLost
    from telescope.orchestrator.run_checkpoints import RunCheckpointError
    from telescope.plugins.facade import get_plugins
    from telescope.plugins.registry import PluginError
    from telescope.recording.run_logs import SandboxLog
    from telescope.recording.run_store import RunStatus, RunStore, resolve_run_dir_from_config
    from telescope.runtime.ray_cluster import RayStartError, connect_ray, gcs_reachable
    from telescope.runtime.worker_shutdown import bounded

    run_dir = resolve_run_dir_from_config(loaded.config)  # resuming continues in the same directory
    config = loaded.config.model_copy(update={"run_dir": str(run_dir)})
    store = RunStore.from_config(run_dir, config)
    store.write_config(render_resolved(loaded.config, loaded.provenance), config.model_dump(mode="json"))
    store.set_status("running", pid=os.getpid(), step=0, error=None, stuck=None)  # a resume clears the last end
    release_logs = _setup_file_logging(run_dir, config.debug)
    unsubscribe = store.capture_events()
    sandbox_log = SandboxLog(store.log_path("sandboxes"))
    unsubscribers = [unsubscribe, events.subscribe(sandbox_log)]
    plugins = get_plugins()
    _record_metadata(run_dir, config, plugins)
    loggers = plugins.create_loggers(config, run_dir)
    unsubscribers += [events.subscribe(logger.log_event) for logger in loggers]
    previous_sigterm = signal.getsignal(signal.SIGTERM)
    terminated = threading.Event()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if terminated.is_set():
            return  # already stopping: let the cleanup finish
        terminated.set()
        raise _Terminated()

    status: RunStatus = "completed"
    code = 0
    error: BaseException | None = None
    started_ray = started_run = False
    tokenizer_loading: _EarlyTokenizer | None = None
    print(f"telescope: run directory {run_dir}", file=sys.stderr)
    try:
        config = _prepare_model(config)
        plugins.run_start(config, run_dir)
        started_run = True
        tokenizer_loading = _load_tokenizer_early(config.model)  # beside ray.init
        with events.timed("run.ray_start", component="orchestrator"):  # the start-up's phases: see _train
            started_ray = connect_ray(config, run_dir)
        signal.signal(signal.SIGTERM, on_sigterm)  # after ray.init, which installs its own handler
        summary = event_loop.run(_train(config, run_dir, store, loggers, plugins, terminated, tokenizer_loading))
        log.info("run completed: %s", summary)
    except SystemExit as exc:  # Ray's handler while ray.init runs: sys.exit(SIGTERM); anything else is a failure
        by_sigterm = exc.code == signal.SIGTERM
        status, code = ("interrupted", 130) if by_sigterm else ("failed", exc.code if isinstance(exc.code, int) else 1)
        error = _Terminated("terminated by SIGTERM") if by_sigterm else exc
        if by_sigterm:
            print("telescope: interrupted; workers stopped, the run directory is intact", file=sys.stderr)
    except (KeyboardInterrupt, _Terminated) as exc:
        status, code = "interrupted", 130
        # status.json's error says which signal stopped the run (a bare KeyboardInterrupt says nothing)
        error = (
            _Terminated("terminated by SIGTERM")
            if isinstance(exc, _Terminated)
            else KeyboardInterrupt("interrupted by SIGINT (Ctrl-C)")
        )
        print("telescope: interrupted; workers stopped, the run directory is intact", file=sys.stderr)
    except TrainerLost as exc:
        status, code, error = "failed", 1, exc
        log.error("run failed:\n%s", traceback.format_exc(), extra=FILES_ONLY)
        what = "resume from its last checkpoint" if exc.checkpoint is not None else "start the run again"
        print(f"error: the run failed: {exc}\nTo {what}: {_resume_command(run_dir, exc.checkpoint)}", file=sys.stderr)
    except (RunCheckpointError, RayStartError, PluginError, ValueError, FileNotFoundError) as exc:
        status, code, error = "failed", 2, exc
        print(f"error: {exc}", file=sys.stderr)
        log.error("run failed:\n%s", traceback.format_exc(), extra=FILES_ONLY)
    except Exception as exc:
        status, code, error = "failed", 1, exc
        log.error("run failed:\n%s", traceback.format_exc(), extra=FILES_ONLY)
        if config.debug:  # debug: true puts the traceback on the terminal too
            traceback.print_exc(file=sys.stderr)
        print(
            f"error: the run failed: {type(exc).__name__}: {exc}\n"
            f"(full traceback in {run_dir / 'logs' / 'orchestrator.log'})",
            file=sys.stderr,
        )
    finally:
        if tokenizer_loading is not None:  # a run that ended early: the hooks below may import transformers
            tokenizer_loading.wait_until_imported(TERMINATION_CLEANUP_S if status == "interrupted" else 120.0)
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
            if not terminated.is_set():
                ray.shutdown()
            elif not (gcs_reachable() and bounded(TERMINATION_CLEANUP_S, ray.shutdown)):
                # Ray's GCS died with the process group: nothing is left to disconnect from, and Ray's
                # exit hooks would block until its core worker kills the process. Everything is written.
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
    return code
