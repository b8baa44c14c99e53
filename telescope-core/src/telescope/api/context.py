"""The narrow run contexts that plugin constructors receive instead of the whole config.

Each plugin kind gets the core values it needs and nothing else, as a frozen,
JSON-able dataclass (so it crosses process boundaries: Ray actors, the inference
server process, vLLM workers). Its own fields come separately as its
:class:`~telescope.api.settings.PluginSettings`. ``from_config`` builds a context
from a loaded config; tests build them directly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from telescope.schema.config import TelescopeConfig


class _Context:
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class TrainerContext(_Context):
    """What a trainer backend reads of the run: model, optimizer, schedule, packing, loss inputs."""

    model: str
    model_dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    #: the compute dtype under mixed precision (``mixed_precision_dtype``; each backend says how it applies
    #: it); None: compute in ``model_dtype`` (the default of a context built by hand)
    mixed_precision_dtype: Literal["float32", "float16", "bfloat16"] | None = None
    seed: int = 0
    number_of_steps: int = 1
    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    lr_scheduler: Literal["none", "constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    number_of_minibatches: int = 1
    seq_len: int = 4096
    pad_to_multiple_of: int = 64
    temperature: float = 1.0
    entropy_chunk_size: int = 1024
    ppo_clip_ref_logprobs: Literal["rollout", "batch"] = "rollout"
    run_dir: str | None = None
    #: record per-section timeline events (forward, backward, ...; CUDA events on a GPU)
    track_gpu_events: bool = True

    @classmethod
    def from_config(cls, config: TelescopeConfig) -> TrainerContext:
        c = config
        return cls(
            model=c.model,
            model_dtype=c.model_dtype,
            mixed_precision_dtype=c.mixed_precision_dtype,
            seed=c.seed,
            number_of_steps=c.number_of_steps,
            learning_rate=c.learning_rate,
            weight_decay=c.weight_decay,
            grad_clip=c.grad_clip,
            lr_scheduler=c.lr_scheduler,
            warmup_steps=c.warmup_steps,
            min_lr_ratio=c.min_lr_ratio,
            number_of_minibatches=c.number_of_minibatches,
            seq_len=c.seq_len,
            pad_to_multiple_of=c.pad_to_multiple_of,
            temperature=c.temperature,
            entropy_chunk_size=c.entropy_chunk_size,
            ppo_clip_ref_logprobs=c.ppo_clip_ref_logprobs,
            run_dir=c.run_dir,
            track_gpu_events=c.track_gpu_events,
        )


@dataclass(frozen=True)
class InferenceContext(_Context):
    """What an inference backend reads of the run: the model, limits, scheduling, where to listen."""

    model: str
    model_dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    seed: int = 0
    max_model_len: int = 4096
    max_concurrent_sequences: int = 64
    #: sequences one server runs at once (``max_num_seqs``); None = the backend's choice from
    #: ``max_concurrent_sequences`` (the most the orchestrator sends a server)
    max_num_seqs: int | None = None
    #: tokens one scheduler step processes, prefill and decode (``max_num_batched_tokens``);
    #: None = the backend's default
    max_num_batched_tokens: int | None = None
    scheduling_policy: Literal["priority", "fcfs"] = "priority"
    #: the address servers bind: loopback for a context built by hand or from a config outside Ray
    #: (``inference_host: auto``); a run's inference worker sets it to loopback on the orchestrator's node
    #: and to its node's address elsewhere. An explicit ``inference_host`` is kept; a wildcard
    #: (``0.0.0.0``) is reached at the node's address (:mod:`telescope.system.addressing`)
    host: str = "127.0.0.1"
    base_port: int = 8100
    tensor_parallel_size: int = 1
    chat_template: str | None = None
    enable_thinking: bool = False
    #: Where the run's OTLP/HTTP trace receiver listens (set by the run when it started one), else None.
    traces_endpoint: str | None = None
    #: The accelerator (CUDA) ids the scheduler assigned this worker, as Ray reports them inside the worker
    #: (``ray.get_runtime_context().get_accelerator_ids()["GPU"]``); set by the run's inference worker.
    #: None: not scheduled (``telescope eval``, tests), so worker ``i`` takes its share of the visible devices
    #: (:func:`telescope.system.devices.worker_visible_devices`).
    gpu_ids: tuple[str, ...] | None = None
    #: The run token (:mod:`telescope.system.access`) the servers must ask for on every route but ``/health``
    #: (hand it to the server process in its environment, ``TELESCOPE_RUN_TOKEN``, never on its command
    #: line); set by the run. None: the servers run open (a context built by hand, tests).
    access_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, config: TelescopeConfig) -> InferenceContext:
        c = config
        return cls(
            model=c.model,
            model_dtype=c.model_dtype,
            seed=c.seed,
            max_model_len=c.max_model_len,
            max_concurrent_sequences=max(1, c.max_concurrent_prompts_per_server * c.group_size),
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens,
            scheduling_policy=c.vllm_scheduling_policy,
            host=_bind_host(c.inference_host),
            base_port=c.inference_base_port,
            tensor_parallel_size=c.inference_tensor_parallel_size,
            chat_template=c.chat_template,
            enable_thinking=c.enable_thinking,
        )


def _bind_host(inference_host: str) -> str:
    """``inference_host`` as servers started without a scheduler bind it: ``auto`` is loopback."""
    return "127.0.0.1" if inference_host == "auto" else inference_host


@dataclass(frozen=True)
class TransportContext(_Context):
    """What a weight transport reads of the run: how long to wait, how to reach the sender.

    ``sender_host`` (the node address of trainer rank 0, which hosts the rendezvous) and
    ``single_node`` (whether the sender and every receiver were placed on one node) are
    set by the run from the actual placement; a context built by hand (tests, one
    machine) leaves them unset: no known host, one node. ``run_id`` names the run (a
    transport tags what it creates outside the run directory with it, so the run can
    remove it); empty outside a run.
    """

    timeout_s: float = 300.0
    prefer_loopback_if_single_node: bool = True
    sender_host: str | None = None
    single_node: bool = True
    run_id: str = ""

    @classmethod
    def from_config(cls, config: TelescopeConfig) -> TransportContext:
        return cls(
            timeout_s=float(config.ray_broadcast_init_timeout_s),
            prefer_loopback_if_single_node=config.ray_broadcast_prefer_loopback_if_single_node,
        )


@dataclass(frozen=True)
class EnvironmentContext(_Context):
    """What an environment reads of the run: the providers of its sandboxes and browsers.

    The core sets it on every environment it builds (``environment.context``), after
    the constructor and before the dataset is loaded; outside a run the class default
    (``EnvironmentContext()``) applies. An environment that runs code
    (``uses_sandbox``) uses ``sandbox_provider`` unless its own ``sandbox_provider``
    keyword argument overrides it; one that acts on web pages (``uses_browser``) uses
    ``browser_provider`` the same way.
    """

    sandbox_provider: str = "local"
    browser_provider: str = "local"

    @classmethod
    def from_config(cls, config: TelescopeConfig) -> EnvironmentContext:
        return cls(
            sandbox_provider=config.sandbox_provider,
            browser_provider=config.browser_provider,
        )


@dataclass(frozen=True)
class LoggerContext(_Context):
    """What a logger reads of the run: where it is, its name, the resolved config to record."""

    run_dir: str
    run_name: str
    resolved_config: dict[str, Any]
    system_metrics_interval_s: float = 1.0
    #: the code snapshot's selection (the run directory's ``code/`` is made with it)
    code_max_file_size_mb: float = 2.0
    code_exclude_patterns: tuple[str, ...] = ()
    #: the config fields its file or command line set (the others hold defaults the
    #: environment may fill, see :mod:`telescope.recording.wandb_identity`)
    explicit_fields: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: TelescopeConfig, run_dir: str) -> LoggerContext:
        return cls(
            run_dir=run_dir,
            run_name=config.wandb_run_name,
            resolved_config=config.model_dump(mode="json"),
            explicit_fields=tuple(sorted(config.model_fields_set)),
            system_metrics_interval_s=config.system_metrics_collection_interval_seconds,
            code_max_file_size_mb=config.wandb_code_max_file_size_mb,
            code_exclude_patterns=tuple(config.wandb_code_exclude_patterns),
        )


@dataclass(frozen=True)
class CompactionContext(_Context):
    """What a compactor reads of the run (its own plugin settings come separately)."""

    max_model_len: int = 4096
    #: share of ``max_model_len`` at which an episode is compacted
    threshold: float = 0.8
    #: the instruction the policy is given to summarise its history (``summarize``)
    instruction: str = ""
    #: turns kept verbatim (``sliding``: the last N; ``drop_tool_outputs``: the tool results of the last N)
    keep_turns: int = 2

    @property
    def working_limit(self) -> int:
        """The context length at which an episode is compacted (``floor(threshold x max_model_len)``)."""
        return int(self.threshold * self.max_model_len)

    @classmethod
    def from_config(cls, config: TelescopeConfig) -> CompactionContext:
        return cls(
            max_model_len=config.max_model_len,
            threshold=config.compaction_threshold,
            instruction=config.compaction_instruction,
            keep_turns=config.compaction_keep_turns,
        )
