"""The ``fsdp`` trainer backend: a Hugging Face causal LM sharded with FSDP2 ``fully_shard``.

One instance per rank; the packed training loop (minibatches, packing, global
counts, the algorithm's loss, metrics and timeline records) is
:class:`~telescope.trainer.packed_backend.PackedTrainerBackend`'s; this class fills
in its parallelism hooks. ``setup`` joins the process group (gloo on CPU, NCCL on
CUDA), loads ``AutoModelForCausalLM`` from a local folder, ``tiny:<preset>`` or a
hub id, optionally enables gradient checkpointing, shards every decoder layer and
then the root with ``fully_shard``, builds AdamW and the LR schedule, and (with
``trainer_prewarm``) runs one forward and backward on a synthetic row
(:mod:`telescope.trainer.prewarm`) so the first step is not the slowest. One rank
with no dtype cast to make keeps the plain module: FSDP there would only add
DTensor dispatch to every optimizer op, hooks and parameter copies to every layer
(17% of a CPU step of the ``small`` model, and 0.5 s of first-step set-up), and the
same code path runs either way (``full_tensor`` and the state-dict API take both).

Mixed precision (the context's ``mixed_precision_dtype``, which the Megatron backend reads
too): FSDP2's ``MixedPrecisionPolicy`` casts the parameters to it for the forward and
backward and reduces the gradients in float32; the parameters, their gradients and
AdamW's states stay in ``model_dtype``. No loss scaling (float16 compute is not scaled).

The hooks: FSDP reduce-scatters the gradients on the last micro-batch of a
minibatch only (``set_requires_gradient_sync``) and averages them over every rank,
so each loss is scaled by the world size; ``clip_and_step`` is torch's
``clip_grad_norm_`` over the (DTensor) gradients.

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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from telescope.trainer.context_parallel import ContextParallelLayout, register_attention, sharded_logits
from telescope.trainer.distributed import full_tensor, init_process_group, resolve_device
from telescope.trainer.microbatch import MicroBatch
from telescope.trainer.packed_attention import DOCUMENTS_KWARG, register_packed_attention
from telescope.trainer.packed_attention import supports as packed_attention_supports
from telescope.trainer.packed_backend import DTYPES, PackedTrainerBackend
from telescope.trainer.plugin import FSDPSettings
from telescope.trainer.prewarm import prewarm

if TYPE_CHECKING:
    from telescope.api.algorithm import Algorithm
    from telescope.api.context import TrainerContext


class FSDPBackend(PackedTrainerBackend):
    """Hugging Face model + FSDP2 data parallelism, CPU (gloo) or CUDA (NCCL)."""

    name = "fsdp"

    def __init__(self, context: TrainerContext, algorithm: Algorithm, settings: FSDPSettings | None = None) -> None:
        super().__init__(context, algorithm, settings)
        self.fsdp = settings or FSDPSettings()
        self.layout = ContextParallelLayout()
        self._sharded = False

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
        self.rank, self.world_size, self.dp_group = self.layout.dp_rank, self.layout.dp_size, self.layout.dp_group
        torch.manual_seed(self.context.seed)
        self.model_path = resolve_model_path(self.context.model)
        self.model = self._load_model()
        if self.fsdp.gradient_checkpointing:
            self._enable_activation_checkpointing()
        mp_dtype = self.context.mixed_precision_dtype
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
        self.optimizer = self.build_optimizer(self.context.learning_rate, self.context.weight_decay)
        self.scheduler = self.build_scheduler(self.optimizer)
        model_config = self.model.config
        pad = model_config.pad_token_id if model_config.pad_token_id is not None else model_config.eos_token_id
        self.pad_token_id = int(pad if isinstance(pad, int) else 0)
        if self.fsdp.trainer_prewarm:
            vocab = int(self.model.get_input_embeddings().num_embeddings)
            record = prewarm(self.model, self.logits, self.context.seq_len, vocab, self.device)
            if self.context.track_gpu_events:
                self._events.append(record)

    def _needs_fsdp(self) -> bool:
        """Whether the model is wrapped with ``fully_shard``: several ranks, or a mixed-precision cast to make."""
        if self.global_world_size > 1:
            return True
        cast = self.context.mixed_precision_dtype
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
            self.shares_prefixes = self.fsdp.share_prompt_prefixes
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

    # ------------------------------------------------------ parallelism hooks

    def logits(self, mb: MicroBatch) -> torch.Tensor:
        if self.layout.cp_size > 1:
            return sharded_logits(self.model, mb.input_ids, mb.position_ids, self.layout, self.pad_token_id)
        shared = {} if mb.documents is None else {DOCUMENTS_KWARG: mb.documents}
        output = self.model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False, **shared)
        logits: torch.Tensor = output.logits[0]
        return logits

    def averaging_ranks(self) -> int:
        """FSDP's reduce-scatter averages over every rank, data- and context-parallel.

        (``set_gradient_divide_factor(1)`` would need PREMUL_SUM, which gloo lacks.)
        """
        return self.global_world_size

    def set_gradient_sync(self, enabled: bool) -> None:
        """FSDP reduce-scatters only after the last micro-batch of a minibatch."""
        if self._sharded:
            self.model.set_requires_gradient_sync(enabled)

    def clip_and_step(self, optimizer: torch.optim.Optimizer) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = float(full_tensor(torch.nn.utils.clip_grad_norm_(params, self.context.grad_clip, foreach=True)))
        if math.isfinite(norm):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm

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
