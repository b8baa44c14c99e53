"""The embedded engine's records: its settings, a request's parameters, results and timing.

Plain dataclasses, shared by the engine (:mod:`.engine`), its HTTP server and the
backend (which writes :class:`EngineSettings` as JSON for the server process), so
they import no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from telescope.inference.embedded.scheduler import SchedulingPolicy

if TYPE_CHECKING:
    from telescope.api.context import InferenceContext

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class EngineSettings:
    """What an engine needs; :meth:`from_config` derives it from a run config."""

    model_path: str
    dtype: str = "float32"
    #: a torch device, or "auto": a GPU when there is one, else the CPU (by
    #: :func:`~telescope.system.devices.embedded_device`: the server process with its worker index,
    #: an Engine built directly as worker 0)
    device: str = "cpu"
    max_num_seqs: int = 64
    #: tokens one engine step may process (prefill + decode); None = no limit (prompts prefilled whole)
    max_num_batched_tokens: int | None = None
    max_model_len: int = 4096
    scheduling_policy: SchedulingPolicy = "fcfs"
    seed: int = 0
    served_model_name: str | None = None
    initial_policy_version: int = 0
    #: the model forward: "auto" (the compact one of :mod:`.compact` where the model is supported, else
    #: Hugging Face's), "compact" (an error where unsupported) or "hf" (always Hugging Face's)
    forward: Literal["auto", "compact", "hf"] = "auto"
    #: on CUDA, replay the compact forward's decode step as CUDA graphs (:mod:`.cuda_graphs`)
    cuda_graphs: bool = True
    #: prompt tokens whose keys and values are kept across requests for later prompts that start
    #: with them (:mod:`.prefix_cache`); 0 keeps none
    prefix_cache_tokens: int = 0

    @classmethod
    def from_context(cls, context: InferenceContext, device: str | None = None) -> EngineSettings:
        """The context's ``max_num_seqs`` and ``max_num_batched_tokens``.

        ``max_num_seqs`` unset: the context's concurrent sequences (prompts per server x
        group size), capped at 256 and at ``max_num_batched_tokens`` (each running
        sequence decodes one token per step).
        """
        from telescope.models.tiny import resolve_model_path

        if device is None:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        budget = context.max_num_batched_tokens or 256
        return cls(
            model_path=resolve_model_path(context.model),
            dtype=context.model_dtype,
            device=device,
            max_num_seqs=context.max_num_seqs or max(1, min(256, context.max_concurrent_sequences, budget)),
            max_num_batched_tokens=context.max_num_batched_tokens,
            max_model_len=context.max_model_len,
            scheduling_policy=context.scheduling_policy,
            seed=context.seed,
            served_model_name=context.model,
        )

    def to_json(self) -> str:
        import json
        from dataclasses import asdict

        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> EngineSettings:
        import json

        return cls(**json.loads(text))


@dataclass
class GenerationParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    num_top_logprobs: int = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    priority: int = 0
    detokenize: bool = True


@dataclass
class SequenceResult:
    index: int
    token_ids: list[int]
    logprobs: list[float]
    token_policy_versions: list[int]
    finish_reason: FinishReason
    stop_reason: int | str | None
    text: str
    top_logprobs: list[dict[int, float]] | None = None


@dataclass
class RequestTiming:
    """When a request was queued, admitted (its prefill began), got its first token and finished (UNIX s).

    ``started`` and ``first_token`` stay ``None`` for a request aborted before it got there.
    """

    queued: float
    started: float | None = None
    first_token: float | None = None
    finished: float | None = None


@dataclass
class RequestResult:
    request_id: str
    prompt_token_ids: list[int]
    sequences: list[SequenceResult]
    timing: RequestTiming | None = None
