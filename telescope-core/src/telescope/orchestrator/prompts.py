"""Where prompts come from: weighted, seeded, resumable sampling across environments.

Design:

- Each training environment contributes prompts in proportion to its ``weight``.
  The environment of draw ``i`` is a pure function of ``(seed, i)``; within an
  environment, samples come in a seeded permutation per epoch. So the stream of
  prompts is a deterministic function of the seed, and its position is two small
  numbers per environment plus ``i``: :meth:`PromptSource.state_dict` captures it
  and :meth:`PromptSource.load_state_dict` resumes exactly there (the upstream
  sampler was not seeded and not restored on resume).
- Samples reserved for evaluation (``separate_eval_samples``) are excluded by
  ``(environment entry, sample_id)``: never by a display name an environment may
  override.
- Prefetch (``enable_prompt_prefetch``) renders and tokenizes the next
  ``prompt_prefetch_buffer_size`` prompts in a background thread. The state that is
  saved is the state after the last prompt *taken*, not the last one prefetched, so
  prefetching never skips or repeats a prompt across a resume.
- Every item carries the position *before* it was drawn (``state_before``). With
  asynchronous rollouts, prompts finish out of order; a checkpoint stores the
  position before the earliest prompt not yet settled, plus the draws after it that
  are settled (``skip_draws``), and a resume continues from there skipping those, so
  no prompt is skipped or repeated. :class:`DrawLedger` keeps that account for the
  scheduler.
"""

from __future__ import annotations

import asyncio
import hashlib
import queue
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from telescope.api.environment import EnvironmentBase
from telescope.api.records import Sample


@dataclass
class EnvironmentSlot:
    """One training environment as the orchestrator uses it."""

    index: int
    name: str
    environment: EnvironmentBase
    samples: Sequence[Sample]
    weight: float = 1.0
    reward_min: float | None = None
    reward_max: float | None = None
    excluded_ids: frozenset[str] = frozenset()
    usable: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.usable = [i for i, s in enumerate(self.samples) if s.sample_id not in self.excluded_ids]
        if not self.usable:
            raise ValueError(
                f"environment {self.name!r} has no training samples left "
                f"({len(self.samples)} loaded, {len(self.excluded_ids)} reserved for evals); "
                "lower the eval's num_samples or turn off separate_eval_samples"
            )


@dataclass(frozen=True)
class PromptItem:
    """One prompt, ready to send: its environment, sample, messages and token ids."""

    draw: int
    slot: int
    sample: Sample
    messages: list[dict[str, Any]]
    prompt_token_ids: list[int]
    state_before: dict[str, Any] = field(default_factory=dict)


def _derived_seed(*parts: object) -> int:
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


class PromptSource:
    """A deterministic, resumable stream of prompts over weighted environments."""

    def __init__(
        self,
        slots: list[EnvironmentSlot],
        render: Callable[[EnvironmentSlot, Sample], tuple[list[dict[str, Any]], list[int]]],
        *,
        seed: int,
        prefetch: bool = True,
        prefetch_size: int = 24,
    ) -> None:
        if not slots:
            raise ValueError("a prompt source needs at least one environment")
        self.slots = slots
        self.render = render
        self.seed = seed
        total = sum(s.weight for s in slots)
        self._cumulative = []
        acc = 0.0
        for s in slots:
            acc += s.weight / total
            self._cumulative.append(acc)
        # position: next draw index, and per environment (epoch, offset in epoch)
        self._draw = 0
        self._positions: list[list[int]] = [[0, 0] for _ in slots]
        self._orders: dict[int, tuple[int, list[int]]] = {}  # slot -> (epoch, its order): one shuffle an epoch
        self._skip: set[int] = set()
        self._taken_state: dict[str, Any] = self._snapshot()
        self._prefetch = prefetch
        self._prefetch_size = max(1, prefetch_size)
        self._queue: queue.Queue[tuple[PromptItem, dict[str, Any]] | BaseException] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ state

    def _snapshot(self) -> dict[str, Any]:
        return {"draw": self._draw, "positions": [list(p) for p in self._positions], "seed": self.seed}

    def state_dict(self) -> dict[str, Any]:
        """The position after the last prompt taken (what a resume continues from)."""
        return {
            "draw": self._taken_state["draw"],
            "positions": [list(p) for p in self._taken_state["positions"]],
            "seed": self.seed,
            "skip_draws": [],
        }

    def rewind(self, state: dict[str, Any]) -> None:
        """Go back to ``state`` mid-run (a trainer restart from a checkpoint): prefetched prompts are dropped."""
        self.close()
        self._thread, self._queue, self._stop = None, None, threading.Event()
        self.load_state_dict(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._thread is not None:
            raise RuntimeError("load the prompt source state before taking the first prompt")
        if len(state["positions"]) != len(self.slots):
            raise ValueError(
                f"the checkpoint's prompt state has {len(state['positions'])} environments, this run has "
                f"{len(self.slots)}; resume with the same environments"
            )
        self._draw = int(state["draw"])
        self._positions = [list(map(int, p)) for p in state["positions"]]
        self._skip = {int(d) for d in state.get("skip_draws", [])}
        self._taken_state = self._snapshot()

    # --------------------------------------------------------------- sampling

    def _choose_slot(self, draw: int) -> int:
        if len(self.slots) == 1:
            return 0
        u = random.Random(_derived_seed(self.seed, "env", draw)).random()
        for i, edge in enumerate(self._cumulative):
            if u < edge:
                return i
        return len(self.slots) - 1

    def _epoch_order(self, slot: EnvironmentSlot, epoch: int) -> list[int]:
        """The slot's sample order in ``epoch``: a seeded shuffle, computed once per epoch and kept."""
        cached = self._orders.get(slot.index)
        if cached is not None and cached[0] == epoch:
            return cached[1]
        order = list(slot.usable)
        random.Random(_derived_seed(self.seed, "epoch", slot.index, epoch)).shuffle(order)
        self._orders[slot.index] = (epoch, order)
        return order

    def _next_raw(self) -> tuple[int, int, Sample]:
        draw = self._draw
        slot_index = self._choose_slot(draw)
        slot = self.slots[slot_index]
        epoch, offset = self._positions[slot_index]
        sample = slot.samples[self._epoch_order(slot, epoch)[offset]]
        offset += 1
        if offset >= len(slot.usable):
            epoch, offset = epoch + 1, 0
        self._positions[slot_index] = [epoch, offset]
        self._draw += 1
        return draw, slot_index, sample

    def _produce(self) -> tuple[PromptItem, dict[str, Any]]:
        while True:
            before = self._snapshot()
            draw, slot_index, sample = self._next_raw()
            if draw in self._skip:
                self._skip.discard(draw)  # settled before the checkpoint this run resumed from
                continue
            break
        messages, token_ids = self.render(self.slots[slot_index], sample)
        item = PromptItem(draw, slot_index, sample, messages, token_ids, before)
        return item, self._snapshot()

    def _prefetch_loop(self) -> None:
        assert self._queue is not None
        while not self._stop.is_set():
            try:
                produced: tuple[PromptItem, dict[str, Any]] | BaseException = self._produce()
            except BaseException as exc:  # handed to the consumer, which raises it
                produced = exc
            while not self._stop.is_set():
                try:
                    self._queue.put(produced, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(produced, BaseException):
                return

    def next(self) -> PromptItem:
        """Take the next prompt (blocking briefly if the prefetch buffer is empty)."""
        if not self._prefetch:
            item, state = self._produce()
        else:
            if self._thread is None:
                self._queue = queue.Queue(maxsize=self._prefetch_size)
                self._thread = threading.Thread(target=self._prefetch_loop, name="prompt-prefetch", daemon=True)
                self._thread.start()
            assert self._queue is not None
            produced = self._queue.get()
            if isinstance(produced, BaseException):
                raise produced
            item, state = produced
        self._taken_state = state
        return item

    def next_ready(self) -> PromptItem | None:
        """The next prompt if one is prefetched already (never blocks; None otherwise: call :meth:`next`)."""
        if not self._prefetch or self._queue is None:
            return None
        try:
            produced = self._queue.get_nowait()
        except queue.Empty:
            return None
        if isinstance(produced, BaseException):
            raise produced
        item, self._taken_state = produced
        return item

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class DrawLedger:
    """The prompts a run has drawn and which of them are settled: the prompt position a checkpoint saves.

    A drawn prompt is unsettled while its group is in flight or waits for a batch,
    and settled once trained, discarded or cancelled. :meth:`state` is the position
    before the earliest unsettled draw, with the later draws already settled listed in
    ``skip_draws``, so a resume neither repeats nor skips a prompt. Drawing and reading
    the state take one lock: a draw has moved the source's position before it is
    recorded here.
    """

    def __init__(self, prompts: PromptSource) -> None:
        self.prompts = prompts
        self.unsettled: dict[int, PromptItem] = {}
        self.settled: set[int] = set()
        self._lock = asyncio.Lock()

    async def draw(self) -> PromptItem:
        """The next prompt (a prefetched one at once, else drawn in a thread), recorded as unsettled."""
        async with self._lock:
            ready = self.prompts.next_ready()
            item = ready if ready is not None else await asyncio.to_thread(self.prompts.next)
            self.unsettled[item.draw] = item
            return item

    def settle(self, item: PromptItem) -> None:
        self.unsettled.pop(item.draw, None)
        self.settled.add(item.draw)

    async def state(self) -> dict[str, Any]:
        """The prompt position to checkpoint (see the class docstring)."""
        async with self._lock:
            if not self.unsettled:
                self.settled.clear()
                return self.prompts.state_dict()
            earliest = min(self.unsettled)
            self.settled = {d for d in self.settled if d > earliest}
            state = dict(self.unsettled[earliest].state_before)
            state["skip_draws"] = sorted(self.settled)
            return state
