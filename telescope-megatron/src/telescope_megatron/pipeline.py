"""Pipeline parallelism for the megatron backend: megatron-core's schedule over packed micro-batches.

Design. Each pipeline stage holds a contiguous run of decoder layers (the first also
the embedding, the last the final norm and the output layer; megatron-core decides
the split). A minibatch's micro-batches go through megatron-core's own schedule
(``get_forward_backward_func()``: non-interleaved 1F1B at ``pp > 1``), which moves
activations forward and their gradients backward between stages point to point
(gloo on the CPU, NCCL on a GPU). Every stage of a pipeline receives the same packed
sequences (they are dealt to *data-parallel* ranks only), so each stage builds the
micro-batch tensors itself: the first stage needs the token ids, every stage the
position ids (attention mask, RoPE), the last the targets, advantages and masks.

The loss is computed where the logits are, on the last stage, by the same function
as the FSDP backend's (the packed loop's ``MinibatchLoss``): :func:`run_schedule` hands the
schedule a loss function returning ``(loss, tokens, per-micro-batch values)``
with ``calculate_per_token_loss`` set, so the schedule neither divides nor rescales
the loss (it is already normalised by the global token count). The per-micro-batch
values (loss, entropy, KL, token counts) are then broadcast from the last stage to
the others (:func:`share_from_last_stage`), so every rank reports the same metrics.

Names: megatron-core numbers the layers of each stage from 0; :func:`layer_stages`
and :func:`global_name` give the model-wide layer index, which the weight
conversion (:mod:`telescope_megatron.convert`) uses. :func:`gather_stages` turns each
stage's own Hugging Face weight stream into the full stream, in the Hugging Face
order, on every rank (each tensor broadcast from the stage that holds it), so the
weight transport and the checkpoint see exactly what they see without pipelining.

Limits: one model chunk per stage (no virtual/interleaved pipeline); the stages
exchange each micro-batch's shape before its activations (``variable_seq_lengths``,
packed rows differ in length); the number of layers must be divisible by the
pipeline size; on the CPU the schedule runs inside
:func:`telescope_megatron.cpu_patches.cuda_free`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from telescope.trainer.public import MicroBatch

if TYPE_CHECKING:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

_LOCAL_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.")

#: ``loss(mb, output) -> (tensor to backpropagate, values to report)`` on the last stage.
StageLoss = Callable[[MicroBatch, torch.Tensor], tuple[torch.Tensor, Any]]


def layer_stages(config: TransformerConfig, pp_size: int) -> list[int]:
    """The pipeline stage of each decoder layer, by model-wide index (megatron-core's split)."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    return [stage for stage in range(pp_size) for _ in range(get_num_layers_to_build(config, pp_rank=stage))]


def global_name(name: str, offset: int) -> str:
    """A stage's parameter name with its layer index made model-wide (``offset`` = the stage's first layer)."""
    match = _LOCAL_LAYER.match(name)
    if match is None or offset == 0:
        return name
    return f"decoder.layers.{int(match.group(1)) + offset}.{name[match.end() :]}"


def hf_owner(hf_name: str, stages: list[int], pp_size: int) -> int:
    """The pipeline stage that holds Hugging Face weight ``hf_name``."""
    match = _HF_LAYER.match(hf_name)
    if match is not None:
        return stages[int(match.group(1))]
    return 0 if hf_name == "model.embed_tokens.weight" else pp_size - 1


def run_schedule(
    model: GPTModel,
    batches: list[MicroBatch],
    forward: Callable[[MicroBatch], torch.Tensor],
    loss: StageLoss,
    *,
    forward_only: bool = False,
) -> list[Any]:
    """Run ``batches`` through megatron-core's pipeline schedule; the last stage's values, in order.

    ``forward(mb)`` is one stage's forward (hidden states, or logits on the last
    stage); ``loss(mb, logits)`` runs on the last stage and returns the tensor to
    backpropagate and the values to report. Other stages return ``[]``.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from telescope_megatron.cpu_patches import cuda_free

    if not batches:
        return []

    def loss_func(mb: MicroBatch, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        tensor, values = loss(mb, output)
        return tensor, torch.tensor(mb.num_loss_tokens, dtype=torch.int), values

    def forward_step(data: Iterator[MicroBatch], _model: Any) -> tuple[torch.Tensor, Any]:
        mb = next(data)
        return forward(mb), functools.partial(loss_func, mb)

    schedule = get_forward_backward_func()
    with cuda_free():
        store = schedule(
            forward_step_func=forward_step,
            data_iterator=iter(batches),
            model=[model],
            num_microbatches=len(batches),
            seq_length=max(mb.input_ids.shape[1] for mb in batches),  # shapes are exchanged per micro-batch
            micro_batch_size=1,
            forward_only=forward_only,
        )
    return list(store)


def share_from_last_stage(rows: list[list[float]], count: int, width: int, device: torch.device) -> list[list[float]]:
    """``count x width`` values computed on the last pipeline stage, on every stage (one broadcast)."""
    from megatron.core import parallel_state

    group = parallel_state.get_pipeline_model_parallel_group()
    last = dist.get_world_size(group) - 1
    if dist.get_rank(group) == last:
        tensor = torch.tensor(rows, dtype=torch.float64, device=device).reshape(count, width)
    else:
        tensor = torch.zeros(count, width, dtype=torch.float64, device=device)
    dist.broadcast(tensor, src=dist.get_global_rank(group, last), group=group)
    return tensor.tolist()


def gather_stages(
    local: Iterator[tuple[str, torch.Tensor]],
    hf_shapes: dict[str, torch.Size],
    owners: dict[str, int],
    dtype: torch.dtype,
    device: torch.device,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every Hugging Face tensor in ``hf_shapes`` order, on every rank: each broadcast from the stage holding it.

    ``local`` yields this stage's own tensors in that same order. Collective over
    the pipeline group: every rank iterates to the end.
    """
    from megatron.core import parallel_state

    group = parallel_state.get_pipeline_model_parallel_group()
    me = dist.get_rank(group)
    for name, shape in hf_shapes.items():
        owner = owners[name]
        if owner == me:
            own_name, tensor = next(local)
            if own_name != name:
                raise KeyError(f"stage {me} produced {own_name!r} where {name!r} was expected")
            tensor = tensor.contiguous()
        else:
            tensor = torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(tensor, src=dist.get_global_rank(group, owner), group=group)
        yield name, tensor
