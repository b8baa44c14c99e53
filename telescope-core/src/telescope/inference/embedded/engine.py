"""The embedded inference engine: continuous batching over a Hugging Face causal LM.

Design
------
One background thread runs the loop; callers submit requests from any thread
and get a callback (the HTTP server turns it into an awaited future). Each loop
iteration is one *step*:

1. drop aborted requests (their sequences leave the batch at once);
2. requests whose prefill ended in the previous step join the running batch;
3. admit waiting requests while there are free slots (``max_num_seqs``: running,
   joining and prefilling sequences together), in the queue's order (``fcfs`` or
   ``priority``, see :mod:`.scheduler`), and prefill their prompts together in
   one forward (a request's ``n`` samples share one prefill, and so do requests
   admitted together whose whole prompts are the same tokens, as a GRPO group's
   are; the KV rows are replicated, the shared tokens counted as prefix-cache
   hits), and a prompt that starts with one prefilled before continues from that
   one's keys and values (:mod:`.prefix_cache`, ``prefix_cache_tokens``): when a
   prefill ends, each sample gets its first token and joins the batch at the next step;
4. one decode step for every running sequence together: each feeds its last
   token, the model extends the shared KV cache by one position;
5. finished sequences (EOS / stop token / stop string / ``max_tokens`` /
   ``max_model_len``) leave the batch; a request completes when all its ``n``
   sequences have.

So new requests join between decode steps and sequences of different lengths decode together.

Token budget (``max_num_batched_tokens``, vLLM's meaning): a step processes at most
that many tokens, the decode step's one per running sequence plus the prompt
tokens prefilled. The decode goes first; what is left of the budget goes to
prefill, and a prompt longer than that is prefilled in chunks over several steps
(chunked prefill: each chunk extends the request's own KV cache, so its logits
are those of one whole prefill up to float rounding). ``None`` is no budget: every
admitted prompt is prefilled whole. Running sequences are capped at the budget
too (each decodes one token per step). :attr:`Engine.step_log` keeps the tokens
and running sequences of recent steps.

KV cache and model calls: a :mod:`.runners` runner holds the batch. For dense
Llama-layout models (Llama, Qwen2, Qwen3, Mistral without sliding window) it is the
compact forward of :mod:`.compact` (a preallocated cache written in place, one forward
for a step's prompt chunks, weights loaded by :mod:`.light_model`); other models use
Hugging Face's forward and a left-padded ``DynamicCache`` (``EngineSettings.forward``
chooses; caches other than full attention fail with a clear error). Either way a
sequence's logits equal those of running it alone up to float rounding; a step computes
attention over the longest row for every row (padded batching; vLLM's paged kernel avoids
that), and without a token budget a long prompt stalls the batch for its prefill.

Log-probabilities and sampling: see :mod:`.sampling` (those of the distribution sampled
from: temperature-scaled, then top-p truncated and renormalised). A request with ``seed``
and ``n > 1`` seeds sample ``i`` with ``seed + i``; seeded results are the same alone or
in a batch as long as padding does not change the logits' last bits (true in float32 in
practice; not guaranteed in bfloat16 on GPU).

Weight updates (:meth:`Engine.update_weights`, which says how a transfer overlaps decoding):
running sequences continue with the new weights and keep the KV entries computed before
(as vLLM does); every generated token records the version of the weights that produced
it. The prefix cache is emptied.

Timing: each request records when it was queued, admitted, got its first token and
finished (:class:`RequestTiming`); the server returns it with the response, so the
orchestrator draws queue, prefill and decode phases without an event per token.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from telescope.inference.embedded.light_model import load_engine_model
from telescope.inference.embedded.prefix_cache import PrefixCache
from telescope.inference.embedded.records import (
    EngineSettings,
    GenerationParams,
    RequestResult,
    SequenceResult,
)
from telescope.inference.embedded.request_state import Prefill, Request, Seq
from telescope.inference.embedded.runners import BatchRunner, make_runner
from telescope.inference.embedded.sampling import make_generator, sample
from telescope.inference.embedded.scheduler import WaitingQueue
from telescope.inference.embedded.stats import RequestLatencies
from telescope.inference.weight_updates import load_named_tensors
from telescope.system.devices import embedded_device

log = logging.getLogger(__name__)


#: Steps whose token and sequence counts :attr:`Engine.step_log` keeps.
STEP_LOG_SIZE = 4096


class Engine:
    """A model, its tokenizer and the continuous-batching loop (see the module docstring)."""

    def __init__(self, settings: EngineSettings) -> None:
        from transformers import AutoTokenizer

        budget = settings.max_num_batched_tokens
        if budget is not None and budget < settings.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({budget}) must be at least max_num_seqs ({settings.max_num_seqs}): "
                "every running sequence decodes one token per step"
            )
        self.settings = settings
        device = settings.device
        self.device = torch.device(embedded_device(None, 0, torch.cuda.device_count()) if device == "auto" else device)
        dtype = getattr(torch, settings.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(settings.model_path)
        self.model: Any = load_engine_model(settings.model_path, dtype, settings.forward).to(self.device).eval()
        self.runner: BatchRunner = make_runner(
            self.model, settings.max_model_len, settings.forward, settings.cuda_graphs, settings.max_num_seqs
        )
        #: the uniforms of unseeded sequences (one per row and step, in row order)
        self.generator = make_generator(settings.seed)
        eos: set[int] = set()
        for source in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if isinstance(source, int):
                eos.add(source)
            elif isinstance(source, list):
                eos.update(int(x) for x in source)
        self.eos_token_ids = eos
        self.policy_version = settings.initial_policy_version
        self._rng = random.Random(settings.seed)
        self._queue: WaitingQueue[Request] = WaitingQueue(settings.scheduling_policy)
        self._requests: dict[str, Request] = {}
        self._rows: list[Seq] = []
        #: requests being prefilled (all but the last finish in the step they start)
        self._prefilling: list[Prefill] = []
        #: prefilled requests' live samples, their prefill state and prompt length: they join at the next step
        self._joining: list[tuple[list[Seq], Any, int]] = []
        #: per recent step: (tokens processed: prompt tokens prefilled + sequences decoded, sequences decoded)
        self.step_log: deque[tuple[int, int]] = deque(maxlen=STEP_LOG_SIZE)
        self._lock = threading.Lock()  # held for a whole step; weight updates take it between steps
        self._wakeup = threading.Condition()
        self._pause_requests = 0
        self._weights_incomplete = False  # a streamed update failed part-way: paused until one loads whole
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.stats = {
            "generation_tokens": 0,
            "prompt_tokens": 0,
            "prefix_cache_hits": 0,  # prompt tokens whose prefill was shared (vLLM's name)
            "requests_finished": 0,
            "requests_aborted": 0,
            "weight_updates": 0,
            "steps": 0,
            "batched_tokens": 0,
        }
        self.latencies = RequestLatencies()  # TTFT and inter-token latency, for /metrics
        self.prefix_cache = PrefixCache(settings.prefix_cache_tokens)

    # ------------------------------------------------------------------ control
    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="telescope-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    # ----------------------------------------------------------------- requests
    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: GenerationParams,
        on_done: Callable[[RequestResult], None],
    ) -> None:
        """Queue a request; ``on_done`` is called from the engine thread when it finishes (or is aborted)."""
        if not prompt_token_ids:
            raise ValueError("the prompt is empty; send at least one token")
        vocab = self.model.config.vocab_size
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab:
            raise ValueError(
                f"prompt token ids must lie in [0, {vocab}); got {min(prompt_token_ids)}..{max(prompt_token_ids)}"
            )
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.settings.max_model_len:
            raise ValueError(
                f"this model's maximum context length is {self.settings.max_model_len} tokens; the request "
                f"has {len(prompt_token_ids)} prompt tokens and max_tokens={params.max_tokens} ({total} in all)"
            )
        if params.n > self.settings.max_num_seqs:
            raise ValueError(f"n={params.n} exceeds the engine's max_num_seqs={self.settings.max_num_seqs}")
        req = Request(request_id, list(prompt_token_ids), params, on_done)
        with self._wakeup:
            if request_id in self._requests:
                raise ValueError(f"request id {request_id!r} is already in flight")
            self._requests[request_id] = req
            self._queue.push(req, params.priority)
            self._wakeup.notify_all()

    def generate(
        self,
        prompt_token_ids: list[int],
        params: GenerationParams | None = None,
        request_id: str | None = None,
        timeout: float = 300.0,
    ) -> RequestResult:
        """Blocking convenience for scripts and tests (the engine thread must be running)."""
        done = threading.Event()
        box: list[RequestResult] = []

        def finish(result: RequestResult) -> None:
            box.append(result)
            done.set()

        self.submit(
            request_id or f"gen-{self._rng.getrandbits(64):x}", prompt_token_ids, params or GenerationParams(), finish
        )
        if not done.wait(timeout):
            raise TimeoutError(f"generation did not finish within {timeout} s")
        return box[0]

    def abort(self, request_id: str) -> bool:
        """Abort a queued or running request; its callback gets what was generated so far."""
        with self._wakeup:
            req = self._requests.get(request_id)
            if req is None:
                return False
            req.aborted = True
            self._wakeup.notify_all()
            return True

    # ------------------------------------------------------------------ weights
    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the engine between two steps (the loop yields at the end of the current one)."""
        with self._wakeup:
            self._pause_requests += 1
        try:
            with self._lock:
                yield
        finally:
            with self._wakeup:
                self._pause_requests -= 1
                self._wakeup.notify_all()

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int, streamed: bool = False) -> int:
        """Load ``version`` between two steps; returns the number of tensors loaded.

        By default every tensor is received first (decoding goes on meanwhile), then
        all are copied in while the engine is paused. ``streamed`` (a transport that
        yields each tensor while later ones are still sent: the memory transport)
        pauses first and copies each tensor as it arrives, so the copy overlaps the
        send and the pause lasts about as long as the send. If a streamed version
        fails part-way, the model holds a mix of two versions: the engine then stays
        paused (requests wait) until a version loads whole.
        """
        if streamed:  # wait for the sender's first tensor unpaused (decoding goes on), then take each as it comes
            stream = iter(weights)
            first = next(stream, None)
            received: Iterable[tuple[str, torch.Tensor]] = itertools.chain([] if first is None else [first], stream)
        else:
            received = list(weights)
        with self.paused():
            try:
                count = load_named_tensors(self.model, received)
            except BaseException:
                if streamed:  # the loop stays paused while this is set (paused() notifies it on exit)
                    self._weights_incomplete = True
                    log.error("a streamed weight update failed part-way: the engine waits for one that loads whole")
                raise
            self.runner.weights_updated()
            self.prefix_cache.clear()  # the kept keys and values are the old weights'
            self.policy_version = version
            self.stats["weight_updates"] += 1
            self._weights_incomplete = False
        return count

    # -------------------------------------------------------------------- stats
    def counts(self) -> dict[str, float]:
        with self._wakeup:
            running = self._occupied()
            waiting = sum(r.params.n for r in self._queue)
            kv_tokens = sum(len(s.req.prompt) + len(s.out) for s in self._rows)
            kv_tokens += sum(length * len(seqs) for seqs, _, length in self._joining)
        capacity = self.settings.max_num_seqs * self.settings.max_model_len
        return {
            "running": running,
            "waiting": waiting,
            "kv_cache_usage": kv_tokens / capacity,
            "policy_version": self.policy_version,
            **self.stats,
        }

    # --------------------------------------------------------------------- loop
    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._wakeup:
                    while not self._stopping and (self._pause_requests or self._weights_incomplete or self._idle()):
                        self._wakeup.wait(timeout=0.1)
                    if self._stopping:
                        break
                try:
                    with self._lock:
                        self._step()
                except Exception:  # a failing step must not kill the server silently
                    log.exception("engine step failed; aborting the running requests")
                    self._fail_all()
        self._fail_all()

    def _idle(self) -> bool:
        return not self._rows and not len(self._queue) and not self._prefilling and not self._joining

    def _occupied(self) -> int:
        """Sequences holding a slot: running, joining at the next step, and the one prefilling."""
        prefilling = sum(p.req.params.n for p in self._prefilling)
        return len(self._rows) + sum(len(seqs) for seqs, _, _ in self._joining) + prefilling

    def _step(self) -> None:
        self._drop_aborted()
        for seqs, cache, length in self._joining:
            self._merge(seqs, cache, length)
        self._joining = []
        decoded = len(self._rows)
        budget = self.settings.max_num_batched_tokens
        prefilled = self._admit(None if budget is None else budget - decoded)
        # logged before the decode: its callbacks then see this step counted
        self.stats["steps"] += 1
        self.stats["batched_tokens"] += prefilled + decoded
        self.step_log.append((prefilled + decoded, decoded))
        if self._rows:
            self._decode()

    def _drop_aborted(self) -> None:
        with self._wakeup:
            aborted = [r for r in self._requests.values() if r.aborted]
            for req in aborted:
                self._queue.remove(req)
        if not aborted:
            return
        for req in aborted:
            self._mark_aborted(req)
            self.stats["requests_aborted"] += 1
        self._prefilling = [p for p in self._prefilling if not p.req.aborted]
        joining = [([s for s in seqs if not s.req.aborted], state, length) for seqs, state, length in self._joining]
        self._joining = [entry for entry in joining if entry[0]]
        self._remove_finished()
        for req in aborted:
            self._complete(req)

    def _admit(self, budget: int | None) -> int:
        """Admit and prefill waiting requests within ``budget`` prompt tokens (None: no limit); returns those fed.

        The carried-over chunked prompt goes first, then newly admitted ones; all of
        the step's chunks go to the runner in one call. Only the last chunk can stop
        short of its prompt's end (the budget ran out), so at most one prefill spans
        several steps.
        """
        fed = 0
        batch: list[tuple[Prefill, int]] = []
        for prefill in self._prefilling:
            if budget is not None and fed >= budget:
                break
            left = len(prefill.req.prompt) - prefill.done
            chunk = left if budget is None else min(left, budget - fed)
            batch.append((prefill, chunk))
            fed += chunk
        while budget is None or fed < budget:
            with self._wakeup:
                req = self._queue.peek()
                if req is None or req.params.n > self.settings.max_num_seqs - self._occupied():
                    break
                self._queue.pop()
            if not self._start_prefill(req):
                continue
            prefill = self._prefilling[-1]
            left = len(req.prompt) - prefill.done  # a cached prefix is not fed again
            chunk = left if budget is None else min(left, budget - fed)
            batch.append((prefill, chunk))
            fed += chunk
        if batch:
            self._prefill(batch)
        return fed

    def _start_prefill(self, req: Request) -> bool:
        """Give ``req`` its samples; False when there is nothing to generate (``max_tokens=0``: completed)."""
        params = req.params
        req.timing.started = time.time()
        for i in range(params.n):
            gen = make_generator(params.seed + i) if params.seed is not None else None
            req.seqs.append(Seq(req, i, gen))
        self.stats["prompt_tokens"] += len(req.prompt)
        if params.max_tokens == 0:
            for seq in req.seqs:
                seq.finish = "length"
            self._complete(req)
            return False
        prefill = Prefill(req)
        cached = self.prefix_cache.lookup(req.prompt) if self.prefix_cache.max_tokens else None
        if cached is not None:  # the prompt starts with one prefilled before: continue from its keys and values
            stored, length = cached
            prefill.state, prefill.done = self.runner.prefix_state(stored, length), length
            self.stats["prefix_cache_hits"] += length
        with self._wakeup:
            self._prefilling.append(prefill)
        return True

    def _prefill(self, batch: list[tuple[Prefill, int]]) -> None:
        """Feed each prefill its next chunk; where a prompt ends, sample its samples' first tokens.

        Whole prompts that are the same tokens (a GRPO group's samples, sent as separate
        requests) are computed once: they share that row's logits and KV cache, and join
        the running batch as one copy per sample, as a request's ``n`` samples do.
        """
        compute: list[tuple[list[int], Any]] = []
        source: list[int] = []  # each batch entry's row in ``compute``
        first_of: dict[tuple[int, ...], int] = {}
        for prefill, chunk in batch:
            tokens = prefill.req.prompt[prefill.done : prefill.done + chunk]
            whole = prefill.state is None and chunk == len(prefill.req.prompt)
            key = tuple(tokens) if whole else None
            if key is not None and key in first_of:
                source.append(first_of[key])
                self.stats["prefix_cache_hits"] += chunk
                continue
            if key is not None:
                first_of[key] = len(compute)
            source.append(len(compute))
            compute.append((tokens, prefill.state))
        logits, states = self.runner.prefill(compute)
        rows: list[int] = []
        seqs: list[Seq] = []
        finished: list[tuple[Prefill, int]] = []
        for (prefill, chunk), row in zip(batch, source, strict=True):
            prefill.state = states[row]
            prefill.done += chunk
            if prefill.done == len(prefill.req.prompt):
                finished.append((prefill, row))
                self._keep_prefix(prefill)
                rows.extend([row] * prefill.req.params.n)
                seqs.extend(prefill.req.seqs)
        if not finished:
            return
        with self._wakeup:
            self._prefilling = [p for p in self._prefilling if p.done < len(p.req.prompt)]
        self._record(seqs, logits if rows == list(range(len(compute))) else logits[rows])
        now = time.time()
        joining: dict[int, tuple[list[Seq], Any, int]] = {}  # one join per computed row
        for prefill, row in finished:
            req = prefill.req
            req.timing.first_token = now
            live = [s for s in req.seqs if s.finish is None]
            if live:
                joining.setdefault(row, ([], prefill.state, len(req.prompt)))[0].extend(live)
            else:
                self._complete(req)
        with self._wakeup:
            self._joining.extend(joining.values())

    def _keep_prefix(self, prefill: Prefill) -> None:
        """Offer a finished prompt's keys and values to the prefix cache (copied only if kept)."""
        if self.prefix_cache.max_tokens:
            state, length = prefill.state, prefill.done
            self.prefix_cache.insert(prefill.req.prompt, lambda: self.runner.detach_prefix(state, length))

    def _merge(self, seqs: list[Seq], state: Any, length: int) -> None:
        self.runner.join(state, len(seqs))
        with self._wakeup:
            self._rows.extend(seqs)

    def _decode(self) -> None:
        logits = self.runner.decode([s.next_token for s in self._rows])
        self._record(self._rows, logits)
        self._remove_finished()

    def _record(self, seqs: list[Seq], logits: torch.Tensor) -> None:
        """Sample one token for each of ``seqs`` (rows of ``logits``) and check their stop conditions."""
        num_top = max(s.req.params.num_top_logprobs for s in seqs)
        result = sample(
            logits,
            [s.req.params.temperature for s in seqs],
            [s.req.params.top_p for s in seqs],
            [s.gen for s in seqs],
            num_top=num_top,
            generator=self.generator,
        )
        version = self.policy_version
        self.stats["generation_tokens"] += len(seqs)
        now = time.monotonic()
        for i, seq in enumerate(seqs):
            if seq.out:
                self.latencies.inter_token.observe(now - seq.last_token_time)
            elif seq.index == 0:  # a request's first token (its n samples share one prefill)
                self.latencies.time_to_first_token.observe(now - seq.req.arrival)
            seq.last_token_time = now
            token = result.token_ids[i]
            seq.out.append(token)
            seq.logprobs.append(result.logprobs[i])
            seq.versions.append(version)
            seq.next_token = token
            if seq.top is not None and result.top_ids is not None and result.top_logprobs is not None:
                k = seq.req.params.num_top_logprobs
                seq.top.append(dict(zip(result.top_ids[i][:k], result.top_logprobs[i][:k], strict=True)))
            self._check_stop(seq, token)

    def _check_stop(self, seq: Seq, token: int) -> None:
        params = seq.req.params
        if not params.ignore_eos and token in self.eos_token_ids:
            seq.finish = "stop"
        elif token in params.stop_token_ids:
            seq.finish, seq.stop_reason = "stop", token
        elif params.stop:
            text = str(self.tokenizer.decode(seq.out, skip_special_tokens=params.skip_special_tokens))
            for stop in params.stop:
                at = text.find(stop)
                if at >= 0:
                    seq.finish, seq.stop_reason, seq.text = "stop", stop, text[:at]
                    break
        if seq.finish is None and (
            len(seq.out) >= params.max_tokens or len(seq.req.prompt) + len(seq.out) >= self.settings.max_model_len
        ):
            seq.finish = "length"

    def _remove_finished(self) -> None:
        rows = self._rows
        keep = [i for i, s in enumerate(rows) if s.finish is None]
        if len(keep) == len(rows):
            return
        done_requests = {id(s.req): s.req for s in rows if s.finish is not None}
        order = self.runner.keep(keep)
        with self._wakeup:
            self._rows = [rows[i] for i in order]
        for req in done_requests.values():
            if all(s.finish is not None for s in req.seqs):
                self._complete(req)

    def _complete(self, req: Request) -> None:
        with self._wakeup:
            if self._requests.pop(req.request_id, None) is None:
                return
        sequences = []
        for seq in req.seqs:
            text = seq.text
            if text is None:
                text = (
                    str(self.tokenizer.decode(seq.out, skip_special_tokens=req.params.skip_special_tokens))
                    if req.params.detokenize
                    else ""
                )
            sequences.append(
                SequenceResult(
                    index=seq.index,
                    token_ids=seq.out,
                    logprobs=seq.logprobs,
                    token_policy_versions=seq.versions,
                    finish_reason=seq.finish or "abort",
                    stop_reason=seq.stop_reason,
                    text=text,
                    top_logprobs=seq.top,
                )
            )
        self.stats["requests_finished"] += 1
        req.timing.finished = time.time()
        try:
            req.on_done(RequestResult(req.request_id, req.prompt, sequences, req.timing))
        except Exception:
            log.exception("a completion callback failed for request %s", req.request_id)

    def _fail_all(self) -> None:
        """Abort everything (after a failed step or at shutdown) so no caller waits forever."""
        with self._wakeup:
            pending = list(self._requests.values())
            self._rows = []
            self._prefilling = []
            self._joining = []
        self.runner.clear()
        for req in pending:
            with self._wakeup:
                self._queue.remove(req)
            self._mark_aborted(req)
            self._complete(req)

    @staticmethod
    def _mark_aborted(req: Request) -> None:
        if not req.seqs:  # still waiting: report n empty samples
            req.seqs = [Seq(req, i, None) for i in range(req.params.n)]
        for seq in req.seqs:
            if seq.finish is None:
                seq.finish = "abort"
