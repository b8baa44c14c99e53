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
"""

from __future__ import annotations

import multiprocessing
import os
import time


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


def report(when: str) -> str:
    """One line saying how many cores busy processes got ``when`` (a warning if fewer than the CPUs)."""
    have = os.cpu_count() or 1
    got = effective_cores()
    line = f"cores check ({when}): {have} spinning processes got {got:.2f} of {have} CPUs"
    if got < 0.9 * have:
        line += "; the machine gives fewer cores than it has, so two-process timings are not comparable"
    return line


if __name__ == "__main__":
    print(report("now"))
