"""What a trainer backend outside telescope-core may use from ``telescope.trainer``: the declared public surface.

A third-party backend (``telescope-megatron`` is one, and imports only from here)
subclasses :class:`PackedTrainerBackend` and fills in its parallelism hooks, or
implements :class:`telescope.api.trainer.TrainerBackend` from scratch. Everything
else under ``telescope.trainer`` is the ``fsdp`` backend's own and may change
without notice. docs/trainer-backends.md describes each name; a test holds
``telescope-megatron`` to this module.

- the loop: :class:`PackedTrainerBackend`, :class:`MinibatchLoss`, :data:`DTYPES`;
- its data: :class:`MicroBatch` (a packed sequence as tensors), :class:`PackedSequence`,
  :class:`PackedBatch`, :class:`SectionTimers` and :data:`LOSS_PART_KEYS`;
- the per-token quantities, at the temperature convention of
  :mod:`telescope.api.temperature`: :func:`token_logprobs`, :func:`token_entropy`,
  :func:`chunked_entropy`;
- the process group: :func:`init_process_group`, :func:`destroy_process_group`,
  :func:`resolve_device`, :func:`all_reduce_sum`, :func:`barrier`;
- the context-parallel layout (head-tail chunks): :func:`local_indices`, :func:`gathered_order`;
- the checkpoint folder format: the :mod:`~telescope.trainer.checkpoint` module
  (``write_checkpoint``, ``read_meta``, ``resolve_checkpoint``, ``rng_state``,
  ``set_rng_state``, ``save_tokenizer``), and the Hugging Face weights folders the
  checkpoints hold: the :mod:`~telescope.trainer.safetensors_folder` module
  (``FolderReader``, ``StreamWriter``, ``write_index``, ``shard_file_name``).
"""

from __future__ import annotations

from telescope.trainer import checkpoint, safetensors_folder
from telescope.trainer.context_parallel import gathered_order, local_indices
from telescope.trainer.distributed import (
    all_reduce_sum,
    barrier,
    destroy_process_group,
    init_process_group,
    resolve_device,
)
from telescope.trainer.logprobs import chunked_entropy, token_entropy, token_logprobs
from telescope.trainer.metrics import LOSS_PART_KEYS, SectionTimers
from telescope.trainer.microbatch import MicroBatch
from telescope.trainer.packed_backend import DTYPES, MinibatchLoss, PackedTrainerBackend
from telescope.trainer.packing import PackedBatch, PackedSequence

__all__ = [
    "DTYPES",
    "LOSS_PART_KEYS",
    "MicroBatch",
    "MinibatchLoss",
    "PackedBatch",
    "PackedSequence",
    "PackedTrainerBackend",
    "SectionTimers",
    "all_reduce_sum",
    "barrier",
    "checkpoint",
    "chunked_entropy",
    "destroy_process_group",
    "gathered_order",
    "init_process_group",
    "local_indices",
    "resolve_device",
    "safetensors_folder",
    "token_entropy",
    "token_logprobs",
]
