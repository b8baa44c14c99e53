"""How rollouts are generated: sampling, compaction, packing, the inference server, sandboxes.

Each class is one section of the reference documentation (:mod:`telescope.schema.sections`);
:class:`~telescope.schema.config.TelescopeConfig` composes them.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from telescope.schema.sections import SectionFields


class RolloutSamplingFields(SectionFields):
    """The fields of the 'rollout / sampling' section."""

    section: ClassVar[str] = "rollout / sampling"

    group_size: int = Field(8, ge=1, description="Number of completions sampled per prompt")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (> 0)")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling probability. null = disabled")
    max_tokens: int = Field(3700, ge=1, description="Maximum generation tokens per completion (per turn)")
    interleaved_rollouts: bool = Field(
        True, description="Exact token reuse across turns (no re-tokenization in multi-turn environments)"
    )


class CompactionFields(SectionFields):
    """The fields of the 'compaction' section."""

    section: ClassVar[str] = "compaction"

    compaction: str = Field(
        "none",
        min_length=1,
        description='Context compaction of multi-turn episodes: "none", "summarize", "drop_tool_outputs", '
        '"sliding" or a plugin. An episode whose context reaches compaction_threshold x max_model_len goes on '
        "in a new context segment instead of ending",
    )
    compaction_threshold: float = Field(
        0.8, gt=0, lt=1, description="Share of max_model_len at which an episode's context is compacted"
    )
    compaction_instruction: str = Field(
        "Summarize the conversation so far: the task, what you have done, what you found and what remains "
        "to do. Your summary replaces the conversation, so keep every detail you still need.",
        min_length=1,
        description="What the policy is asked when compaction: summarize writes a summary of the history",
    )
    compaction_keep_turns: int = Field(
        2,
        ge=1,
        description="Turns kept verbatim by compaction: sliding keeps the last N turns, drop_tool_outputs the "
        "tool results of the last N turns",
    )


class SequencePackingFields(SectionFields):
    """The fields of the 'sequence packing' section."""

    section: ClassVar[str] = "sequence packing"

    seq_len: int = Field(4096, ge=1, description="Maximum sequence length for packing")
    pad_to_multiple_of: int = Field(64, ge=1, description="Pad packed sequences to this alignment")


class InferenceServerFields(SectionFields):
    """The fields of the 'inference server' section."""

    section: ClassVar[str] = "inference server"

    inference_backend: str = Field(
        "auto",
        description='Inference backend: "embedded", "vllm" or a plugin. "auto" = vllm when usable, else embedded',
    )
    inference_host: str = Field(
        "auto",
        min_length=1,
        description='Address inference servers bind. "auto" = loopback on the orchestrator node, a node address '
        '(as Ray reports it) elsewhere; "0.0.0.0" = every interface. Servers always ask for the run token',
    )
    inference_base_port: int = Field(8100, ge=1, le=65535, description="Base port for inference servers")
    max_model_len: int = Field(4096, ge=2, description="Maximum context length (prompt + completion)")
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        description="Sequences one inference server runs at once (vLLM --max-num-seqs; the embedded engine's "
        "batch). null = max_concurrent_prompts_per_server x group_size (capped at 1024 for vLLM, 256 embedded)",
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        description="Tokens one inference scheduler step processes, prefill and decode (vLLM "
        "--max-num-batched-tokens; the embedded engine prefills longer prompts in chunks). null = vLLM's default; "
        "no limit in the embedded engine",
    )
    vllm_scheduling_policy: Literal["priority", "fcfs"] = Field(
        "priority", description='"priority" = turn-aware scheduling for multi-turn; "fcfs" = first-come-first-served'
    )
    enable_thinking: bool = Field(False, description="Pass enable_thinking=True to apply_chat_template()")
    chat_template: str | None = Field(None, description="Jinja2 chat template overriding the tokenizer's")


class SandboxesFields(SectionFields):
    """The fields of the 'sandboxes' section."""

    section: ClassVar[str] = "sandboxes"

    sandbox_provider: str = Field(
        "local",
        description='Sandbox provider of every environment that runs code ("local", "e2b", ...; '
        "an environment's own sandbox_provider kwarg overrides it)",
    )
    browser_provider: str = Field(
        "local",
        description='Browser provider of every environment that acts on web pages ("local": headless Chromium '
        "through Playwright; an environment's own browser_provider kwarg overrides it)",
    )
