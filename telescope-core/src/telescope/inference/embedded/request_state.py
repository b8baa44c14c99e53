"""What the engine keeps about each request while it runs: its samples and its prefill.

:class:`Request` is one submitted request (prompt, parameters, callback, timing);
:class:`Seq` one of its ``n`` samples as it decodes (tokens, log-probabilities, weights
versions, its RNG when seeded, why it finished); :class:`Prefill` a request whose
prompt is being fed (in chunks when the step's token budget is smaller). Plain
classes (the per-token ones slotted), owned by the engine's thread (:mod:`.engine`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from telescope.inference.embedded.records import FinishReason, GenerationParams, RequestResult, RequestTiming


class Seq:
    """One sample of a request as it decodes."""

    __slots__ = (
        "finish",
        "gen",
        "index",
        "last_token_time",
        "logprobs",
        "next_token",
        "out",
        "req",
        "stop_reason",
        "text",
        "top",
        "versions",
    )

    def __init__(self, req: Request, index: int, gen: random.Random | None) -> None:
        self.req = req
        self.index = index
        self.gen = gen
        self.out: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.top: list[dict[int, float]] | None = [] if req.params.num_top_logprobs else None
        self.finish: FinishReason | None = None
        self.stop_reason: int | str | None = None
        self.text: str | None = None
        self.next_token = -1
        self.last_token_time = 0.0


class Request:
    """One submitted request and its samples."""

    def __init__(
        self, request_id: str, prompt: list[int], params: GenerationParams, on_done: Callable[[RequestResult], None]
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.on_done = on_done
        self.seqs: list[Seq] = []
        self.aborted = False
        self.arrival = time.monotonic()
        self.timing = RequestTiming(queued=time.time())


class Prefill:
    """A request whose prompt is being prefilled (in chunks when the token budget is smaller)."""

    __slots__ = ("done", "req", "state")

    def __init__(self, req: Request) -> None:
        self.req = req
        self.done = 0  # prompt tokens already fed
        self.state: Any = None  # the runner's prefill state (its KV cache so far)
