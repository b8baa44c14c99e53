"""How many cores the machine really gives to several busy processes right now.

The loop's benchmarks assume that each of their busy processes gets a core of its
own. A machine can give fewer: other tenants, or a guest kernel that packs runnable
tasks onto fewer virtual CPUs. This project's 2-core CI machine boots with
``sched_vcpu_pack``; there, two unpinned spinning processes were seen sharing one
vCPU, each losing half its time, while pinned ones ran whole. Every two-process
timing taken then is off by up to 2x, TRL's included.

:func:`effective_cores` spins one process per CPU for a short while and sums the CPU
time they got, divided by the wall time. The benchmarks print it before and after
their runs, so figures taken on a machine that gave less than its cores can be set
aside. Run alone: ``python bench/cores_check.py``.

:func:`cpu_description` names the CPU and its widest vector instructions. This
project's sessions have run on different hosts behind the same 2-vCPU shape (an AMD
EPYC with AVX-512 and ``avx512_bf16`` on some days, one with AVX2 only on others),
and float32 and bfloat16 matrix products run at different speeds on each, so
figures from two hosts are not comparable either; the benchmarks print it with the
cores check.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import time
from pathlib import Path

#: The vector-instruction flags of /proc/cpuinfo that change how fast CPU kernels run.
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def _spin(seconds: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    start = time.perf_counter()
    cpu = time.process_time()
    while time.perf_counter() - start < seconds:
        pass
    out.put(time.process_time() - cpu)


def effective_cores(seconds: float = 1.0, processes: int | None = None) -> float:
    """CPU seconds that ``processes`` (default: one per CPU) spinning processes got, per second of wall time."""
    count = processes or os.cpu_count() or 1
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()  # type: ignore[type-arg]
    workers = [context.Process(target=_spin, args=(seconds, results)) for _ in range(count)]
    for worker in workers:
        worker.start()
    cpu = sum(results.get(timeout=60 + 10 * seconds) for _ in workers)
    for worker in workers:
        worker.join()
    return float(cpu / seconds)


def cpu_description() -> str:
    """The CPU's model name and which of :data:`VECTOR_FLAGS` it has (Linux; elsewhere the platform's name)."""
    path = Path("/proc/cpuinfo")
    if not path.exists():
        return f"CPU {platform.processor() or platform.machine()}"
    cpuinfo = path.read_text()
    fields = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition(":") for line in cpuinfo.splitlines())
        if key.strip() in ("model name", "flags")
    )
    flags = set(fields.get("flags", "").split())
    have = [flag for flag in VECTOR_FLAGS if flag in flags]
    missing = [flag for flag in VECTOR_FLAGS if flag not in flags]
    name = fields.get("model name", platform.machine())
    if not have:
        return f"CPU {name}: none of {' '.join(VECTOR_FLAGS)}"
    return f"CPU {name}: {' '.join(have)}" + (f" (not {' '.join(missing)})" if missing else "")


def report(when: str) -> str:
    """One line saying how many cores busy processes got ``when`` (a warning if fewer than the CPUs)."""
    have = os.cpu_count() or 1
    got = effective_cores()
    line = f"cores check ({when}): {have} spinning processes got {got:.2f} of {have} CPUs; {cpu_description()}"
    if got < 0.9 * have:
        line += "; the machine gives fewer cores than it has, so two-process timings are not comparable"
    return line


if __name__ == "__main__":
    print(report("now"))
