"""Browser environment throughput: MiniWoB++ episodes on a pool of headless Chromium browsers.

Runs ``--episodes`` click-button episodes of :class:`telescope_envs.miniwob.MiniWoBEnvironment`
from ``--workers`` threads (as the orchestrator's worker threads call an environment),
on ``--browsers`` Chromium processes of the local provider, each episode answered by a
scripted policy (the right click, read from the prompt). Reports environment steps (tool
actions) per second, episodes per second, the latency of one action (the click and the
page's new snapshot) at p50 and p95, and the memory of the browsers' process trees (PSS:
shared pages divided among the processes that map them, so a renderer's share of Chromium's
libraries is not counted once per process) with ``--workers`` contexts open at once, with
none open (the browsers idle, after the episodes), and their difference per context. Needs Chromium, Playwright and
``miniwob``. Run by hand: ``python bench/bench_browser.py --browsers 2 --workers 8``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from cores_check import report


def tree_pss_mb(processes: list) -> float:
    """The proportional set size of ``processes`` and their descendants, in MiB."""
    total = 0
    for process in processes:
        try:
            members = [process, *process.children(recursive=True)]
        except Exception:  # the browser exited meanwhile
            continue
        for member in members:
            try:
                total += member.memory_full_info().pss
            except Exception:  # a renderer that exited meanwhile
                continue
    return total / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--browsers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=64)
    args = parser.parse_args()

    import json

    from telescope.api.records import Message
    from telescope_envs.miniwob import MiniWoBEnvironment

    print(report("before"), flush=True)
    env = MiniWoBEnvironment(
        tasks=["click-button"], samples_per_task=args.episodes, browser_provider_kwargs={"num_browsers": args.browsers}
    )
    samples = env.load_dataset()
    latencies: list[float] = []
    solved = 0
    lock = threading.Lock()
    open_now = threading.Semaphore(0)
    peak_mb: list[float] = []

    def episode(index: int) -> None:
        nonlocal solved
        sample = samples[index]
        messages: list[Message] = env.format_prompt(sample)
        state = env.initial_state(sample)
        task, page = str(messages[-1]["content"]).split("\nPage:\n")
        asked = re.search(r'Click on the "(.+?)" button', task)
        line = next(x for x in page.splitlines() if asked and f'button "{asked.group(1)}"' in x)
        call = {"name": "click", "arguments": {"ref": int(line[1 : line.index("]")])}}
        messages.append({"role": "assistant", "content": f"<tool_call>{json.dumps(call)}</tool_call>"})
        state.turn += 1
        if index < args.workers:  # the first wave: every worker holds an open context here
            open_now.release()
            time.sleep(1.0)
        start = time.perf_counter()
        env.env_response(messages, state)
        elapsed = time.perf_counter() - start
        reward = env.compute_reward(messages, sample, state)
        with lock:
            latencies.append(elapsed)
            solved += reward.total_reward > 0

    def measure_memory() -> None:
        for _ in range(args.workers):
            open_now.acquire()
        peak_mb.append(tree_pss_mb(env._browser().browser_processes()))

    watcher = threading.Thread(target=measure_memory, daemon=True)
    watcher.start()
    wall = time.perf_counter()
    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(episode, range(len(samples))))
    wall = time.perf_counter() - wall
    watcher.join(timeout=5)
    time.sleep(2.0)  # the last contexts' renderers exit
    idle_mb = tree_pss_mb(env._browser().browser_processes())
    env.close()
    latencies.sort()
    p95 = latencies[max(0, int(0.95 * len(latencies)) - 1)]
    print(
        f"{len(samples)} episodes on {args.browsers} browsers from {args.workers} threads: {wall:.1f} s, "
        f"{len(samples) / wall:.2f} episodes/s, {len(latencies) / wall:.2f} environment steps/s, solved {solved}"
    )
    print(f"action (click + new snapshot): p50 {1000 * statistics.median(latencies):.0f} ms, p95 {1000 * p95:.0f} ms")
    if peak_mb:
        print(
            f"browsers' memory (PSS) with {args.workers} contexts open: {peak_mb[0]:.0f} MiB, with none: "
            f"{idle_mb:.0f} MiB; {(peak_mb[0] - idle_mb) / args.workers:.0f} MiB a context"
        )
    print(report("after"))


if __name__ == "__main__":
    main()
