"""The ``fsdp`` trainer backend: a Hugging Face causal LM sharded with FSDP2 ``fully_shard``.

One instance per rank. ``setup`` joins the process group (gloo on CPU, NCCL on
CUDA), loads ``AutoModelForCausalLM`` from a local folder, ``tiny:<preset>`` or a
hub id, optionally enables gradient checkpointing, shards every decoder layer and
then the root with ``fully_shard``, builds AdamW and the LR schedule, and (with
``trainer_prewarm``) runs one forward and backward on a synthetic row
(:mod:`telescope.trainer.prewarm`) so the first step is not the slowest. One rank
with no dtype cast to make keeps the plain module: FSDP there would only add
DTensor dispatch to every optimizer op, hooks and parameter copies to every layer
(17% of a CPU step of the ``small`` model, and 0.5 s of first-step set-up), and the
same code path runs either way (``full_tensor`` and the state-dict API take both).

``train_step(batch)`` — every rank receives the *same* full :class:`TrainingBatch`:

1. The samples are split by group into ``number_of_minibatches`` minibatches; each
   is packed first-fit-decreasing into sequences of ``seq_len`` tokens, and the
   sequences are dealt to ranks balancing tokens. One packed sequence is one
   micro-batch; a rank with fewer sequences runs padding-only micro-batches so the
   FSDP collectives stay in step.
2. With a ratio reference ``batch`` (``Algorithm.uses_batch_reference``:
   ``ppo_clip_ref_logprobs: batch`` and a loss that uses a ratio), the trainer's
   own log-probabilities of every minibatch are computed without gradient before
   the first optimizer step; they are the ratio's reference and, with ``use_tis``,
   the ``pi_old`` of the TIS weight ``pi_old / pi_inf``.
3. For each minibatch the global counts (loss tokens, samples) are all-reduced
   *before* any backward; each micro-batch's loss is ``sum(loss_terms) /
   algorithm.loss_denominator(counts)``, so the accumulated gradient is that of the
   minibatch objective whatever the split into micro-batches and ranks. With
   ``entropy_coef > 0`` the per-position entropy is computed with gradient
   (:func:`~telescope.trainer.logprobs.token_entropy`, chunked) for the entropy
   bonus; the shared loss controls report ``loss/kl_penalty``,
   ``loss/entropy_bonus`` and ``seq_is/masked_sequences`` when enabled.
4. Gradients are clipped to ``grad_clip``; a non-finite norm skips the optimizer
   step (counted in ``optimizer/skipped_steps``). The LR schedule advances once per
   trainer step.

Timeline: with ``track_gpu_events`` each section of a step (``data_to_device``,
``forward``, ``loss_computation``, ``backward``, ``optimizer``, ...) is also a record
with its ``minibatch`` and ``microbatch`` (CUDA events on a GPU, see
:mod:`telescope.trainer.metrics`), plus one ``trainer.step`` (and one
``trainer.prewarm`` from set-up); :meth:`FSDPBackend.drain_events`
hands them over.

Attention: ``flash_attention_2`` when the ``flash_attn`` package is installed and
the model runs on CUDA (transformers then uses the varlen kernel from the packed
``position_ids``), else :mod:`telescope.trainer.packed_attention` (SDPA per
document, batched by length) for plain causal models and ``sdpa`` with
transformers' block-diagonal mask for the rest; all keep attention inside each
sample because the model is called with per-sample ``position_ids``, no attention
mask and ``use_cache=False``.

Context parallelism (``fsdp_context_parallel_size`` > 1): see
:mod:`telescope.trainer.context_parallel`. ``self.rank``/``self.world_size`` are the
data-parallel rank and size (rows dealt, counts and metrics summed over them); FSDP
shards over all ranks and its reduce-scatter also sums the CP ranks' partial gradients.

Limits: no tensor or pipeline parallelism (that is the Megatron backend);
checkpoints gather full state on rank 0 (see :mod:`telescope.trainer.checkpoint`).
"""

from __future__ import annotations

import importlib.util
import math
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from telescope.api.algorithm import LossCounts, LossInputs
from telescope.api.records import SupervisedExample, TrainingBatch, TrainingSample
from telescope.api.trainer import TrainerBackend
from telescope.trainer.context_parallel import ContextParallelLayout, register_attention, sharded_logits
from telescope.trainer.distributed import (
    all_reduce_sum,
    destroy_process_group,
    full_tensor,
    init_process_group,
    resolve_device,
)
from telescope.trainer.logprobs import chunked_entropy, inference_kl_k3, token_entropy, token_logprobs
from telescope.trainer.metrics import LOSS_PART_KEYS, SectionTimers, loss_parts
from telescope.trainer.microbatch import MicroBatch
from telescope.trainer.packed_attention import DOCUMENTS_KWARG, register_packed_attention
from telescope.trainer.packed_attention import supports as packed_attention_supports
from telescope.trainer.packing import (
    PackedBatch,
    PackedSequence,
    assign_to_ranks,
    empty_sequence,
    pack_samples,
    split_minibatches,
)
from telescope.trainer.plugin import FSDPSettings
from telescope.trainer.prefix_sharing import pack_with_shared_prefixes
from telescope.trainer.prewarm import prewarm
from telescope.trainer.schedule import build_lr_scheduler

if TYPE_CHECKING:
    from telescope.api.algorithm import Algorithm
    from telescope.api.context import TrainerContext

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class FSDPBackend(TrainerBackend):
    """Hugging Face model + FSDP2 data parallelism, CPU (gloo) or CUDA (NCCL)."""

    name = "fsdp"
    #: Whether RL steps pack each group's prompt once (:mod:`telescope.trainer.prefix_sharing`): set
    #: when the model runs :mod:`telescope.trainer.packed_attention`, the one attention that reads it.
    _shares_prefixes = False

    def __init__(self, context: TrainerContext, algorithm: Algorithm, settings: FSDPSettings | None = None) -> None:
        super().__init__(context, algorithm, settings)
        self.fsdp = settings or FSDPSettings()
        self.step = 0
        self.rank = self.global_rank = 0
        self.world_size = self.global_world_size = 1
        self.layout = ContextParallelLayout()
        self._owns_process_group = False
        self._sharded = False
        self.model: Any = None
        self.model_path = ""
        self._supervised_optimizer: torch.optim.Optimizer | None = None
        self._events: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ setup

    def setup(self, rank: int = 0, world_size: int = 1, device: str | None = None) -> None:
        """Join the process group, load and shard the model, build AdamW and the LR schedule.

        ``device``: ``"cpu"``, ``"cuda"`` or None (CUDA when available).
        """
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from telescope.models.tiny import resolve_model_path

        self.global_rank, self.global_world_size = rank, world_size
        self.device = resolve_device(device, rank)
        self._owns_process_group = init_process_group(rank, world_size, self.device)
        self.layout = ContextParallelLayout.build(rank, world_size, self.fsdp.fsdp_context_parallel_size, self.device)
        self.rank, self.world_size = self.layout.dp_rank, self.layout.dp_size
        torch.manual_seed(self.context.seed)
        self.model_path = resolve_model_path(self.context.model)
        self.model = self._load_model()
        if self.fsdp.gradient_checkpointing:
            self._enable_activation_checkpointing()
        mp_dtype = self.fsdp.mixed_precision_dtype
        policy = MixedPrecisionPolicy(
            param_dtype=DTYPES[mp_dtype] if mp_dtype else None,
            reduce_dtype=torch.float32 if mp_dtype else None,
        )
        self._sharded = self._needs_fsdp()
        if self._sharded:
            for layer in self._decoder_layers():
                fully_shard(layer, mp_policy=policy)
            fully_shard(self.model, mp_policy=policy)
        self.model.train()
        self.optimizer: torch.optim.Optimizer = torch.optim.AdamW(  # a subclass may shard it (telescope-megatron)
            self.model.parameters(),
            lr=self.context.learning_rate,
            weight_decay=self.context.weight_decay,
            foreach=True,
        )
        self.scheduler = build_lr_scheduler(
            self.optimizer,
            self.context.lr_scheduler,
            self.context.warmup_steps,
            self.context.number_of_steps,
            self.context.min_lr_ratio,
        )
        model_config = self.model.config
        pad = model_config.pad_token_id if model_config.pad_token_id is not None else model_config.eos_token_id
        self.pad_token_id = int(pad if isinstance(pad, int) else 0)
        if self.fsdp.trainer_prewarm:
            vocab = int(self.model.get_input_embeddings().num_embeddings)
            record = prewarm(self.model, self._logits, self.context.seq_len, vocab, self.device)
            if self.context.track_gpu_events:
                self._events.append(record)

    def _needs_fsdp(self) -> bool:
        """Whether the model is wrapped with ``fully_shard``: several ranks, or a mixed-precision cast to make."""
        if self.global_world_size > 1:
            return True
        cast = self.fsdp.mixed_precision_dtype
        return cast is not None and DTYPES[cast] != DTYPES[self.context.model_dtype]

    def _enable_activation_checkpointing(self) -> None:
        """Non-reentrant recomputation of each decoder layer (the transformers API; renamed in v5.2x)."""
        kwargs = {"use_reentrant": False}
        if hasattr(self.model, "activation_checkpointing_enable"):
            self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

    def _attn_implementation(self, config: Any) -> str:
        if self.layout.cp_size > 1:
            return register_attention()
        if self.device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
        if packed_attention_supports(config):
            self._shares_prefixes = self.fsdp.share_prompt_prefixes
            return register_packed_attention()
        return "sdpa"

    def _load_model(self) -> Any:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(self.model_path)
        with torch.device(self.device):
            model = AutoModelForCausalLM.from_pretrained(
                self.model_path,
                config=config,
                dtype=DTYPES[self.context.model_dtype],
                attn_implementation=self._attn_implementation(config),
            )
        return model.to(self.device)  # type: ignore[arg-type]

    def _decoder_layers(self) -> list[torch.nn.Module]:
        base = getattr(self.model, "model", None)
        layers = getattr(base, "layers", None)
        if layers is None:
            raise TypeError(
                f"{type(self.model).__name__} has no .model.layers; the fsdp backend shards "
                "decoder-only Hugging Face models (Llama/Qwen/Mistral layout)"
            )
        return list(layers)

    # -------------------------------------------------------------- one step

    def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One rollout batch: ``number_of_minibatches`` optimizer steps; returns reduced metrics."""
        step_start, step_wall = time.perf_counter(), time.time()
        timers = SectionTimers(self.device, record_events=self.context.track_gpu_events)
        with timers.section("prepare_tensors"):
            minibatches = split_minibatches(batch.samples, self.context.number_of_minibatches)
            packed = [self._pack(mb, share_prefixes=self._shares_prefixes) for mb in minibatches]
            local = [self._local_sequences(p) for p in packed]
        ref_logprobs = self._reference_logprobs(local, timers) if self._needs_batch_reference() else None

        learning_rate = float(self.optimizer.param_groups[0]["lr"])
        sums = dict.fromkeys(("loss", "entropy", "kl", "tokens", *LOSS_PART_KEYS), 0.0)
        grad_norms: list[float] = []
        skipped = optimizer_steps = micro_count = 0
        for m, sequences in enumerate(local):
            counts = self._global_counts(sequences)
            if counts.loss_tokens == 0 and counts.samples == 0:
                continue
            denominator = self.algorithm.loss_denominator(counts)
            refs = ref_logprobs[m] if ref_logprobs is not None else None
            for part in self._forward_backward_minibatch(sequences, refs, denominator, timers, m, micro_count):
                for key in sums:
                    sums[key] += part[key]
                micro_count += 1
            with timers.section("optimizer", minibatch=m):
                norm = self._optimizer_step()
            optimizer_steps += 1
            if math.isfinite(norm):
                grad_norms.append(norm)
            else:
                skipped += 1
        with warnings.catch_warnings():  # a skipped (non-finite) optimizer step still advances the schedule
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()
        self.step += 1
        self._supervised_optimizer = None  # RL has begun: the warm start's optimizer state is not needed

        packing_stats = [
            sum(p.num_real_tokens for p in packed),
            sum(p.num_padded_tokens for p in packed),
            sum(p.truncated_samples for p in packed),
            sum(len(p.sequences) for p in packed),
            sum(s.shared_tokens for p in packed for s in p.sequences),
        ]
        timing = timers.metrics(micro_count)
        parts = len(LOSS_PART_KEYS)
        local_values = [sums["loss"], sums["entropy"], sums["kl"], sums["tokens"]]
        local_values += [sums[k] for k in LOSS_PART_KEYS] + list(timing.values())
        reduced = self._all_reduce_sum(local_values)
        loss_sum, entropy_sum, kl_sum, tokens = reduced[:4]
        part_sums = dict(zip(LOSS_PART_KEYS, reduced[4 : 4 + parts], strict=True))
        timing_mean = [v / self.world_size for v in reduced[4 + parts :]]
        step_time = time.perf_counter() - step_start
        metrics: dict[str, float] = {
            "loss": loss_sum / max(optimizer_steps, 1),
            "entropy": entropy_sum / max(tokens, 1.0),
            "kl_divergence_inference": kl_sum / max(tokens, 1.0),
            "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else 0.0,
            "learning_rate": learning_rate,
            "optimizer/skipped_steps": float(skipped),
            "optimizer/steps": float(optimizer_steps - skipped),
            "train/loss_tokens": tokens,
            "train/samples": float(len(batch.samples)),
            "packing/efficiency": packing_stats[0] / max(packing_stats[1], 1),
            "packing/sequences": float(packing_stats[3]),
            "packing/truncated_samples": float(packing_stats[2]),
            "packing/shared_prefix_tokens": float(packing_stats[4]),
            "throughput/tokens_per_second": packing_stats[0] / max(step_time, 1e-9),
            "timing_trainer_step_total": step_time,
        }
        metrics.update(self._loss_part_metrics(part_sums, optimizer_steps))
        metrics.update(zip(timing.keys(), timing_mean, strict=True))
        if timers.record_events:
            self._events.extend(timers.records)
            self._events.append(
                {
                    "kind": "trainer.step",
                    "start": step_wall,
                    "duration_s": step_time,
                    "clock": "wall",
                    "microbatches": micro_count,
                    "optimizer_steps": optimizer_steps,
                }
            )
        return metrics

    def _loss_part_metrics(self, part_sums: dict[str, float], optimizer_steps: int) -> dict[str, float]:
        """The enabled shared loss controls' metrics (see ``LOSS_PART_KEYS``)."""
        config = self.algorithm.config
        out: dict[str, float] = {}
        if config.kl_penalty_tau > 0:
            out["loss/kl_penalty"] = part_sums["loss/kl_penalty"] / max(optimizer_steps, 1)
        if config.entropy_coef > 0:
            out["loss/entropy_bonus"] = part_sums["loss/entropy_bonus"] / max(optimizer_steps, 1)
        if config.seq_is_masking:
            out["seq_is/masked_sequences"] = part_sums["seq_is/masked_sequences"]
        return out

    def drain_events(self) -> list[dict[str, Any]]:
        """This rank's timeline records since the last call (see :class:`~telescope.trainer.metrics.SectionTimers`)."""
        events, self._events = self._events, []
        return events

    def supervised_step(self, examples: list[SupervisedExample], learning_rate: float) -> dict[str, float]:
        """Cross-entropy on the completion tokens, normalised by the global token count (see the interface).

        The examples are packed like RL samples; the loss of a micro-batch is
        ``-sum(log p(target)) / global loss tokens`` at temperature 1, so the
        gradient is that of the mean token cross-entropy over the whole batch.
        """
        if self._supervised_optimizer is None:
            self._supervised_optimizer = torch.optim.AdamW(self.model.parameters(), lr=learning_rate, weight_decay=0.0)
        optimizer = self._supervised_optimizer
        for group in optimizer.param_groups:
            group["lr"] = learning_rate
        sequences = self._local_sequences(self._pack([e.as_training_sample() for e in examples]))
        counts = self._global_counts(sequences)
        denominator = float(max(counts.loss_tokens, 1))
        loss_sum = 0.0
        for i, seq in enumerate(sequences):
            mb = MicroBatch.from_packed(seq, self.device)
            self._set_gradient_sync(i == len(sequences) - 1)
            logprobs = token_logprobs(self._logits(mb), mb.target_ids, 1.0)
            loss = -torch.where(mb.loss_mask, logprobs, torch.zeros_like(logprobs)).sum() / denominator
            (loss * self._averaging_ranks()).backward()  # the reduction averages over ranks; the denominator is global
            loss_sum += float(loss.detach())
        norm = self._clip_and_step(optimizer)
        (total_loss,) = self._all_reduce_sum([loss_sum])
        return {"loss": total_loss, "grad_norm": norm, "tokens": float(counts.loss_tokens)}

    def _pack(self, samples: list[TrainingSample], share_prefixes: bool = False) -> PackedBatch:
        if share_prefixes:
            return pack_with_shared_prefixes(
                samples, self.context.seq_len, self.context.pad_to_multiple_of, self.pad_token_id
            )
        return pack_samples(
            samples, self.context.seq_len, self.context.pad_to_multiple_of, self.pad_token_id, overflow="truncate"
        )

    def _local_sequences(self, packed: PackedBatch) -> list[PackedSequence]:
        """This rank's sequences of a minibatch, padded with empty ones to the busiest rank's count."""
        assignment = assign_to_ranks(packed.sequences, self.world_size)
        mine = [packed.sequences[i] for i in assignment[self.rank]]
        busiest = max(len(a) for a in assignment)
        if busiest == 0:
            return []
        filler = empty_sequence(self.context.pad_to_multiple_of, self.pad_token_id)
        return mine + [filler] * (busiest - len(mine))

    def _global_counts(self, sequences: list[PackedSequence]) -> LossCounts:
        local_tokens = sum(s.num_loss_tokens for s in sequences)
        local_samples = sum(sum(1 for n in s.sample_loss_tokens if n > 0) for s in sequences)
        tokens, samples = self._all_reduce_sum([local_tokens, local_samples])
        return LossCounts(loss_tokens=int(tokens), samples=int(samples))

    def _needs_batch_reference(self) -> bool:
        return self.algorithm.uses_batch_reference

    @torch.no_grad()
    def _reference_logprobs(self, local: list[list[PackedSequence]], timers: SectionTimers) -> list[list[torch.Tensor]]:
        """The trainer's log-probabilities of every micro-batch, before any optimizer step."""
        out: list[list[torch.Tensor]] = []
        for m, sequences in enumerate(local):
            row: list[torch.Tensor] = []
            for i, seq in enumerate(sequences):
                ids = {"minibatch": m, "microbatch": i, "reference": True}
                with timers.section("data_to_device", **ids):
                    mb = MicroBatch.from_packed(seq, self.device)
                with timers.section("forward", **ids):
                    logits = self._logits(mb)
                row.append(token_logprobs(logits, mb.target_ids, self.context.temperature).detach())
            out.append(row)
        return out

    def _logits(self, mb: MicroBatch) -> torch.Tensor:
        if self.layout.cp_size > 1:
            return sharded_logits(self.model, mb.input_ids, mb.position_ids, self.layout, self.pad_token_id)
        shared = {} if mb.documents is None else {DOCUMENTS_KWARG: mb.documents}
        output = self.model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False, **shared)
        logits: torch.Tensor = output.logits[0]
        return logits

    def _forward_backward(
        self,
        seq: PackedSequence,
        ref_logprobs: torch.Tensor | None,
        denominator: float,
        timers: SectionTimers,
        *,
        last: bool = True,
        **ids: int,
    ) -> dict[str, float]:
        """Forward, loss and backward of one micro-batch; returns its local sums.

        ``ids`` (``minibatch``, ``microbatch``) label the micro-batch's timeline records.
        """
        with timers.section("data_to_device", **ids):
            mb = MicroBatch.from_packed(seq, self.device)
        self._set_gradient_sync(last)
        with timers.section("forward", **ids):
            logits = self._logits(mb)
        loss, sums = self._micro_loss(mb, logits, ref_logprobs, denominator, timers, **ids)
        with timers.section("backward", **ids):
            # Each rank's loss is already divided by the *global* denominator, so the
            # gradients must be summed over ranks (context-parallel ranks hold parts of one
            # gradient); the reduction averages them, hence the factor.
            (loss * self._averaging_ranks()).backward()
        return sums

    def _forward_backward_minibatch(
        self,
        sequences: list[PackedSequence],
        ref_logprobs: list[torch.Tensor] | None,
        denominator: float,
        timers: SectionTimers,
        minibatch: int = 0,
        first_microbatch: int = 0,
    ) -> list[dict[str, float]]:
        """Forward/backward of every micro-batch of one minibatch, in order; their local sums.

        One micro-batch at a time here; a backend that runs micro-batches through a
        schedule of its own (pipeline parallelism) overrides this.
        """
        parts = []
        for i, seq in enumerate(sequences):
            ref = ref_logprobs[i] if ref_logprobs is not None else None
            last = i == len(sequences) - 1
            ids = {"minibatch": minibatch, "microbatch": first_microbatch + i}
            parts.append(self._forward_backward(seq, ref, denominator, timers, last=last, **ids))
        return parts

    def _micro_loss(
        self,
        mb: MicroBatch,
        logits: torch.Tensor,
        ref_logprobs: torch.Tensor | None,
        denominator: float,
        timers: SectionTimers,
        **ids: int,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The algorithm's loss of one micro-batch (``sum(loss_terms) / denominator``) and its local sums."""
        with timers.section("loss_computation", **ids):
            logprobs = token_logprobs(logits, mb.target_ids, self.context.temperature)
            grad_entropy = (
                token_entropy(logits, self.context.temperature, self.context.entropy_chunk_size)
                if self.algorithm.needs_entropy
                else None
            )
            inputs = LossInputs(
                logprobs=logprobs,
                ref_logprobs=ref_logprobs if ref_logprobs is not None else mb.inference_logprobs,
                inference_logprobs=mb.inference_logprobs,
                advantages=mb.advantages,
                loss_mask=mb.loss_mask,
                sequence_ids=mb.sequence_ids,
                sequence_lengths=mb.sequence_lengths,
                entropy=grad_entropy,
            )
            loss = self.algorithm.loss_terms(inputs).sum() / denominator
            parts = loss_parts(self.algorithm.loss_metrics(inputs), denominator)
        mask = mb.loss_mask
        with timers.section("compute_entropy", **ids):
            if grad_entropy is not None:
                entropy = grad_entropy.detach()
            else:
                entropy = chunked_entropy(logits.detach(), self.context.temperature, self.context.entropy_chunk_size)
            entropy_sum = float(entropy[mask].sum())
        with timers.section("compute_kl", **ids):
            kl_sum = float(inference_kl_k3(logprobs, mb.inference_logprobs)[mask].sum())
        return loss, {
            "loss": float(loss.detach()),
            "entropy": entropy_sum,
            "kl": kl_sum,
            "tokens": float(mb.num_loss_tokens),
            **parts,
        }

    def _optimizer_step(self) -> float:
        """Clip, step unless the norm is non-finite, zero the gradients; returns the pre-clip norm."""
        return self._clip_and_step(self.optimizer)

    # ------------------------------------------- parallelism hooks (subclasses)
    # The step logic above is shared with backends that parallelise the model
    # differently (telescope-megatron): they override these hooks (and, to run
    # micro-batches through a pipeline schedule, ``_forward_backward_minibatch``). Here
    # ``self.rank``/``self.world_size`` are the data-parallel rank and size.

    def _averaging_ranks(self) -> int:
        """The number of ranks the gradient reduction averages over; each loss is scaled by it so the reduction sums.

        FSDP's reduce-scatter averages over every rank, data- and context-parallel
        (``set_gradient_divide_factor(1)`` would need PREMUL_SUM, which gloo lacks).
        """
        return self.global_world_size

    def _all_reduce_sum(self, values: list[float] | list[int]) -> list[float]:
        """Sum per-rank values over the data-parallel ranks (context-parallel ranks hold the same values)."""
        return all_reduce_sum(values, self.device, self.layout.dp_group)

    def _set_gradient_sync(self, enabled: bool) -> None:
        """Whether the next backward reduces gradients across ranks (FSDP: only on the last micro-batch)."""
        if self._sharded:
            self.model.set_requires_gradient_sync(enabled)

    def _clip_and_step(self, optimizer: torch.optim.Optimizer) -> float:
        """Clip to ``grad_clip``, step unless the norm is non-finite, zero the gradients; returns the norm."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = float(full_tensor(torch.nn.utils.clip_grad_norm_(params, self.context.grad_clip, foreach=True)))
        if math.isfinite(norm):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm

    # --------------------------------------------- gradients (tests, tools)

    def accumulate_gradients(self, samples: list[TrainingSample]) -> LossCounts:
        """Forward/backward of ``samples`` as one minibatch, leaving the gradients in place (no step).

        For tests and tools that inspect the gradient (:meth:`full_gradients`);
        ``train_step`` is the training entry point.
        """
        timers = SectionTimers(self.device)
        sequences = self._local_sequences(self._pack(samples, share_prefixes=self._shares_prefixes))
        counts = self._global_counts(sequences)
        denominator = self.algorithm.loss_denominator(counts)
        refs = self._reference_logprobs([sequences], timers)[0] if self._needs_batch_reference() else None
        self._forward_backward_minibatch(sequences, refs, denominator, timers)
        return counts

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Unsharded gradients by parameter name (collective); zeros where none accumulated.

        Copies: on one rank ``full_tensor()`` can share storage with the gradient, which
        the optimizer step then clips and zeroes in place.
        """
        out: dict[str, torch.Tensor] = {}
        for name, param in self.model.named_parameters():
            grad = param.grad if param.grad is not None else torch.zeros_like(param)
            out[name] = full_tensor(grad).detach().float().cpu().clone()
        return out

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    # --------------------------------------------------------------- weights

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in Hugging Face names, each shared (tied) tensor once. Collective: iterate on every rank."""
        for name, param in self.model.named_parameters():
            yield name, full_tensor(param.detach())

    # ----------------------------------------------------------- checkpoints

    def save_checkpoint(self, path: Path, *, training_state: bool = True) -> None:
        """Write a checkpoint folder atomically (collective: call on every rank); see :mod:`.fsdp_checkpoint`."""
        from telescope.trainer.fsdp_checkpoint import save_fsdp_checkpoint

        save_fsdp_checkpoint(self, Path(path), training_state=training_state)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore a checkpoint (collective); returns its ``meta.json``. See :mod:`.fsdp_checkpoint`."""
        from telescope.trainer.fsdp_checkpoint import load_fsdp_checkpoint

        return load_fsdp_checkpoint(self, Path(path))

    def close(self) -> None:
        if self._owns_process_group:
            destroy_process_group()
            self._owns_process_group = False
        self.model = None
