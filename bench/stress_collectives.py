"""Run the trainer's multi-rank collective paths many times under glibc's heap checks.

Each run is a fresh interpreter (so a fresh fork server, as a test session gets)
that forks two gloo CPU ranks with :func:`telescope.testing.trainer.spawn_ranks` and
drives one of these paths:

- ``cp``: the ``fsdp`` backend at ``fsdp_context_parallel_size`` 2: the reference
  log-probability forward, then ``train_step`` without and with gradient
  checkpointing, on packed rows that need the ``2 x CP`` padding (what
  ``tests/core/trainer/test_context_parallel.py`` runs): FSDP2's all-gathers and
  reduce-scatters, the autograd all-gather of keys and values and its
  reduce-scatter, the logits' gather, the metric all-reduces;
- ``megatron-cp``: the ``megatron`` backend at ``megatron_context_parallel_size`` 2;
- ``megatron-tp``: the ``megatron`` backend at tensor parallel 2 with sequence
  parallelism and recomputation (megatron-core's asynchronous all-gather into its
  global scratch buffer, which :mod:`telescope_megatron.cpu_patches` places on the CPU);
- ``uneven``: :mod:`telescope_megatron.cpu_patches`' uneven all-gather and
  reduce-scatter over gloo, ``--iterations`` times with random split sizes,
  each result checked against the one computed locally;
- ``groups``: the process groups' life cycle, ``--iterations / 10`` times: a gloo
  group, two context-parallel device meshes (as two backends build them), the
  autograd all-gather of keys and its reduce-scatter, the logits' gather and a
  metric all-reduce on each, then the barrier and ``destroy_process_group``
  (the teardown the test ranks run, where gloo closes its connections while the
  other rank may still be sending).

``--checks glibc`` (the default) runs every rank with glibc's debugging allocator
(``libc_malloc_debug``, preloaded: glibc 2.34 and later read ``MALLOC_CHECK_``
only there), ``MALLOC_CHECK_=3`` (a corrupted chunk aborts the process) and
``MALLOC_PERTURB_`` (freed and new memory filled with a byte, so a read of freed
memory gives garbage rather than the old value). ``--keep-freed-memory`` adds the glibc
settings a run gives its Ray workers (blocks up to 1 GiB from the heap, no trimming), so
that a tensor's buffer sits in the heap beside small chunks, as in a worker. ``--load N`` keeps N busy
processes running meanwhile (the second pytest-xdist worker of the test suite).
A run fails when its process exits non-zero, a rank dies by a signal, or glibc
prints a heap diagnostic; the script prints one line per run and a summary, and
exits 1 when any run failed.

Run by hand: ``python bench/stress_collectives.py --runs 20 --paths cp,uneven``.
Each ``cp`` or megatron run takes 20-60 s of two idle cores; ``uneven`` and ``groups`` less.
"""

from __future__ import annotations

import argparse
import ctypes.util
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PATHS = ("cp", "megatron-cp", "megatron-tp", "uneven", "groups")

#: What glibc prints when it detects a corrupted heap (malloc.c's malloc_printerr messages and MALLOC_CHECK_'s).
HEAP_DIAGNOSTIC = re.compile(
    r"malloc\(\)|malloc_consolidate|free\(\)|realloc\(\)|double free|corrupted (size|double-linked)|fastbin|tcache"
)


def glibc_check_environment(perturb: int) -> dict[str, str]:
    """The environment that turns on glibc's heap checks in every process started from it."""
    library = ctypes.util.find_library("c_malloc_debug")
    if library is None:
        raise SystemExit("error: glibc's libc_malloc_debug was not found (glibc 2.34+); run with --checks none")
    preload = " ".join(filter(None, [os.environ.get("LD_PRELOAD"), library]))
    return {"LD_PRELOAD": preload, "MALLOC_CHECK_": "3", "MALLOC_PERTURB_": str(perturb)}


# ------------------------------------------------------------------ the ranks (run in the forked processes)


def _backend(model: str, rank: int, world_size: int, **overrides: Any) -> Any:
    from telescope.plugins.facade import get_plugins
    from telescope.testing.trainer import tiny_trainer_config

    config = tiny_trainer_config(model, trainer_num_workers=world_size, **overrides)
    plugins = get_plugins()
    backend = plugins.create_trainer_backend(config, plugins.create_algorithm(config))
    backend.setup(rank, world_size, "cpu")
    return backend


def _cp_rank(rank: int, world_size: int, model: str) -> None:
    import torch

    from telescope.testing.trainer import synthetic_batch
    from telescope.trainer.distributed import destroy_process_group, init_process_group
    from telescope.trainer.metrics import SectionTimers

    init_process_group(rank, world_size, torch.device("cpu"))
    settings = {"seq_len": 64, "pad_to_multiple_of": 1, "max_model_len": 40, "max_tokens": 25}
    for checkpointing in (False, True):
        backend = _backend(
            model, rank, world_size, fsdp_context_parallel_size=2, gradient_checkpointing=checkpointing, **settings
        )
        try:
            batch = synthetic_batch(num_groups=4, completion_lengths=(5, 20))
            rows = backend._local_sequences(backend._pack(batch.samples))
            backend.reference_logprobs([rows], SectionTimers(backend.device))
            backend.train_step(batch)
        finally:
            backend.close()
    destroy_process_group()


def _megatron_rank(rank: int, world_size: int, model: str, overrides: dict[str, Any]) -> None:
    import torch

    from telescope.testing.trainer import synthetic_batch
    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, torch.device("cpu"))
    settings = {"seq_len": 24, "max_model_len": 24, "max_tokens": 16, "pad_to_multiple_of": 8}
    backend = _backend(model, rank, world_size, train_backend="megatron", **settings, **overrides)
    try:
        backend.train_step(synthetic_batch(completion_lengths=(12, 16), num_groups=2))
    finally:
        backend.close()
    destroy_process_group()


def _uneven_rank(rank: int, world_size: int, iterations: int) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core.tensor_parallel import mappings
    from telescope_megatron.cpu_patches import apply_cpu_patches

    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, torch.device("cpu"))
    apply_cpu_patches()
    group = dist.group.WORLD
    sizes_rng = random.Random(0)  # the same split sizes on every rank
    for _ in range(iterations):
        sizes = [sizes_rng.randint(0, 9) for _ in range(world_size)]
        width = sizes_rng.randint(1, 40)
        everyone = [torch.full((n, width), float(r + 1)) + torch.arange(n)[:, None] for r, n in enumerate(sizes)]
        gathered = mappings._gather_along_first_dim(everyone[rank], group, sizes)
        if not torch.equal(gathered, torch.cat(everyone)):
            raise AssertionError(f"uneven all-gather: wrong rows for sizes {sizes}")
        whole = torch.arange(sum(sizes) * width, dtype=torch.float32).view(-1, width) * (rank + 1)
        mine = mappings._reduce_scatter_along_first_dim(whole, group, sizes)
        expected = torch.split(whole / (rank + 1) * sum(range(1, world_size + 1)), sizes)[rank]
        if not torch.equal(mine, expected):
            raise AssertionError(f"uneven reduce-scatter: wrong rows for sizes {sizes}")
    destroy_process_group()


def _groups_rank(rank: int, world_size: int, folder: str, cycles: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from telescope.trainer.context_parallel import gather_rows, gather_sequence
    from telescope.trainer.distributed import all_reduce_sum

    for cycle in range(cycles):
        dist.init_process_group(
            "gloo", store=dist.FileStore(f"{folder}/store{cycle}", world_size), rank=rank, world_size=world_size
        )
        for _ in range(2):
            mesh = init_device_mesh("cpu", (world_size // 2, 2), mesh_dim_names=("dp", "cp"))
            keys = torch.randn(1, 2, 5 + cycle % 7, 8, requires_grad=True)
            gathered = gather_sequence(keys, mesh.get_group("cp"))
            rows = gather_rows(gathered.sum(1)[0][: keys.shape[2]], mesh.get_group("cp"))
            (gathered.square().sum() + rows.sum()).backward()
            all_reduce_sum([1.0, float(cycle)], torch.device("cpu"), mesh.get_group("dp"))
        dist.barrier()
        dist.destroy_process_group()


def run_child(path: str, model_dir: Path, iterations: int) -> None:
    """One run of ``path`` on two ranks (this process is the fresh interpreter of one run)."""
    from telescope.testing.trainer import spawn_ranks

    if path == "uneven":
        spawn_ranks(_uneven_rank, 2, iterations)
        return
    if path == "groups":
        with tempfile.TemporaryDirectory(dir=model_dir) as folder:
            spawn_ranks(_groups_rank, 2, folder, max(iterations // 10, 1))
        return
    from telescope.models.tiny import PRESETS, build_tiny_model

    model = model_dir / "tiny-test"
    if not (model / "config.json").exists():
        build_tiny_model(model, PRESETS["test"], replace=False)
    if path == "cp":
        spawn_ranks(_cp_rank, 2, str(model))
    elif path == "megatron-cp":
        spawn_ranks(_megatron_rank, 2, str(model), {"megatron_context_parallel_size": 2})
    elif path == "megatron-tp":
        spawn_ranks(
            _megatron_rank,
            2,
            str(model),
            {
                "megatron_tensor_parallel_size": 2,
                "megatron_sequence_parallel": True,
                "megatron_gradient_checkpointing": True,
            },
        )
    else:
        raise SystemExit(f"error: unknown path {path!r}; choose from {', '.join(PATHS)}")


# ------------------------------------------------------------------ the driver


def _busy() -> None:
    while True:
        pass


def run_once(path: str, scratch: str, env: dict[str, str], args: argparse.Namespace) -> tuple[float, str | None]:
    """One run of ``path`` in a fresh interpreter: its duration, and what went wrong (None: clean)."""
    command = [sys.executable, __file__, "--child", path, "--model-dir", scratch, "--iterations", str(args.iterations)]
    start = time.monotonic()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as expired:
        return time.monotonic() - start, f"timed out after {expired.timeout:.0f} s"
    elapsed = time.monotonic() - start
    output = done.stdout + done.stderr
    diagnostics = [line.strip() for line in output.splitlines() if HEAP_DIAGNOSTIC.search(line)]
    if done.returncode == 0 and not diagnostics:
        return elapsed, None
    died = re.findall(r"terminated with (?:signal|exit code) \S+", output)
    last = output.strip().splitlines()[-1:] or ["no output"]
    print("    " + "\n    ".join(output.strip().splitlines()[-15:]), flush=True)
    return elapsed, f"exit {done.returncode}: " + ("; ".join(diagnostics[:3] + died[:2]) or last[0])


def stress(paths: list[str], env: dict[str, str], args: argparse.Namespace) -> dict[str, list[str | None]]:
    """Every path ``args.runs`` times (interleaved); per path, each run's failure or None."""
    import multiprocessing

    outcomes: dict[str, list[str | None]] = {path: [] for path in paths}
    burners = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.load)]
    for burner in burners:
        burner.start()
    try:
        with tempfile.TemporaryDirectory(prefix="stress-collectives-") as scratch:
            for index in range(args.runs):
                for path in paths:
                    elapsed, failure = run_once(path, scratch, env, args)
                    outcomes[path].append(failure)
                    print(f"run {index + 1:3d} {path:12s} {elapsed:6.1f} s  {failure or 'ok'}", flush=True)
    finally:
        for burner in burners:
            burner.kill()
    return outcomes


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each path (default 10)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, from: {', '.join(PATHS)}")
    parser.add_argument("--checks", choices=("glibc", "none"), default="glibc", help="glibc heap checks (default)")
    parser.add_argument("--perturb", type=int, default=165, help="MALLOC_PERTURB_ byte (default 165)")
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="also the glibc settings a run gives its Ray workers (ray_worker_keep_freed_memory): large blocks "
        "from the heap, next to small ones, where an overrun past a tensor reaches another chunk's header",
    )
    parser.add_argument("--load", type=int, default=0, help="busy processes kept running meanwhile (default 0)")
    parser.add_argument("--iterations", type=int, default=200, help="uneven: collectives; groups: 10 x cycles")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take (default 300)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = sorted(set(args.paths.split(",")) - set(PATHS))
    if unknown or args.runs < 1 or args.iterations < 1 or not 0 <= args.perturb <= 255:
        parser.error(
            f"--paths takes {', '.join(PATHS)} (got {', '.join(unknown) or args.paths}); "
            "--runs and --iterations at least 1; --perturb 0-255"
        )
    return args


def main() -> int:
    args = parse_arguments()
    if args.child:
        run_child(args.child, args.model_dir, args.iterations)
        return 0
    # A `timeout` (SIGTERM) still ends the busy processes and the run in progress (the finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    checks = glibc_check_environment(args.perturb) if args.checks == "glibc" else {}
    if args.keep_freed_memory:
        from telescope.runtime.ray_cluster import KEEP_FREED_MEMORY

        checks = {**checks, **KEEP_FREED_MEMORY}
    print(f"checks: {' '.join(f'{k}={v}' for k, v in checks.items()) or 'none'}; load: {args.load} busy processes")
    outcomes = stress(args.paths.split(","), {**os.environ, **checks}, args)
    print("\nsummary:")
    for path, results in outcomes.items():
        failures = [f"run {i + 1}: {failure}" for i, failure in enumerate(results) if failure]
        print(f"  {path:12s} {len(results) - len(failures)}/{len(results)} clean")
        for failure in failures:
            print(f"    {failure}")
    return 1 if any(any(results) for results in outcomes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
