"""The ``megatron`` trainer backend: a megatron-core ``GPTModel``, tensor x pipeline x context x expert x data parallel.

One instance per rank. ``setup`` joins the process group (gloo on the CPU, NCCL on
CUDA), lays out megatron-core's groups (``parallel_state.initialize_model_parallel``
with ``megatron_tensor_parallel_size``, ``megatron_pipeline_parallel_size``,
``megatron_context_parallel_size`` and ``megatron_expert_parallel_size``; the
remaining ranks are data parallel, and expert parallelism is carved out of the
data- and context-parallel ranks, as megatron-core does),
builds the model from the Hugging Face config (:mod:`telescope_megatron.model`),
reads from the Hugging Face safetensors only this rank's slices of the weights
(:mod:`telescope_megatron.sharded_load`, names and layouts from
:mod:`telescope_megatron.convert`) and builds AdamW (its states sharded over the
data-parallel ranks with ``megatron_use_distributed_optimizer``:
:mod:`telescope_megatron.optimizer`) and the LR schedule.

Precision (:mod:`telescope_megatron.precision`): the model computes in
``mixed_precision_dtype`` (else ``model_dtype``); the optimizer steps main parameters
in ``megatron_main_params_dtype`` (float32 by default) with float32 main gradients and
Adam moments (each dtype a setting), and copies them back into the model after each
step; float16 compute scales the loss dynamically (:mod:`telescope_megatron.loss_scaling`).

The training step is :class:`~telescope.trainer.packed_backend.PackedTrainerBackend`'s,
the base the FSDP backend shares, with this backend's parallelism hooks: the same packing, dealing of
sequences to *data-parallel* ranks, global loss normalisation, algorithm calls,
metrics and timeline records. So for the same batch the loss and the update equal
the FSDP backend's up to float32 rounding (in float32; in bfloat16 up to where each
rounds to 16 bits). What differs:

- the logits come from :func:`~telescope_megatron.model.packed_logits` (attention
  kept inside each packed sample by an explicit mask);
- gradients are averaged over data-parallel ranks (in float32 with
  ``megatron_grad_reduce_in_fp32``) in flat buckets before clipping, with
  ``megatron_overlap_grad_reduce`` launched during the last backward
  (:mod:`telescope_megatron.grad_buckets`); clipping and the norm work on the
  main gradients, and the gradient norm sums
  tensor-parallel shards once and replicated weights (the norms) once;
- ``megatron_gradient_checkpointing`` recomputes each layer in the backward
  (megatron-core's full, uniform recomputation);
- pipeline parallelism: a minibatch's micro-batches go through megatron-core's 1F1B
  schedule and the algorithm's loss runs on the last stage
  (:mod:`telescope_megatron.pipeline`); the per-micro-batch sums come back to every
  stage; a tied embedding's two copies (first and last stage) get their summed
  gradient; the gradient norm sums over tensor- and pipeline-parallel ranks;
- ``megatron_sequence_parallel`` (TP > 1) splits the sequence over the
  tensor-parallel ranks outside attention and the MLP; the norms' gradients (and
  the q/k norms' always, each rank holding some heads) are summed over the
  tensor-parallel ranks before clipping, as megatron-core's ``finalize_model_grads`` does;
- MoE models (:mod:`telescope_megatron.moe`): with ``megatron_expert_parallel_size`` each
  rank holds some of each layer's experts; an expert's gradient is summed over the
  ranks holding the same experts (the expert-data-parallel group) and divided by the
  data-parallel size, and counts once in the gradient norm (see :meth:`MegatronBackend.clip_and_step`);
- ``named_weights`` gathers one main parameter (cast to ``model_dtype``) at a time over the tensor-parallel group (a
  layer's experts, stacked, over the expert-parallel group too) and yields Hugging Face
  names in the Hugging Face model's order (a layer at most is held back), so the weight
  transport sees exactly what the FSDP backend sends;
- checkpoints hold the Hugging Face weights as a sharded folder, each file written by a
  rank of the stage that holds its tensors (:mod:`telescope_megatron.sharded_save`; with
  the config, so ``telescope convert-checkpoint`` and ``from_pretrained`` read them) and each
  rank's optimizer shard (``optimizer/rank_N.pt``) and precision state
  (``precision/rank_N.pt``: the loss scale, and the main parameters where
  ``model_dtype`` cannot hold them); resuming the training state
  needs the same ``world_size``, tensor-, pipeline- and expert-parallel sizes and
  distributed-optimizer setting (weights-only resumes at any layout).

Limits: MoE for Qwen3-MoE only, without a load-balancing loss (:mod:`telescope_megatron.moe`); no
virtual (interleaved) pipeline; the optimizer is torch AdamW on each rank's shards, sharded
further over data-parallel ranks by torch's ZeRO-1 (not megatron-core's distributed optimizer, see
:mod:`telescope_megatron.optimizer`), and not sharded with expert parallelism (an expert's
data-parallel ranks are not the dense weights' ones);
the logits are gathered over the vocabulary (see :mod:`telescope_megatron.model`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from telescope.trainer.public import (
    DTYPES,
    MicroBatch,
    MinibatchLoss,
    PackedSequence,
    PackedTrainerBackend,
    SectionTimers,
    init_process_group,
    resolve_device,
    token_logprobs,
)
from telescope_megatron.checkpoint import load_megatron_checkpoint, save_megatron_checkpoint
from telescope_megatron.convert import expert_of, partition_dim, stream_hf_weights, unshard
from telescope_megatron.cpu_patches import cuda_free
from telescope_megatron.grad_buckets import BUCKET_ELEMENTS, GradReducer
from telescope_megatron.loss_scaling import DynamicLossScale
from telescope_megatron.model import ModelShape, build_model, packed_logits, transformer_config
from telescope_megatron.moe import expert_gradient_squares, gather_experts, global_expert_name, is_expert_parameter
from telescope_megatron.optimizer import build_optimizer
from telescope_megatron.pipeline import (
    gather_stages,
    global_name,
    hf_owner,
    layer_stages,
    run_schedule,
    share_from_last_stage,
)
from telescope_megatron.plugin import MegatronSettings, inactive_settings
from telescope_megatron.precision import MainParameters, Precision
from telescope_megatron.sharded_load import load_hf_weights, weights_folder

if TYPE_CHECKING:
    from telescope.api.algorithm import Algorithm
    from telescope.api.context import TrainerContext

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _environment_kept() -> Iterator[None]:
    """Undo the environment variables set inside the block.

    megatron-core's ``GPTModel`` writes ``NVTE_FLASH_ATTN``/``NVTE_FUSED_ATTN``/``NVTE_UNFUSED_ATTN``
    into ``os.environ`` (its Transformer Engine attention choice); the local layer spec never
    reads them, and left set they reach every process started afterwards (a later backend
    in the same process, ranks spawned by tests).
    """
    saved = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(saved):
            del os.environ[name]
        os.environ.update({k: v for k, v in saved.items() if os.environ.get(k) != v})


class MegatronBackend(PackedTrainerBackend):
    """megatron-core GPT model, tensor x pipeline x context x expert x data parallel, CPU (gloo) or CUDA (NCCL)."""

    name = "megatron"
    #: Elements per gradient bucket (:mod:`telescope_megatron.grad_buckets`); set before ``setup`` to change it.
    grad_bucket_elements = BUCKET_ELEMENTS

    def __init__(self, context: TrainerContext, algorithm: Algorithm, settings: MegatronSettings | None = None) -> None:
        super().__init__(context, algorithm, settings)
        self.megatron = settings or MegatronSettings()
        self.tp_rank = 0
        self.tp_size = 1
        self.pp_rank = 0
        self.pp_size = 1
        self.cp_size = 1
        self.ep_rank = 0
        self.ep_size = 1
        self.loss_scaler: DynamicLossScale | None = None

    # ------------------------------------------------------------------ setup

    def setup(self, rank: int = 0, world_size: int = 1, device: str | None = None) -> None:
        """Join the process group, build the model-parallel model from the HF weights, AdamW, the schedule."""
        from megatron.core import parallel_state
        from transformers import AutoConfig

        from telescope.models.tiny import resolve_model_path

        tp = self.megatron.megatron_tensor_parallel_size
        pp = self.megatron.megatron_pipeline_parallel_size
        cp = self.megatron.megatron_context_parallel_size
        ep = self.megatron.megatron_expert_parallel_size
        if world_size % (tp * pp * cp):
            raise ValueError(
                f"world size {world_size} is not a multiple of megatron_tensor_parallel_size ({tp}) "
                f"x megatron_pipeline_parallel_size ({pp}) x megatron_context_parallel_size ({cp})"
            )
        if world_size % (tp * pp * ep):  # megatron-core's expert layout: expert TP (= TP) x EP x expert DP x PP
            raise ValueError(
                f"world size {world_size} is not a multiple of megatron_tensor_parallel_size ({tp}) "
                f"x megatron_pipeline_parallel_size ({pp}) x megatron_expert_parallel_size ({ep})"
            )
        self.model_path = resolve_model_path(self.context.model)
        self.hf_config = AutoConfig.from_pretrained(self.model_path)
        self.precision = Precision.of(self.context, self.megatron)
        self.shape = ModelShape.from_hf(self.hf_config)
        self._check_divisible(tp, pp, ep)
        self.global_rank, self.global_world_size = rank, world_size
        self.device = resolve_device(device, rank)
        self._owns_process_group = init_process_group(rank, world_size, self.device)
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            context_parallel_size=cp,
            expert_model_parallel_size=ep,
        )
        self.ep_rank, self.ep_size = parallel_state.get_expert_model_parallel_rank(), ep
        self.cp_group, self.cp_size = parallel_state.get_context_parallel_group(), cp
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.tp_rank, self.tp_size = dist.get_rank(self.tp_group), tp
        self.pp_rank, self.pp_size = parallel_state.get_pipeline_model_parallel_rank(), pp
        self.rank, self.world_size = dist.get_rank(self.dp_group), dist.get_world_size(self.dp_group)
        inactive = inactive_settings(self.megatron, self.world_size, self.ep_size)
        if inactive and self.global_rank == 0:
            log.warning("%s: on, but not built yet in telescope-megatron (no effect)", ", ".join(inactive))
        torch.manual_seed(self.context.seed)

        config = transformer_config(
            self.hf_config,
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            context_parallel_size=cp,
            expert_parallel_size=ep,
            sequence_parallel=self.megatron.megatron_sequence_parallel,
            recompute=self.megatron.megatron_gradient_checkpointing,
            params_dtype=self.precision.compute,
            use_cpu_initialization=self.device.type == "cpu",
        )
        with _environment_kept():  # megatron-core's GPTModel sets NVTE_* (Transformer Engine's attention choice)
            self.model = build_model(self.hf_config, config).to(self.device)
        stages = layer_stages(config, pp)
        offset = stages.index(self.pp_rank)
        local_experts = self.shape.num_experts // ep
        self._params = {
            global_expert_name(global_name(n, offset), self.ep_rank, local_experts): p
            for n, p in self.model.named_parameters()
        }
        # MoE: each layer's stacked experts (the conversion's unit) -> this rank's experts' parameters, in order
        self._expert_members: dict[str, list[str]] = {}
        for name in self._params:
            expert = expert_of(name)
            if expert is not None:
                self._expert_members.setdefault(expert[0], []).append(name)
        # The last stage's copy of a tied embedding (pipeline parallel only): not streamed, counted once.
        self._tied_copy = "output_layer.weight" if self.shape.tied_embeddings and pp > 1 and self.pp_rank > 0 else None
        self.main = MainParameters(self._params, self.precision)
        dense = parallel_state.get_data_parallel_group(with_context_parallel=True)
        experts = parallel_state.get_expert_data_parallel_group() if self._expert_members else None
        self.grad_reducer = GradReducer(
            self.main,
            {n: experts if is_expert_parameter(n) else dense for n in reversed(self._params)},
            self.world_size,
            max_elements=self.grad_bucket_elements,
            overlap=self.megatron.megatron_overlap_grad_reduce,
        )
        self.loss_scaler = DynamicLossScale() if self.precision.scales_loss else None
        self.hf_shapes = self._hf_parameter_shapes()
        self.hf_order = list(self.hf_shapes)
        self.hf_owners = {name: hf_owner(name, stages, pp) for name in self.hf_order}
        load_hf_weights(self, weights_folder(self.model_path))  # this rank's slices only
        self.model.train()
        self.optimizer = self.build_optimizer(self.context.learning_rate, self.context.weight_decay)
        self.scheduler = self.build_scheduler(self.optimizer)
        pad = self.hf_config.pad_token_id if self.hf_config.pad_token_id is not None else self.hf_config.eos_token_id
        self.pad_token_id = int(pad if isinstance(pad, int) else 0)

    def build_optimizer(self, learning_rate: float, weight_decay: float) -> torch.optim.Optimizer:
        """AdamW over the main parameters, its states sharded over the data- (and context-) parallel ranks with the
        distributed optimizer (the warm start's optimizer steps the same main parameters)."""
        from megatron.core import parallel_state

        group = None
        if self.megatron.megatron_use_distributed_optimizer and self.ep_size == 1:
            group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        return build_optimizer(
            self.main.parameters(),
            lr=learning_rate,
            weight_decay=weight_decay,
            shard_group=group,
            exp_avg_dtype=self.precision.exp_avg,
            exp_avg_sq_dtype=self.precision.exp_avg_sq,
        )

    def _check_divisible(self, tp: int, pp: int, ep: int) -> None:
        s = self.shape
        sizes = {
            "num_attention_heads": s.num_attention_heads,
            "num_key_value_heads": s.num_query_groups,
            "vocab_size": s.vocab_size,
        }
        if s.num_experts:  # each expert's MLP is split over the tensor-parallel ranks as the dense one
            sizes["moe_intermediate_size"] = int(self.hf_config.moe_intermediate_size)
        if ep > 1 and not s.num_experts:
            raise ValueError(
                f"{self.model_path}: megatron_expert_parallel_size ({ep}) needs an MoE model and this one has no "
                "experts; set it to 1"
            )
        if s.num_experts % ep:
            raise ValueError(
                f"{self.model_path}: num_experts ({s.num_experts}) not divisible by megatron_expert_parallel_size "
                f"({ep}); choose an expert-parallel size that divides it"
            )
        bad = [f"{k} ({v})" for k, v in sizes.items() if v % tp]
        if bad:
            raise ValueError(
                f"{self.model_path}: {', '.join(bad)} not divisible by megatron_tensor_parallel_size ({tp}); "
                "choose a tensor-parallel size that divides them"
            )
        if s.num_layers % pp:
            raise ValueError(
                f"{self.model_path}: num_hidden_layers ({s.num_layers}) not divisible by "
                f"megatron_pipeline_parallel_size ({pp}); choose a pipeline size that divides it"
            )

    def _hf_parameter_shapes(self) -> dict[str, torch.Size]:
        """The Hugging Face model's parameter names and shapes in its own order (built on the meta device)."""
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            reference = AutoModelForCausalLM.from_config(self.hf_config)
        return {name: param.shape for name, param in reference.named_parameters()}

    # ------------------------------------------------------ parallelism hooks

    def logits(self, mb: MicroBatch) -> torch.Tensor:
        return packed_logits(self.model, mb.input_ids, mb.position_ids, self.shape.padding_idx)

    def forward_backward_minibatch(
        self,
        sequences: list[PackedSequence],
        loss: MinibatchLoss,
        timers: SectionTimers,
        minibatch: int = 0,
        first_microbatch: int = 0,
    ) -> list[dict[str, float]]:
        """Pipeline parallel: the minibatch through megatron-core's schedule, the loss on the last stage."""
        if self.pp_size == 1:
            return super().forward_backward_minibatch(sequences, loss, timers, minibatch, first_microbatch)
        with timers.section("data_to_device", minibatch=minibatch):
            batches = [MicroBatch.from_packed(seq, self.device) for seq in sequences]
        index = {id(mb): i for i, mb in enumerate(batches)}

        def stage_loss(mb: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
            value, sums = loss.compute(index[id(mb)], mb, logits)
            # summed over data-parallel ranks, averaged in clip_and_step (as the base loop does); float16: scaled
            return value * (self.averaging_ranks() * self.loss_scale()), [sums[k] for k in loss.keys]

        with timers.section("forward_backward", minibatch=minibatch):
            self.grad_reducer.arm(backwards=len(batches))  # overlap: a parameter is done after its last micro-batch
            rows = run_schedule(self.model, batches, self.logits, stage_loss)
        rows = share_from_last_stage(rows, len(batches), len(loss.keys), self.device)
        return [dict(zip(loss.keys, row, strict=True)) for row in rows]

    @torch.no_grad()
    def reference_logprobs(self, local: list[list[PackedSequence]], timers: SectionTimers) -> list[list[torch.Tensor]]:
        """Pipeline parallel: forward-only schedule; the log-probabilities live on the last stage (empty elsewhere)."""
        if self.pp_size == 1:
            return super().reference_logprobs(local, timers)
        temperature = self.context.temperature

        def logprobs(mb: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            values = token_logprobs(logits, mb.target_ids, temperature).detach()
            return values.new_zeros(()), values

        out = []
        for m, sequences in enumerate(local):
            batches = [MicroBatch.from_packed(seq, self.device) for seq in sequences]
            with timers.section("forward", minibatch=m, reference=True):
                values = run_schedule(self.model, batches, self.logits, logprobs, forward_only=True)
            out.append(values or [torch.empty(0, device=self.device) for _ in batches])
        return out

    def averaging_ranks(self) -> int:
        """:meth:`clip_and_step` sums over the context-parallel group and averages over the data-parallel one."""
        return self.world_size

    def clip_and_step(self, optimizer: torch.optim.Optimizer) -> float:
        """Average gradients over data-parallel ranks, clip by the global norm, step unless it is non-finite.

        The accumulated gradients (:class:`~telescope_megatron.precision.MainParameters`'
        buffers) are reduced (the data- and context-parallel sums in buckets,
        :mod:`telescope_megatron.grad_buckets`; the tensor-parallel and tied-embedding sums
        per parameter), then become the main gradients (divided by the loss scale under
        float16), which the norm, the clipping and the optimizer read; after a step the main
        parameters are copied into the model's. A non-finite norm skips the step (and, under
        float16, counts towards lowering the loss scale).

        MoE: an expert's weights live on one expert-parallel rank of each expert-data-parallel
        group, and their gradient already holds the tokens that every expert-parallel rank sent
        them; it is summed over the expert-data-parallel group (the ranks holding the same
        experts, context-parallel ranks included) and divided by the same data-parallel size as
        the other weights. In the norm each expert shard counts once: its squares are summed
        over the expert tensor x expert x pipeline-parallel group.
        """
        from megatron.core import parallel_state

        self.grad_reducer.finish()  # the data- (and context-) parallel sums, bucketed; experts' over expert DP
        self._sum_tensor_parallel_partial_grads(
            [(n, g) for n in self._params if not is_expert_parameter(n) and (g := self.main.accumulated(n)) is not None]
        )
        self._sum_tied_embedding_grads()
        grads = self.main.main_grads(self.loss_scale())
        squares = torch.zeros((), dtype=torch.float32, device=self.device)
        for name, grad in grads.items():
            # replicated weights (the norms) counted on one tensor-parallel rank, a tied embedding on one stage
            if is_expert_parameter(name) or name == self._tied_copy:
                continue
            if partition_dim(name) is not None or self.tp_rank == 0:
                squares += grad.detach().float().pow(2).sum()
        if self.tp_size * self.pp_size > 1:
            dist.all_reduce(squares, group=parallel_state.get_model_parallel_group())
        if any(is_expert_parameter(n) for n in grads):
            squares = squares + expert_gradient_squares([g for n, g in grads.items() if is_expert_parameter(n)])
        total = squares.sqrt()
        coefficient = torch.clamp(self.context.grad_clip / (total + 1e-6), max=1.0)  # as clip_grad_norm_
        for grad in grads.values():
            grad.mul_(coefficient.to(grad.dtype))
        norm = float(total)
        if math.isfinite(norm):
            optimizer.step()
            self.main.copy_to_model()
        if self.loss_scaler is not None:
            self.loss_scaler.update(found_inf=not math.isfinite(norm))
        optimizer.zero_grad(set_to_none=True)
        self.main.zero_grad()
        return norm

    def loss_scale(self) -> float:
        """float16: the dynamic loss scale (:mod:`telescope_megatron.loss_scaling`); else 1."""
        return self.loss_scaler.scale if self.loss_scaler is not None else 1.0

    def optimizer_metrics(self) -> dict[str, float]:
        """float16: ``optimizer/loss_scale``, the scale after the step (the next step's)."""
        return {"optimizer/loss_scale": self.loss_scaler.scale} if self.loss_scaler is not None else {}

    def zero_grad(self) -> None:
        self.grad_reducer.discard()
        self.optimizer.zero_grad(set_to_none=True)
        self.main.zero_grad()

    def set_gradient_sync(self, enabled: bool) -> None:
        """``megatron_overlap_grad_reduce``: the last micro-batch's backward launches the buckets' reductions."""
        if enabled:
            self.grad_reducer.arm()
        else:
            self.grad_reducer.disarm()

    def _sum_tensor_parallel_partial_grads(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Sum over the tensor-parallel ranks the gradients of replicated weights that each rank sees in part.

        The q/k norms (Qwen3) are shared by all heads, and each rank holds some of the heads;
        under sequence parallelism the layer norms see this rank's slice of the sequence only
        (megatron-core marks them ``sequence_parallel``). As megatron-core's ``finalize_model_grads``.
        """
        if self.tp_size == 1:
            return
        sequence_parallel = self.model.config.sequence_parallel
        for name, grad in named:
            qk_norm = name.endswith(("q_layernorm.weight", "k_layernorm.weight"))
            if qk_norm or (sequence_parallel and getattr(self._params[name], "sequence_parallel", False)):
                dist.all_reduce(grad, group=self.tp_group)

    def step_scope(self) -> contextlib.AbstractContextManager[None]:
        """Sequence/context/expert parallel on the CPU: megatron-core's gathers and all-to-all allocate on CUDA."""
        if self.device.type == "cpu" and (self.model.config.sequence_parallel or self.cp_size > 1 or self.ep_size > 1):
            return cuda_free()
        return contextlib.nullcontext()

    def _sum_tied_embedding_grads(self) -> None:
        """PP with tied embeddings: the first stage's embedding and the last stage's copy get their gradients' sum."""
        from megatron.core import parallel_state

        if not (self.shape.tied_embeddings and self.pp_size > 1 and parallel_state.is_rank_in_embedding_group()):
            return
        grad = self.main.zero_accumulated(self._tied_copy or "embedding.word_embeddings.weight")
        dist.all_reduce(grad, group=parallel_state.get_embedding_group())

    # --------------------------------------------------------------- weights

    @property
    def weights_dtype(self) -> torch.dtype:
        """The dtype of the weights sent to inference and checkpoints: ``model_dtype`` (as the FSDP backend's)."""
        return DTYPES[self.context.model_dtype]

    def _full_tensor(self, name: str) -> torch.Tensor:
        """The full main parameter ``name`` in :attr:`weights_dtype` (gathered over the tensor- and expert-parallel
        groups). Collective."""
        return self._gathered(name, lambda param: self.main.params[param].detach().to(self.weights_dtype))

    def _gathered(self, name: str, local_of: Callable[[str], torch.Tensor]) -> torch.Tensor:
        """The full tensor ``name`` from each rank's ``local_of(parameter)``; a layer's stacked experts: every rank's.

        Stacked experts (:func:`~telescope_megatron.convert.expert_of`): this rank's experts,
        each gathered over the tensor-parallel group, stacked, then all-gathered over the
        expert-parallel group (rank ``r`` holds the ``r``-th run of consecutive experts).
        """
        members = self._expert_members.get(name)
        if members is None:
            return self._tensor_parallel_full(name, local_of(name))
        return gather_experts(torch.stack([self._tensor_parallel_full(m, local_of(m)) for m in members]))

    def _tensor_parallel_full(self, name: str, local: torch.Tensor) -> torch.Tensor:
        """One parameter's full tensor from this rank's shard (all-gathered over the tensor-parallel group if split)."""
        if self.tp_size == 1 or partition_dim(name) is None:
            return local
        parts = [torch.empty_like(local) for _ in range(self.tp_size)]
        dist.all_gather(parts, local.contiguous(), group=self.tp_group)
        return unshard(name, parts)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in Hugging Face names and order, one weight gathered at a time. Collective.

        The main parameters (the master weights) cast to ``model_dtype``: what the FSDP backend
        sends (see :mod:`telescope_megatron.precision`).
        """
        yield from self._hf_stream(self._full_tensor)

    def stage_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """This pipeline stage's full weights in Hugging Face names and order, one gathered at a time (over the
        tensor- and expert-parallel groups, which lie within the stage). Collective over the stage's ranks."""
        yield from self._hf_stream(self._full_tensor, all_stages=False)

    def _hf_stream(
        self, full_tensor: Callable[[str], torch.Tensor], *, all_stages: bool = True
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Every Hugging Face tensor in order from ``full_tensor(megatron name)`` (this stage's, then with
        ``all_stages`` every stage's)."""
        own: dict[str, None] = {}  # this stage's megatron tensors in order, one stacked name for a layer's experts
        for name in self._params:
            expert = expert_of(name)
            if name != self._tied_copy:
                own[expert[0] if expert else name] = None
        mine = [name for name in self.hf_order if self.hf_owners[name] == self.pp_rank]
        local = stream_hf_weights(list(own), full_tensor, self.shape, mine)
        if self.pp_size == 1 or not all_stages:
            yield from local
            return
        yield from gather_stages(local, self.hf_shapes, self.hf_owners, self.weights_dtype, self.device)

    # ----------------------------------------------------------- checkpoints

    def save_checkpoint(self, path: Path, *, training_state: bool = True) -> None:
        """Hugging Face weights + config (+ tokenizer), and per-rank optimizer shards. Collective."""
        save_megatron_checkpoint(self, path, training_state=training_state)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore weights (any layout), and optimizer/scheduler/RNG/step (same layout only). Collective."""
        return load_megatron_checkpoint(self, path)

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Full gradients in Hugging Face names (collective); zeros where none accumulated.

        Inside :meth:`clip_and_step` (once reduced, clipped) the main gradients the optimizer
        applies; before it, the accumulated ones divided by the loss scale.
        """
        grads = {}
        for name, param in self._params.items():
            grad = self.main.main_grad(name)
            if grad is None:
                grad = self.main.accumulated(name)
                grad = grad.float() / self.loss_scale() if grad is not None else None
            grads[name] = grad.detach() if grad is not None else torch.zeros_like(param)

        def full(name: str) -> torch.Tensor:
            return self._gathered(name, grads.__getitem__)

        return {n: t.float().cpu().clone() for n, t in self._hf_stream(full)}

    def close(self) -> None:
        from megatron.core import parallel_state

        if hasattr(self, "grad_reducer"):  # waits for any reduction in flight: before the groups go
            self.grad_reducer.close()
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        if hasattr(self, "main"):
            self.main.close()
        super().close()
