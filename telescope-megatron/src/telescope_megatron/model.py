"""A megatron-core ``GPTModel`` built from a Hugging Face config, and its packed forward.

Supported families: the dense decoder-only models the project uses, Llama
(``llama``), Qwen2/Qwen2.5 (``qwen2``, also the tiny models of
:mod:`telescope.models.tiny`) and Qwen3 (``qwen3``), and the MoE Qwen3-MoE
(``qwen3_moe``: routed-experts layers from megatron-core's MoE spec, see
:mod:`telescope_megatron.moe`). :func:`transformer_config`
maps their config onto a megatron-core :class:`TransformerConfig`: RMSNorm, SwiGLU
(``gated_linear_unit`` + SiLU), grouped-query attention (``num_query_groups``), RoPE
with the model's base, bias on q/k/v for Qwen2 (and Llama's ``attention_bias``),
q/k RMSNorm for Qwen3, explicit ``head_dim`` (``kv_channels``), tied embeddings.
Anything the mapping cannot represent exactly (sliding-window attention, RoPE
scaling other than none, other MoE families, top-1 routing with ``norm_topk_prob``)
is refused with an error naming the field.

The layers come from megatron-core's *local* layer spec (no Transformer Engine), so
the same model runs on the CPU (with :mod:`telescope_megatron.cpu_patches`) and on a
GPU; dropout is 0 as in the HF models. Two modules of the spec are replaced: the
norms (:class:`RMSNorm`, the same ``torch.nn.RMSNorm`` but usable under sequence
parallelism) and the core attention's forward (torch's
``scaled_dot_product_attention``, see :func:`_sdpa_attention_class`). Under pipeline
parallelism each rank builds its stage only (``pre_process``/``post_process``).

Packed sequences: several samples share one row, with ``position_ids`` restarting
at 0 for each (the layout of :mod:`telescope.trainer.packing`). megatron-core's
packed (THD) attention needs Transformer Engine or flash attention, so
:func:`packed_logits` instead builds a block-diagonal causal mask from the
position ids (a token attends to earlier tokens of its own sample only) and RoPE
angles indexed by each token's own position, then runs the model's embedding,
decoder and output layer. The mask is ``S x S`` booleans per micro-batch: fine at
the CPU and test sizes; long GPU sequences want the THD path (not built yet).

The vocabulary-parallel logits are gathered (:class:`_GatherVocabulary`), so every
tensor-parallel rank holds the full logits and the loss is computed exactly as the
FSDP backend computes it (at the cost of ``S x V`` logits per rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from telescope_megatron.moe import moe_config_fields, moe_problem, num_experts, sparse_layers

if TYPE_CHECKING:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe")
#: Families whose attention has q/k RMSNorm.
_QK_NORM_TYPES = ("qwen3", "qwen3_moe")


class UnsupportedModelError(ValueError):
    """The Hugging Face config describes something this backend cannot build exactly."""


@dataclass(frozen=True)
class ModelShape:
    """The sizes the weight conversion needs (read from the Hugging Face config)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    qkv_bias: bool
    qk_norm: bool
    tied_embeddings: bool
    #: the HF embedding's ``padding_idx`` (``pad_token_id``): its row gets no gradient from the lookup
    padding_idx: int | None = None
    #: MoE models: the number of routed experts (0: a dense model)
    num_experts: int = 0
    #: MoE models: the model-wide indices of the layers whose MLP is the sparse (routed) block
    sparse_layers: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, hf_config: Any) -> ModelShape:
        check_supported(hf_config)
        heads = int(hf_config.num_attention_heads)
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        model_type = hf_config.model_type
        return cls(
            num_layers=int(hf_config.num_hidden_layers),
            hidden_size=int(hf_config.hidden_size),
            num_attention_heads=heads,
            num_query_groups=int(getattr(hf_config, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            vocab_size=int(hf_config.vocab_size),
            qkv_bias=model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
            qk_norm=model_type in _QK_NORM_TYPES,
            tied_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            padding_idx=getattr(hf_config, "pad_token_id", None),
            num_experts=num_experts(hf_config),
            sparse_layers=sparse_layers(hf_config),
        )

    def is_sparse(self, layer: int) -> bool:
        """Whether model-wide layer ``layer`` has the routed-experts MLP."""
        return layer in self.sparse_layers


def rope_theta(hf_config: Any) -> float:
    """The RoPE base: ``rope_theta`` (transformers 4) or ``rope_parameters["rope_theta"]`` (v5)."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta if theta is not None else getattr(hf_config, "rope_theta", 10000.0))


def check_supported(hf_config: Any) -> None:
    """Raise :class:`UnsupportedModelError` naming what the megatron backend cannot build exactly."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported by the megatron backend "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)}); use train_backend: fsdp"
        )
    if getattr(hf_config, "use_sliding_window", False):
        raise UnsupportedModelError("use_sliding_window=true (sliding-window attention) is not supported")
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else "default"
    if rope_type not in ("default", None):
        raise UnsupportedModelError(f"rope scaling {rope_type!r} is not supported (only plain RoPE)")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"hidden_act {hf_config.hidden_act!r} is not supported (only silu)")
    if getattr(hf_config, "mlp_bias", False):
        raise UnsupportedModelError("mlp_bias=true is not supported")
    problem = moe_problem(hf_config)
    if problem:
        raise UnsupportedModelError(problem)


def transformer_config(
    hf_config: Any,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    context_parallel_size: int = 1,
    expert_parallel_size: int = 1,
    sequence_parallel: bool = False,
    recompute: bool = False,
    params_dtype: torch.dtype = torch.float32,
    use_cpu_initialization: bool = True,
) -> TransformerConfig:
    """The megatron-core :class:`TransformerConfig` of a Hugging Face config (see the module doc)."""
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    shape = ModelShape.from_hf(hf_config)
    moe = moe_config_fields(hf_config, expert_parallel_size=expert_parallel_size, num_layers=shape.num_layers)
    if moe and tensor_parallel_size > 1 and not sequence_parallel:
        raise UnsupportedModelError(
            "an MoE model at megatron_tensor_parallel_size > 1 needs megatron_sequence_parallel: true "
            "(megatron-core trains MoE layers under tensor parallelism only with sequence parallelism)"
        )
    if expert_parallel_size > 1 and not moe:
        raise UnsupportedModelError(
            f"megatron_expert_parallel_size={expert_parallel_size} needs an MoE model (this one has no experts)"
        )
    return TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_query_groups,
        kv_channels=shape.head_dim,
        ffn_hidden_size=int(hf_config.intermediate_size),
        normalization="RMSNorm",
        layernorm_epsilon=float(hf_config.rms_norm_eps),
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        qk_layernorm=shape.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention_softmax_in_fp32=True,
        apply_rope_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=tensor_parallel_size,
        pipeline_model_parallel_size=pipeline_parallel_size,
        context_parallel_size=context_parallel_size,
        sequence_parallel=sequence_parallel and tensor_parallel_size > 1,
        pipeline_dtype=params_dtype,
        variable_seq_lengths=pipeline_parallel_size > 1,  # packed rows differ in length: stages exchange shapes
        moe_token_dispatcher_type="alltoall",  # the default ("allgather") needs equal token counts on every rank
        calculate_per_token_loss=True,  # the schedule leaves the loss as computed (global denominator)
        recompute_granularity="full" if recompute else None,
        recompute_method="uniform" if recompute else None,
        recompute_num_layers=1 if recompute else None,
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        use_cpu_initialization=use_cpu_initialization,
        perform_initialization=False,  # the weights are loaded from the Hugging Face model
        **moe,
    )


def build_model(hf_config: Any, config: TransformerConfig) -> GPTModel:
    """A ``GPTModel`` (local layer spec, RoPE, full-vocabulary logits) for ``hf_config``."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from telescope_megatron.cpu_patches import apply_cpu_patches, cuda_free

    apply_cpu_patches()
    shape = ModelShape.from_hf(hf_config)
    dense = _layer_spec(shape, None)
    sparse = _layer_spec(shape, shape.num_experts) if shape.num_experts else dense
    first = get_transformer_layer_offset(config)  # this pipeline stage's first layer, model-wide
    layers = [sparse if shape.is_sparse(first + i) else dense for i in range(get_num_layers_to_build(config))]
    spec = TransformerBlockSubmodules(layer_specs=layers, layer_norm=RMSNorm)
    with cuda_free():  # the last stage's tied output weight is moved with .cuda() (see cpu_patches)
        return GPTModel(
            config=config,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            transformer_layer_spec=spec,
            vocab_size=shape.vocab_size,
            max_sequence_length=int(hf_config.max_position_embeddings),
            parallel_output=True,  # vocabulary shards; packed_logits gathers them
            share_embeddings_and_output_weights=shape.tied_embeddings,
            position_embedding_type="rope",
            rotary_base=int(rope_theta(hf_config)),
        )


def _layer_spec(shape: ModelShape, experts: int | None) -> Any:
    """The local spec of one decoder layer: a dense MLP (``experts`` None) or megatron-core's MoE with SequentialMLP."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    layer = get_gpt_layer_local_spec(
        num_experts=experts, moe_grouped_gemm=False, qk_layernorm=shape.qk_norm, normalization="RMSNorm"
    )
    layer.submodules.input_layernorm = layer.submodules.pre_mlp_layernorm = RMSNorm
    attention = layer.submodules.self_attention.submodules
    attention.core_attention = _sdpa_attention_class()
    if shape.qk_norm:
        attention.q_layernorm = attention.k_layernorm = RMSNorm
    return layer


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` built as megatron-core builds its norms, usable under sequence parallelism.

    The local spec's ``WrappedTorchNorm`` builds the same ``torch.nn.RMSNorm`` but
    refuses ``sequence_parallel`` (megatron-core 0.16 leaves that to Apex or
    Transformer Engine). Under sequence parallelism a norm sees this rank's slice of
    the sequence only: its weight is marked ``sequence_parallel`` so that its gradient
    is summed over the tensor-parallel ranks (the backend does it before clipping). Its
    weight is in ``config.params_dtype`` as every other parameter (the compute dtype);
    torch computes the normalisation itself in float32 for 16-bit inputs.
    """

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        if config.sequence_parallel:
            self.weight.sequence_parallel = True  # type: ignore[attr-defined]


def _sdpa_attention_class() -> type:
    """megatron-core's ``DotProductAttention`` whose forward is torch's ``scaled_dot_product_attention``.

    Why: the local spec's attention materialises the ``[heads, S, S]`` scores with
    ``baddbmm`` into a shared scratch buffer, applies the mask with ``masked_fill`` and a
    separate softmax; on the CPU that was three times the FSDP backend's step time at the
    quick start's sizes (a 1440-token packed row). ``scaled_dot_product_attention`` takes
    the same boolean mask (inverted: True = attend), the same scale and grouped-query
    heads, and runs fused kernels on the CPU and on a GPU. Dropout is 0 (the supported
    models), so it is not applied here.
    """
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from telescope_megatron.context import gather_sequence

    class SDPAttention(DotProductAttention):
        def __init__(self, config: TransformerConfig, *args: Any, **kwargs: Any) -> None:
            # DotProductAttention refuses context parallelism (it is TE's in megatron-core); this
            # class does its own (telescope_megatron.context), so build it as at CP 1.
            cp, config.context_parallel_size = config.context_parallel_size, 1
            try:
                super().__init__(config, *args, **kwargs)
            finally:
                config.context_parallel_size = cp

        def forward(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attention_mask: torch.Tensor | None,
            attn_mask_type: Any = None,
            attention_bias: Any = None,
            packed_seq_params: Any = None,
        ) -> torch.Tensor:
            assert attention_bias is None and packed_seq_params is None
            if self.config.context_parallel_size > 1:  # this rank's queries, every rank's keys and values
                key, value = gather_sequence(key), gather_sequence(value)
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [S, B, N, D] -> [B, N, S, D]
            context = torch.nn.functional.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=None if attention_mask is None else ~attention_mask,
                is_causal=attention_mask is None,
                scale=self.softmax_scale,
                enable_gqa=self.num_attention_heads_per_partition != self.num_query_groups_per_partition,
            )
            return context.permute(2, 0, 1, 3).reshape(q.shape[2], q.shape[0], self.hidden_size_per_partition)

    return SDPAttention


def packed_attention_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """``[1, 1, S, S]`` booleans, True where attention is *masked*: other samples and the future.

    A sample starts wherever the position id is 0 (:mod:`telescope.trainer.packing`).
    """
    segments = torch.cumsum((position_ids[0] == 0).long(), dim=0)
    n = segments.numel()
    causal = torch.ones(n, n, dtype=torch.bool, device=position_ids.device).tril()
    same = segments[:, None] == segments[None, :]
    return ~(causal & same)[None, None]


def rotary_angles(model: GPTModel, position_ids: torch.Tensor) -> torch.Tensor:
    """RoPE angles ``[S, 1, 1, dim]`` at each token's own position (megatron's non-interleaved layout).

    Computed here rather than by ``model.rotary_pos_emb``, which numbers positions
    ``0..S-1`` (one sample per row) and moves its buffer to CUDA.
    """
    inv_freq = model.rotary_pos_emb.inv_freq.to(position_ids.device)
    freqs = position_ids[0].to(inv_freq.dtype)[:, None] * inv_freq[None, :]
    return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]


def packed_logits(
    model: GPTModel, input_ids: torch.Tensor, position_ids: torch.Tensor, padding_idx: int | None = None
) -> torch.Tensor:
    """Full-vocabulary logits ``[S, V]`` of one packed row ``[1, S]`` (attention kept inside each sample).

    Under pipeline parallelism this is one *stage's* forward: a stage without the
    embedding reads its input from ``model.set_input_tensor`` (the pipeline schedule
    sets it), and a stage without the output layer returns its hidden states
    ``[S, 1, H]`` for the next stage instead of logits. Under sequence parallelism
    (``config.sequence_parallel``) the embedding keeps each tensor-parallel rank's
    slice of the sequence, the layers work on ``S / TP`` rows between their
    all-gathers and reduce-scatters, and the output layer gathers the sequence back.

    all-gathers and reduce-scatters, and the output layer gathers the sequence back; a
    row whose length is not a multiple of TP is padded at its end with one-token
    samples (which no real token attends to) and the logits cut back to ``S``.

    ``padding_idx``: as ``torch.nn.Embedding(padding_idx=...)`` in the Hugging Face
    models, the lookups of that token pass no gradient to its embedding row (a tied
    output layer still does), so training updates the same weights as the HF model.
    """
    import contextlib

    from megatron.core import parallel_state

    from telescope.trainer.public import gathered_order, local_indices
    from telescope_megatron.context import gather_logits
    from telescope_megatron.cpu_patches import cuda_free

    length = input_ids.shape[1]
    sequence_parallel = bool(model.config.sequence_parallel)
    tp = parallel_state.get_tensor_model_parallel_world_size()
    cp = parallel_state.get_context_parallel_world_size()
    multiple = (tp if sequence_parallel else 1) * (2 * cp if cp > 1 else 1)
    if length % multiple:
        extra = multiple - length % multiple
        input_ids = torch.nn.functional.pad(input_ids, (0, extra), value=padding_idx or 0)
        position_ids = torch.nn.functional.pad(position_ids, (0, extra))  # position 0: a new one-token sample
    mask = packed_attention_mask(position_ids)
    if cp > 1:  # this rank's tokens (load-balanced chunks); its mask rows, the columns in the gathered order
        padded = input_ids.shape[1]
        mine = local_indices(padded, cp, parallel_state.get_context_parallel_rank(), input_ids.device)
        order = gathered_order(padded, cp, input_ids.device)
        mask = mask[:, :, mine][:, :, :, order]
        input_ids, position_ids = input_ids[:, mine], position_ids[:, mine]
    # megatron-core's sequence gathers and the MoE all-to-all allocate on CUDA (see cpu_patches); the backward
    # is in the backend's scope
    gathers = sequence_parallel or cp > 1 or parallel_state.get_expert_model_parallel_world_size() > 1
    scope = cuda_free() if gathers and input_ids.device.type == "cpu" else contextlib.nullcontext()
    with scope:
        embedded = None
        if model.pre_process:
            embedded = model.embedding(input_ids=input_ids, position_ids=position_ids)  # [S, 1, H]
            if padding_idx is not None:
                frozen = (input_ids[0] == padding_idx)[:, None, None]
                if sequence_parallel:  # the embedding kept this rank's slice of the sequence
                    frozen = frozen.chunk(tp)[parallel_state.get_tensor_model_parallel_rank()]
                embedded = torch.where(frozen, embedded.detach(), embedded)
        rotary = rotary_angles(model, position_ids)
        hidden = model.decoder(hidden_states=embedded, attention_mask=mask, rotary_pos_emb=rotary)
        if not model.post_process:
            return hidden
        weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
        logits, _ = model.output_layer(hidden, weight=weight)  # [S, 1, V / TP] (sequence gathered under SP)
        if tp > 1:
            logits = _GatherVocabulary.apply(logits, parallel_state.get_tensor_model_parallel_group())
        if cp > 1:
            logits = gather_logits(logits, order)
    return logits[:length, 0, :]  # [S, 1, V] -> [S, V]


class _GatherVocabulary(torch.autograd.Function):
    """All-gather vocabulary-parallel logits along the last dimension; backward keeps this rank's slice.

    Every tensor-parallel rank computes the same loss from the same full logits, so
    each rank's slice of the gradient is already the whole gradient of its shard.
    (megatron-core's own gather allocates its output on CUDA.)
    """

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.rank, ctx.size = torch.distributed.get_rank(group), torch.distributed.get_world_size(group)
        parts = [torch.empty_like(shard) for _ in range(ctx.size)]
        torch.distributed.all_gather(parts, shard.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.chunk(ctx.size, dim=-1)[ctx.rank].contiguous(), None
