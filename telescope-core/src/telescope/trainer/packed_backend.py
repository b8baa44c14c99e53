"""The packed training loop shared by the trainer backends, and the parallelism hooks a backend fills in.

:class:`PackedTrainerBackend` is algorithm-blind and parallelism-blind. Every rank
receives the *same* full :class:`~telescope.api.records.TrainingBatch`; ``train_step``:

1. splits the samples by group into ``number_of_minibatches`` minibatches, packs each
   first-fit-decreasing into sequences of ``seq_len`` tokens (each group's prompt
   once with ``shares_prefixes``, see :mod:`telescope.trainer.prefix_sharing`) and
   deals the sequences to the *data-parallel* ranks balancing tokens. One packed
   sequence is one micro-batch; a rank with fewer sequences runs padding-only
   micro-batches so the collectives stay in step.
2. With a ratio reference ``batch`` (``Algorithm.uses_batch_reference``), computes
   the trainer's own log-probabilities of every minibatch without gradient before
   the first optimizer step (the ratio's reference and, with ``use_tis``, the
   ``pi_old`` of the TIS weight).
3. For each minibatch, all-reduces the global counts (loss tokens, samples) *before*
   any backward; each micro-batch's loss is ``sum(loss_terms) /
   algorithm.loss_denominator(counts)``, so the accumulated gradient is that of the
   minibatch objective whatever the split into micro-batches and ranks. With
   ``entropy_coef > 0`` the entropy is computed with gradient for the bonus.
4. Clips to ``grad_clip`` and steps; a non-finite norm skips the optimizer step
   (``optimizer/skipped_steps``). The LR schedule advances once per trainer step.

The metrics are reduced over the data-parallel ranks; with ``track_gpu_events``
each section of a step is also a timeline record (:mod:`telescope.trainer.metrics`).
``supervised_step`` (the warm start) is the same packing and micro-batch loop with
the token cross-entropy at temperature 1, normalised by the global token count, and
an optimizer of its own.

The hooks, which is all a backend that parallelises the model its own way supplies
(the ``fsdp`` and ``megatron`` backends are two such siblings; docs/trainer-backends.md):

- ``setup`` builds the model and sets :attr:`device`, :attr:`rank`/:attr:`world_size`
  (data parallel), :attr:`dp_group`, :attr:`pad_token_id`, :attr:`optimizer` (from
  :meth:`build_optimizer`) and :attr:`scheduler` (:meth:`build_scheduler`);
- :meth:`logits`: the full ``[S, V]`` logits of one micro-batch;
- :meth:`clip_and_step`: reduce the gradients as the parallelism needs, clip by the
  global norm, step unless it is non-finite, zero the gradients;
- :meth:`averaging_ranks`: the number of ranks the gradient reduction averages over
  (each loss is scaled by it, so that the reduction sums);
- optional: :meth:`build_optimizer`, :meth:`set_gradient_sync`, :meth:`all_reduce_sum`,
  :meth:`step_scope`, :meth:`loss_scale` and :meth:`optimizer_metrics` (float16 loss
  scaling and its metrics), and :meth:`forward_backward_minibatch` /
  :meth:`reference_logprobs` for a backend that runs micro-batches through a schedule
  of its own (pipeline parallelism);
- and :class:`~telescope.api.trainer.TrainerBackend`'s ``named_weights``,
  ``save_checkpoint``, ``load_checkpoint``, plus :meth:`full_gradients` for tests.

Limits: one packed sequence per micro-batch (no batching of rows); the loss of a
micro-batch must be computable from its own logits (sequence-level terms span one
sample, and a sample is never split over micro-batches).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from telescope.api.algorithm import LossCounts, LossInputs
from telescope.api.records import SupervisedExample, TrainingBatch, TrainingSample
from telescope.api.trainer import TrainerBackend
from telescope.trainer.distributed import all_reduce_sum, destroy_process_group
from telescope.trainer.logprobs import chunked_entropy, inference_kl_k3, token_entropy, token_logprobs
from telescope.trainer.metrics import LOSS_PART_KEYS, SectionTimers, loss_parts
from telescope.trainer.microbatch import MicroBatch
from telescope.trainer.packing import (
    PackedBatch,
    PackedSequence,
    assign_to_ranks,
    empty_sequence,
    pack_samples,
    split_minibatches,
)
from telescope.trainer.prefix_sharing import pack_with_shared_prefixes
from telescope.trainer.schedule import build_lr_scheduler

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from telescope.api.algorithm import Algorithm
    from telescope.api.context import TrainerContext
    from telescope.api.settings import PluginSettings

#: The ``model_dtype`` / ``mixed_precision_dtype`` names and their torch dtypes.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

#: The per-micro-batch sums of an RL step, in the order they are reduced.
STEP_SUM_KEYS = ("loss", "entropy", "kl", "tokens", *LOSS_PART_KEYS)


@dataclass(frozen=True)
class MinibatchLoss:
    """The loss of each micro-batch of a minibatch, as :meth:`PackedTrainerBackend.forward_backward_minibatch` takes it.

    ``compute(index, micro_batch, logits)`` returns the tensor to backpropagate
    (already divided by the global denominator) and the micro-batch's local sums,
    one float per name in ``keys`` (a pipeline computes the loss on its last stage
    only and hands the sums to the other stages by these names).
    """

    keys: tuple[str, ...]
    compute: Callable[[int, MicroBatch, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


class PackedTrainerBackend(TrainerBackend):
    """The packed RL and supervised steps over a model that a subclass builds and parallelises."""

    #: Whether RL steps pack each group's prompt once (:mod:`telescope.trainer.prefix_sharing`); a
    #: backend sets it when its attention reads the shared-prefix layout.
    shares_prefixes = False

    def __init__(self, context: TrainerContext, algorithm: Algorithm, settings: PluginSettings | None = None) -> None:
        super().__init__(context, algorithm, settings)
        self.step = 0
        self.rank = self.global_rank = 0
        self.world_size = self.global_world_size = 1
        self.dp_group: ProcessGroup | None = None
        self.device = torch.device("cpu")
        self.pad_token_id = 0
        self.model: Any = None
        self.model_path = ""
        self.optimizer: torch.optim.Optimizer
        self.scheduler: Any = None
        self._owns_process_group = False
        self._supervised_optimizer: torch.optim.Optimizer | None = None
        self._events: list[dict[str, Any]] = []

    # ------------------------------------------------------------ the hooks

    @abstractmethod
    def logits(self, mb: MicroBatch) -> torch.Tensor:
        """The full ``[S, V]`` logits of one micro-batch (collective where the model is split)."""

    @abstractmethod
    def clip_and_step(self, optimizer: torch.optim.Optimizer) -> float:
        """Reduce the gradients, clip to ``grad_clip``, step unless the norm is non-finite, zero the gradients.

        Returns the global pre-clip norm.
        """

    def averaging_ranks(self) -> int:
        """The number of ranks the gradient reduction averages over; each loss is scaled by it so the reduction sums."""
        return self.world_size

    def build_optimizer(self, learning_rate: float, weight_decay: float) -> torch.optim.Optimizer:
        """The optimizer of the RL steps and, with ``weight_decay`` 0, of the warm start: AdamW over the model."""
        return torch.optim.AdamW(self.model.parameters(), lr=learning_rate, weight_decay=weight_decay, foreach=True)

    def build_scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        """The run's LR schedule over ``optimizer`` (``lr_scheduler``, warm-up, steps, ``min_lr_ratio``)."""
        c = self.context
        return build_lr_scheduler(optimizer, c.lr_scheduler, c.warmup_steps, c.number_of_steps, c.min_lr_ratio)

    def set_gradient_sync(self, enabled: bool) -> None:
        """Whether the next backward reduces gradients across ranks (called before each micro-batch's forward)."""

    def all_reduce_sum(self, values: list[float] | list[int]) -> list[float]:
        """Sum per-rank values over the data-parallel ranks (other ranks of a data-parallel rank hold the same)."""
        return all_reduce_sum(values, self.device, self.dp_group)

    def step_scope(self) -> contextlib.AbstractContextManager[None]:
        """A context every step runs in (a backend's device or allocator scope); none by default."""
        return contextlib.nullcontext()

    def loss_scale(self) -> float:
        """The factor each micro-batch's loss is multiplied by before its backward (1 by default).

        A backend that scales the loss (float16's dynamic loss scaling) divides the
        gradients by it again in :meth:`clip_and_step`, before the norm.
        """
        return 1.0

    def optimizer_metrics(self) -> dict[str, float]:
        """Metrics of the backend's optimizer after a step (e.g. the loss scale), added to ``train_step``'s."""
        return {}

    def forward_backward_minibatch(
        self,
        sequences: list[PackedSequence],
        loss: MinibatchLoss,
        timers: SectionTimers,
        minibatch: int = 0,
        first_microbatch: int = 0,
    ) -> list[dict[str, float]]:
        """Forward, loss and backward of every micro-batch of one minibatch, in order; their local sums.

        One micro-batch at a time; gradient sync only on the last. A backend that runs
        micro-batches through a schedule of its own (pipeline parallelism) overrides this.
        """
        parts = []
        for i, seq in enumerate(sequences):
            ids = {"minibatch": minibatch, "microbatch": first_microbatch + i}
            with timers.section("data_to_device", **ids):
                mb = MicroBatch.from_packed(seq, self.device)
            self.set_gradient_sync(i == len(sequences) - 1)
            with timers.section("forward", **ids):
                logits = self.logits(mb)
            value, sums = loss.compute(i, mb, logits)
            with timers.section("backward", **ids):
                # each loss is divided by the *global* denominator, so the gradients must be
                # summed over ranks; the reduction averages them, hence the factor (and the loss
                # scale of float16 training, divided out of the gradients in clip_and_step)
                (value * (self.averaging_ranks() * self.loss_scale())).backward()
            parts.append(sums)
        return parts

    @torch.no_grad()
    def reference_logprobs(self, local: list[list[PackedSequence]], timers: SectionTimers) -> list[list[torch.Tensor]]:
        """The trainer's log-probabilities of every micro-batch of every minibatch, before any optimizer step."""
        out: list[list[torch.Tensor]] = []
        for m, sequences in enumerate(local):
            row: list[torch.Tensor] = []
            for i, seq in enumerate(sequences):
                ids = {"minibatch": m, "microbatch": i, "reference": True}
                with timers.section("data_to_device", **ids):
                    mb = MicroBatch.from_packed(seq, self.device)
                with timers.section("forward", **ids):
                    logits = self.logits(mb)
                row.append(token_logprobs(logits, mb.target_ids, self.context.temperature).detach())
            out.append(row)
        return out

    # ---------------------------------------------------------- the RL step

    def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One rollout batch: ``number_of_minibatches`` optimizer steps; returns reduced metrics."""
        with self.step_scope():
            return self._train_step(batch)

    def _train_step(self, batch: TrainingBatch) -> dict[str, float]:
        step_start, step_wall = time.perf_counter(), time.time()
        timers = SectionTimers(self.device, record_events=self.context.track_gpu_events)
        with timers.section("prepare_tensors"):
            minibatches = split_minibatches(batch.samples, self.context.number_of_minibatches)
            packed = [self._pack(mb, share_prefixes=self.shares_prefixes) for mb in minibatches]
            local = [self._local_sequences(p) for p in packed]
        ref_logprobs = self.reference_logprobs(local, timers) if self.algorithm.uses_batch_reference else None

        learning_rate = float(self.optimizer.param_groups[0]["lr"])
        sums = dict.fromkeys(STEP_SUM_KEYS, 0.0)
        grad_norms: list[float] = []
        skipped = optimizer_steps = micro_count = 0
        for m, sequences in enumerate(local):
            counts = self._global_counts(sequences)
            if counts.loss_tokens == 0 and counts.samples == 0:
                continue
            refs = ref_logprobs[m] if ref_logprobs is not None else None
            loss = self._algorithm_loss(self.algorithm.loss_denominator(counts), refs, timers, m, micro_count)
            for part in self.forward_backward_minibatch(sequences, loss, timers, m, micro_count):
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
        reduced = self.all_reduce_sum([sums[k] for k in STEP_SUM_KEYS] + list(timing.values()))
        totals = dict(zip(STEP_SUM_KEYS, reduced[: len(STEP_SUM_KEYS)], strict=True))
        timing_mean = [v / self.world_size for v in reduced[len(STEP_SUM_KEYS) :]]
        tokens = totals["tokens"]
        step_time = time.perf_counter() - step_start
        metrics: dict[str, float] = {
            "loss": totals["loss"] / max(optimizer_steps, 1),
            "entropy": totals["entropy"] / max(tokens, 1.0),
            "kl_divergence_inference": totals["kl"] / max(tokens, 1.0),
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
        metrics.update(self._loss_part_metrics(totals, optimizer_steps))
        metrics.update(self.optimizer_metrics())
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

    def _algorithm_loss(
        self,
        denominator: float,
        ref_logprobs: list[torch.Tensor] | None,
        timers: SectionTimers,
        minibatch: int,
        first_microbatch: int,
    ) -> MinibatchLoss:
        """The algorithm's loss of each micro-batch of one minibatch (``sum(loss_terms) / denominator``)."""

        def compute(index: int, mb: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            ref = ref_logprobs[index] if ref_logprobs is not None else None
            ids = {"minibatch": minibatch, "microbatch": first_microbatch + index}
            return self._micro_loss(mb, logits, ref, denominator, timers, **ids)

        return MinibatchLoss(STEP_SUM_KEYS, compute)

    def _micro_loss(
        self,
        mb: MicroBatch,
        logits: torch.Tensor,
        ref_logprobs: torch.Tensor | None,
        denominator: float,
        timers: SectionTimers,
        **ids: int,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The algorithm's loss of one micro-batch and its local sums (:data:`STEP_SUM_KEYS`)."""
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

    def _optimizer_step(self) -> float:
        """The RL optimizer's step (:meth:`clip_and_step`); returns the pre-clip norm."""
        return self.clip_and_step(self.optimizer)

    def drain_events(self) -> list[dict[str, Any]]:
        """This rank's timeline records since the last call (see :class:`~telescope.trainer.metrics.SectionTimers`)."""
        events, self._events = self._events, []
        return events

    # ------------------------------------------------------ the warm start

    def supervised_step(self, examples: list[SupervisedExample], learning_rate: float) -> dict[str, float]:
        """Cross-entropy on the completion tokens, normalised by the global token count (see the interface).

        The examples are packed like RL samples; the loss of a micro-batch is
        ``-sum(log p(target)) / global loss tokens`` at temperature 1, so the
        gradient is that of the mean token cross-entropy over the whole batch.
        """
        with self.step_scope():
            if self._supervised_optimizer is None:
                self._supervised_optimizer = self.build_optimizer(learning_rate, 0.0)
            optimizer = self._supervised_optimizer
            for group in optimizer.param_groups:
                group["lr"] = learning_rate
            sequences = self._local_sequences(self._pack([e.as_training_sample() for e in examples]))
            counts = self._global_counts(sequences)
            denominator = float(max(counts.loss_tokens, 1))

            def cross_entropy(
                _index: int, mb: MicroBatch, logits: torch.Tensor
            ) -> tuple[torch.Tensor, dict[str, float]]:
                logprobs = token_logprobs(logits, mb.target_ids, 1.0)
                loss = -torch.where(mb.loss_mask, logprobs, torch.zeros_like(logprobs)).sum() / denominator
                return loss, {"loss": float(loss.detach())}

            parts = self.forward_backward_minibatch(
                sequences, MinibatchLoss(("loss",), cross_entropy), SectionTimers(self.device)
            )
            norm = self.clip_and_step(optimizer)
            (total_loss,) = self.all_reduce_sum([sum(part["loss"] for part in parts)])
        return {"loss": total_loss, "grad_norm": norm, "tokens": float(counts.loss_tokens)}

    # ------------------------------------------------- packing and counting

    def _pack(self, samples: list[TrainingSample], share_prefixes: bool = False) -> PackedBatch:
        c = self.context
        if share_prefixes:
            return pack_with_shared_prefixes(samples, c.seq_len, c.pad_to_multiple_of, self.pad_token_id)
        return pack_samples(samples, c.seq_len, c.pad_to_multiple_of, self.pad_token_id, overflow="truncate")

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
        tokens, samples = self.all_reduce_sum([local_tokens, local_samples])
        return LossCounts(loss_tokens=int(tokens), samples=int(samples))

    # --------------------------------------------- gradients (tests, tools)

    def accumulate_gradients(self, samples: list[TrainingSample]) -> LossCounts:
        """Forward/backward of ``samples`` as one minibatch, leaving the gradients in place (no step).

        For tests and tools that inspect the gradient (``full_gradients``);
        ``train_step`` is the training entry point.
        """
        with self.step_scope():
            timers = SectionTimers(self.device)
            sequences = self._local_sequences(self._pack(samples, share_prefixes=self.shares_prefixes))
            counts = self._global_counts(sequences)
            denominator = self.algorithm.loss_denominator(counts)
            uses_reference = self.algorithm.uses_batch_reference
            refs = self.reference_logprobs([sequences], timers)[0] if uses_reference else None
            self.forward_backward_minibatch(sequences, self._algorithm_loss(denominator, refs, timers, 0, 0), timers)
        return counts

    @abstractmethod
    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Unsharded gradients by Hugging Face parameter name (collective); zeros where none accumulated."""

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        """Leave the process group this backend joined, and drop the model."""
        if self._owns_process_group:
            destroy_process_group()
            self._owns_process_group = False
        self.model = None
