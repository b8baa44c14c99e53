"""Attaching to a Ray cluster, or starting a private one, for a run.

:func:`connect_ray` attaches to a cluster or
starts a private one (the laptop and CI case); the ``ray_*`` options map onto
``ray.init`` and the runtime environment:

- ``ray_address: auto`` (the default) attaches to ``RAY_ADDRESS`` or to the cluster
  that ``ray start`` registered on this machine; a cluster that another run started
  for itself is not attached to. When there is none (or it does not answer) and
  ``ray_auto_start_local`` is set, the run starts its own local cluster with
  ``ray.init(address="local")``: private to the run (other runs on the machine
  start their own) and shut down when the run ends;
- ``ray_address: local`` always starts a private cluster; ``host:port`` (or
  ``ray://...``) attaches to that cluster, as ``auto`` does, falling back to a
  private one only with ``ray_auto_start_local``.

The run's workers get the runtime environment of :func:`runtime_env`. A private
cluster whose runtime environment is only variables (the default) gets them
another way: they are set in this process's environment while ``ray.init`` starts
the cluster, so every process it starts inherits them (Ray's own processes too,
the glibc settings of ``ray_worker_keep_freed_memory`` included), and the workers
run in the empty runtime environment, which Ray starts without its
``setup_worker.py`` step (:func:`inheritable_variables`).

:func:`reserve_workers` then reserves a placement group for one role's workers (a
bundle each, from :func:`worker_bundle`).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from telescope.schema.config import TelescopeConfig

log = logging.getLogger("telescope.run.workers")


class RayStartError(RuntimeError):
    """Ray could not start or place the workers; the message says what to change."""


#: glibc malloc settings that keep freed memory in the worker (``ray_worker_keep_freed_memory``).
#: By default glibc serves blocks of 128 KiB and more (a threshold that adapts up to 32 MiB)
#: with ``mmap`` and unmaps them on free, and trims the top of its heap when 128 KiB or more is
#: free there, so a training or decoding step's activations go back to the OS at the end of one
#: step and fault in again, page by page, in the next (zero-filled by the kernel; on a virtual
#: machine backed by the host again too). With blocks up to 1 GiB served from the heap and no
#: trimming below 1 TiB, freed memory is reused. The cost: a worker's resident memory stays at
#: its peak. Measured (``tiny:small`` loop, 2-core CPU VM): the first train step 1.05-1.11 s
#: without, 0.79-0.85 s with these settings; with the trainer's prewarm as well, 0.35-0.38 s
#: (see :mod:`telescope.trainer.prewarm`); later that day, with first touches cheaper on that
#: machine, no difference beyond the spread. Only glibc reads them; other C libraries ignore them.
#: In a private cluster they reach the workers through the environment the cluster starts in
#: (:func:`inheritable_variables`), so Ray's own processes (GCS, raylet, agents) keep their
#: freed memory too.
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}

#: Ray settings of a private cluster (``_system_config``, which only the process that starts
#: a cluster may pass). ``prestart_worker_first_driver`` off: by default the raylet starts one
#: idle Python worker per CPU as soon as the first driver connects, for Ray's *default*
#: runtime environment. A run's workers carry the run's runtime environment (see
#: :func:`runtime_env`), so Ray starts fresh processes for them and the prestarted ones only
#: import Ray (about 0.7 s of CPU each), on the cores the run's start-up is waiting for.
#: Measured on 2 cores: Ray's processes used 7.2 s of CPU in their first seconds with the
#: prestart, 5.7 s without, and ``ray.init`` itself returned 1-2 s sooner in a run. Since the
#: workers of a private cluster run in the empty runtime environment
#: (:func:`inheritable_variables`) they could take prestarted workers, but the first step
#: of the quick start's run did not end sooner with the prestart (four alternating pairs,
#: 2026-11-27), so it stays off.
PRIVATE_CLUSTER_SYSTEM_CONFIG: dict[str, Any] = {"prestart_worker_first_driver": False}


def runtime_env(config: TelescopeConfig, run_dir: Path) -> dict[str, Any]:
    """The runtime environment of the run's Ray workers: the user's, plus what the ``ray_*`` options add."""
    env: dict[str, Any] = dict(config.ray_runtime_env or {})
    env_vars: dict[str, str] = dict(env.get("env_vars", {}))
    if config.ray_propagate_active_venv and os.environ.get("VIRTUAL_ENV"):
        env_vars.setdefault("VIRTUAL_ENV", os.environ["VIRTUAL_ENV"])
        env_vars.setdefault("PATH", os.environ.get("PATH", ""))
    for name in ("RAY_AUTH_MODE", "WANDB_MODE", "HF_HUB_OFFLINE", "TELESCOPE_CACHE", "TOKENIZERS_PARALLELISM"):
        if name in os.environ:
            env_vars.setdefault(name, os.environ[name])
    if config.ray_worker_keep_freed_memory:
        for name, value in KEEP_FREED_MEMORY.items():
            env_vars.setdefault(name, os.environ.get(name, value))
    if env_vars:
        env["env_vars"] = env_vars
    if config.ray_pin_py_executable:
        env.setdefault("py_executable", sys.executable)
    return env


def registered_cluster() -> str | None:
    """``RAY_ADDRESS``, else the address ``ray start`` registered on this machine if it answers, else None.

    Unlike Ray's own ``auto``, a cluster found only by its running processes (one
    that another run started with ``ray.init``) is not returned: it is that run's.
    """
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return env
    try:
        from ray._private.services import find_bootstrap_address

        address = find_bootstrap_address(None)
    except Exception:
        return None
    if not address:
        return None
    host, _, port = str(address).rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return str(address)
    except (OSError, ValueError):
        log.info("the Ray cluster registered at %s does not answer; not attaching to it", address)
        return None


def connect_ray(config: TelescopeConfig, run_dir: Path) -> bool:
    """Attach to or start Ray (see the module docstring); returns True when this call started a private cluster."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if config.ray_disable_runtime_env_hook:
        os.environ.pop("RAY_RUNTIME_ENV_HOOK", None)
    common: dict[str, Any] = {
        "namespace": config.ray_namespace,
        "log_to_driver": config.ray_log_to_driver,
        "runtime_env": runtime_env(config, run_dir),
        "configure_logging": True,
        "logging_level": "WARNING",
    }
    if ray.is_initialized():
        return False
    if config.ray_address in ("", "local"):
        address = None
    elif config.ray_address == "auto":
        address = registered_cluster()
        if address is None and not config.ray_auto_start_local:
            raise RayStartError(
                "no Ray cluster to attach to (ray_address: auto found neither RAY_ADDRESS nor a cluster "
                "started with `ray start`); start one (`ray start --head`) or set ray_auto_start_local: true"
            )
    else:
        address = config.ray_address
    if address is not None:
        try:
            ray.init(address=address, **common)
            return False
        except ConnectionError as exc:
            if not config.ray_auto_start_local:
                raise RayStartError(
                    f"no Ray cluster at ray_address={config.ray_address!r} ({exc}); start one "
                    "(`ray start --head`) or set ray_auto_start_local: true"
                ) from None
    # private: not attached to by other runs
    inherited = inheritable_variables(common["runtime_env"])
    if inherited is not None:  # the raylet starts with them, and its workers inherit them: no runtime environment
        common["runtime_env"] = None
    with exported(inherited or {}):
        start_private_cluster(common)
    return True


#: Ray 2.60 waits a fixed 30 s (``raylet_start_wait_time_s`` in ``ray/_private/node.py``, no
#: setting) for a new node's raylet to register with the GCS. On an overloaded machine that is
#: not always enough (two runs failed so at a load average of 46 on two cores), and the run
#: would fail before it started. A start that fails this way is tried again; other errors are not.
PRIVATE_START_ATTEMPTS = 3

#: The text of Ray's exception when the node did not register in time.
NODE_START_TIMEOUT = "timed out during startup"


def start_private_cluster(common: dict[str, Any]) -> None:
    """``ray.init(address="local")``, tried again (up to :data:`PRIVATE_START_ATTEMPTS`) when Ray's node
    did not register in time; the processes a failed attempt started (GCS, raylet, agents) are stopped
    first, since Ray leaves them running. Raises :class:`RayStartError` when every attempt timed out."""
    for attempt in range(1, PRIVATE_START_ATTEMPTS + 1):
        before = {child.pid for child in _children()}
        try:
            ray.init(address="local", include_dashboard=False, _system_config=PRIVATE_CLUSTER_SYSTEM_CONFIG, **common)
            return
        except Exception as exc:
            if NODE_START_TIMEOUT not in str(exc):
                raise
            stopped = _stop_new_children(before)
            if attempt == PRIVATE_START_ATTEMPTS:
                raise RayStartError(
                    f"Ray's private cluster did not start: its node did not register with Ray's GCS within Ray's "
                    f"30 s, {attempt} times (load average {_load_average()}); the machine may be overloaded: run "
                    "again when it is less busy, or start a cluster once (`ray start --head`) and attach to it "
                    "(ray_address: auto)"
                ) from None
            log.warning(
                "Ray's node did not register in time (attempt %d of %d, load average %s); stopped its %d "
                "processes, starting it again",
                attempt,
                PRIVATE_START_ATTEMPTS,
                _load_average(),
                stopped,
            )


def _children() -> list[Any]:
    import psutil

    return list(psutil.Process().children(recursive=True))


def _stop_new_children(before: set[int]) -> int:
    """Terminate (then kill) this process's descendants that are not in ``before``; returns how many."""
    import psutil

    ray.shutdown()
    new = [child for child in _children() if child.pid not in before]
    for child in new:
        try:
            child.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(new, timeout=5)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            continue
    return len(new)


def _load_average() -> str:
    try:
        return " ".join(f"{value:.1f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def inheritable_variables(env: dict[str, Any]) -> dict[str, str] | None:
    """``env``'s variables when a private cluster's workers can inherit all it asks for, else None.

    Ray starts every worker of a non-empty runtime environment through its
    ``setup_worker.py``, which imports Ray's runtime-environment modules (0.8-0.9 s of
    CPU on a 2-core machine) before it execs the worker; a worker of the empty one is
    exec'd directly. A private cluster's processes are this process's children and
    inherit its environment, and its workers run this interpreter, so a runtime
    environment of variables and this ``py_executable`` only is given as variables.
    """
    rest = {key: value for key, value in env.items() if key != "env_vars"}
    if rest.get("py_executable") == sys.executable:
        del rest["py_executable"]
    if rest:
        return None
    return {str(name): str(value) for name, value in env.get("env_vars", {}).items()}


@contextmanager
def exported(variables: dict[str, str]) -> Iterator[None]:
    """``variables`` set in this process's environment for the block, then as they were."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def gcs_reachable(timeout_s: float = 1.0) -> bool:
    """Whether the Ray cluster's GCS accepts connections (False when it died, say with the run's process group)."""
    import socket

    try:
        host, port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except Exception:
        return False


__all__ = [
    "KEEP_FREED_MEMORY",
    "PRIVATE_CLUSTER_SYSTEM_CONFIG",
    "RayStartError",
    "connect_ray",
    "gcs_reachable",
    "registered_cluster",
    "runtime_env",
]


def worker_bundle(cpus: float, gpus: float, resources: dict[str, float] | None = None) -> dict[str, float]:
    """One worker's placement-group bundle: its CPUs, GPUs (when any) and custom resources."""
    bundle: dict[str, float] = {"CPU": cpus}
    if gpus:
        bundle["GPU"] = gpus
    bundle.update({name: float(amount) for name, amount in (resources or {}).items()})  # custom (the schema checks)
    return bundle


def reserve_workers(
    role: str, group_name: str, workers: int, bundle: dict[str, float], strategy: str, timeout_s: int
) -> PlacementGroup:
    """A placement group of ``workers`` bundles, ready within ``timeout_s``; else a RayStartError saying what to do."""
    group = placement_group([dict(bundle) for _ in range(workers)], strategy=strategy, name=group_name)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        available = ray.available_resources()
        custom = [k for k in bundle if k not in ("CPU", "GPU")]
        raise RayStartError(
            f"could not place {workers} {role} workers with {bundle} each ({strategy}) within {timeout_s} s; "
            f"the cluster has {available.get('CPU', 0):g} CPUs and {available.get('GPU', 0):g} GPUs free"
            + (f", and {', '.join(f'{k}: {available.get(k, 0):g}' for k in custom)}" if custom else "")
            + f". Lower ray_{role}_cpus_per_worker or the number of workers, "
            + (f"check ray_{role}_resources_per_worker, " if custom else "")
            + "or add nodes."
        ) from None
    return group
