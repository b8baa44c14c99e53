"""The watchdog: a run in which nothing progresses fails, and says what is stuck.

Progress is any timeline event (:mod:`telescope.api.events`) of work that
finished without an error: a request, a reward, a group, a trainer phase, a weight
load, an eval... each emits one when it *ends*. Not progress: the infrastructure
monitor's samples (``infra.*``, which keep coming while everything else is stuck),
failures (an event with ``error``: a loop of failing requests is not progress) and
dispatches (:data:`NOT_PROGRESS`). The orchestrator also calls :meth:`Watchdog.beat`
where it makes progress without an event (a warm-start step). When nothing has
progressed for ``watchdog_timeout_s``, the watchdog

1. asks the probes (the services' ``probe()``: each inference server's ``/health``,
   each trainer rank's ping; see :mod:`telescope.runtime.supervisor`) and looks at
   what is in progress here: the orchestrator's phase and in-flight groups per
   server (``describe``), environment calls still running
   (:func:`~telescope.orchestrator.deadlines.running_calls`) and the
   :func:`~telescope.api.events.open_blocks` (a sandbox command, a weight sync,
   a checkpoint);
2. names the stuck component, the most specific first: a server or trainer rank that
   does not answer; else an environment call that has not returned (in a sandbox, when
   one of its sandbox commands is open); else the server whose requests have not
   returned; else the trainer ranks when the orchestrator waits on them; else the
   orchestrator's phase;
3. reports it (``on_stuck``: the run writes it to ``status.json`` as ``stuck`` and to the
   log) and fails the guarded coroutine with :class:`StuckError`, whose message says
   what is stuck and since when.

Timeouts of their own end most hangs first (``inference_request_timeout_s``,
``reward_timeout_s``, ``environment_step_timeout_s``): the watchdog is the backstop
for what has none (a collective on the trainer ranks, a weight load, a checkpoint).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from telescope.api import events
from telescope.orchestrator.deadlines import running_calls

log = logging.getLogger("telescope.orchestrator.watchdog")

T = TypeVar("T")

#: A probe: an async function returning findings, one dict per component it checked, with
#: ``component`` (``inference_server``, ``trainer_rank``), an id (``server``, ``rank``),
#: ``ok`` (bool) and ``detail``.
Probe = Callable[[], Awaitable[list[dict[str, Any]]]]

#: Events that do not count as progress (besides ``infra.*`` and any event with an ``error``): work that
#: starts, or starts again, is not work that finished.
NOT_PROGRESS = frozenset({"orchestrator.group_dispatched", "orchestrator.group_redispatched"})

#: Seconds one probe may take before it counts as not answering.
PROBE_TIMEOUT_S = 10.0


class StuckError(RuntimeError):
    """Nothing progressed for the watchdog's timeout; ``report`` says what is stuck."""

    def __init__(self, report: StuckReport) -> None:
        super().__init__(report.message)
        self.report = report


@dataclass
class StuckReport:
    """What the watchdog found: the stuck component and everything it looked at."""

    idle_s: float
    component: str
    detail: str
    message: str
    where: dict[str, Any] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "detail": self.detail,
            "idle_s": round(self.idle_s, 1),
            **self.where,
            "findings": self.findings,
        }


class Watchdog:
    """Fails a run that stops progressing (see the module docstring)."""

    def __init__(
        self,
        timeout_s: float,
        *,
        probes: Sequence[Probe] = (),
        describe: Callable[[], dict[str, Any]] | None = None,
        on_stuck: Callable[[StuckReport], None] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.probes = list(probes)
        self.describe = describe
        self.on_stuck = on_stuck
        self.last_progress = time.monotonic()
        self.error: StuckError | None = None
        self.check_interval_s = max(0.05, min(5.0, timeout_s / 5)) if timeout_s > 0 else 0.0

    def beat(self) -> None:
        """Something progressed."""
        self.last_progress = time.monotonic()

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = str(event.get("kind", ""))
        if kind.startswith("infra.") or kind in NOT_PROGRESS or event.get("error"):
            return
        self.last_progress = time.monotonic()

    async def guard(self, main: Awaitable[T]) -> T:
        """Run ``main``; fail it with :class:`StuckError` when nothing progresses for ``timeout_s``."""
        if self.timeout_s <= 0:
            return await main
        self.beat()
        unsubscribe = events.subscribe(self._on_event)
        task = asyncio.ensure_future(main)
        checker = asyncio.create_task(self._watch(task), name="watchdog")
        try:
            return await task
        except asyncio.CancelledError:
            if self.error is not None and task.cancelled():
                raise self.error from None
            raise
        finally:
            checker.cancel()
            unsubscribe()

    async def _watch(self, task: asyncio.Future[Any]) -> None:
        while not task.done():
            await asyncio.sleep(self.check_interval_s)
            idle = time.monotonic() - self.last_progress
            if idle < self.timeout_s:
                continue
            report = await self.diagnose(idle)
            if time.monotonic() - self.last_progress < self.timeout_s:
                continue  # something moved while the probes ran
            log.error("watchdog: %s", report.message)
            self.error = StuckError(report)
            if self.on_stuck is not None:
                try:
                    self.on_stuck(report)
                except Exception:
                    log.exception("watchdog: reporting the stuck component failed")
            task.cancel()
            return

    async def _probe(self) -> list[dict[str, Any]]:
        findings: list[dict[str, Any]] = []
        for probe in self.probes:
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    findings.extend(await probe())
            except Exception as exc:
                findings.append({"component": "probe", "ok": False, "detail": f"{type(exc).__name__}: {exc}"})
        return findings

    async def diagnose(self, idle_s: float) -> StuckReport:
        """Look at everything in progress and name the stuck component."""
        findings = await self._probe()
        state = self.describe() if self.describe is not None else {}
        calls = running_calls(asyncio.get_running_loop())
        blocks = events.open_blocks()
        component, detail, where = _stuck_component(idle_s, findings, state, calls, blocks)
        phase = state.get("phase")
        limit = f"watchdog_timeout_s: {self.timeout_s:g}"
        message = f"nothing progressed for {idle_s:.0f} s ({limit}); stuck: {detail}"
        if phase:
            message += f". The orchestrator was {phase}"
        others = [str(f["detail"]) for f in findings if not f.get("ok", True) and str(f.get("detail")) not in detail]
        if others:
            message += "; also: " + "; ".join(others)
        in_progress = [
            {
                "kind": b["kind"],
                "age_s": round(time.time() - float(b["start"]), 1),
                **{k: b[k] for k in ("step", "sandbox_id", "group_id", "sample_id") if k in b},
            }
            for b in blocks
        ]
        findings = [*findings, *({"component": "open", **b} for b in in_progress)]
        return StuckReport(idle_s, component, detail, message, where, findings)


def _stuck_component(
    idle_s: float,
    findings: list[dict[str, Any]],
    state: dict[str, Any],
    calls: list[Any],
    blocks: list[dict[str, Any]],
) -> tuple[str, str, dict[str, Any]]:
    """(component, what is stuck in words, its ids) from what the watchdog saw, the most specific first."""
    ids: dict[str, Any]
    for finding in findings:  # a server or rank that does not answer at all
        if not finding.get("ok", True) and finding.get("component") in ("inference_server", "trainer_rank"):
            ids = {k: finding[k] for k in ("server", "rank", "url", "pid", "node") if k in finding}
            return str(finding["component"]), str(finding["detail"]), ids
    stale_calls = [c for c in calls if c.age_s >= idle_s * 0.9]
    if stale_calls:  # environment code that has not returned since progress stopped
        call = stale_calls[0]
        ids = {k: call.context[k] for k in ("group_id", "sample_id", "rollout_index", "turn") if k in call.context}
        sandbox = next(
            (
                b
                for b in reversed(blocks)
                if str(b["kind"]).startswith("sandbox.") and all(b.get(k) == v for k, v in ids.items())
            ),
            None,
        )
        if sandbox is not None:
            command = f", command {sandbox['command']!r}" if sandbox.get("command") else ""
            where = {**ids, "sandbox_id": sandbox.get("sandbox_id"), "provider": sandbox.get("provider")}
            return (
                "sandbox",
                (
                    f"sandbox {sandbox.get('sandbox_id')} ({sandbox.get('provider')}): {sandbox['kind']} has not "
                    f"returned for {time.time() - float(sandbox['start']):.0f} s{command}, in {call.what}"
                ),
                where,
            )
        return "environment", f"{call.what} has not returned for {call.age_s:.0f} s", ids
    groups = [g for g in state.get("in_flight", []) if float(g.get("age_s", 0)) >= idle_s * 0.9]
    if groups:  # requests that have not come back
        by_server: dict[int, list[dict[str, Any]]] = {}
        for group in groups:
            by_server.setdefault(int(group["server"]), []).append(group)
        server, stuck = max(by_server.items(), key=lambda kv: max(float(g["age_s"]) for g in kv[1]))
        oldest = max(float(g["age_s"]) for g in stuck)
        ids = {"server": server}
        return (
            "inference_server",
            (
                f"inference server {server}: {len(stuck)} group(s) in flight on it have not returned, the oldest "
                f"(sample {stuck[0]['sample_id']!r}) for {oldest:.0f} s"
            ),
            ids,
        )
    waiting_on = state.get("waiting_on")
    if waiting_on == "trainer":
        ranks = [f for f in findings if f.get("component") == "trainer_rank"]
        answer = "; every rank answers its ping (a collective or a long step)" if ranks else ""
        return "trainer", f"the trainer ranks have not finished {state.get('phase', 'their call')}{answer}", {}
    return "orchestrator", str(state.get("phase") or "no component is busy"), {}
