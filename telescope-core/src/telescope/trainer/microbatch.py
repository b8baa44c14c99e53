"""Tensors of one micro-batch (one packed sequence) on the training device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from telescope.trainer.packing import PackedSequence


@dataclass
class MicroBatch:
    """A packed sequence as tensors: model inputs ``[1, S]`` and flat per-target tensors ``[S]``."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    target_ids: torch.Tensor
    loss_mask: torch.Tensor
    inference_logprobs: torch.Tensor
    advantages: torch.Tensor
    sequence_ids: torch.Tensor
    sequence_lengths: torch.Tensor
    num_loss_tokens: int
    #: ``[documents, 4]`` shared-prefix layout (:attr:`PackedSequence.documents`), None without one.
    documents: torch.Tensor | None = None

    @classmethod
    def from_packed(cls, seq: PackedSequence, device: torch.device) -> MicroBatch:
        def to(values: list[int] | list[float] | list[bool], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

        return cls(
            input_ids=to(seq.input_ids, torch.long).unsqueeze(0),
            position_ids=to(seq.position_ids, torch.long).unsqueeze(0),
            target_ids=to(seq.target_ids, torch.long),
            loss_mask=to(seq.loss_mask, torch.bool),
            inference_logprobs=to(seq.inference_logprobs, torch.float32),
            advantages=to(seq.advantages, torch.float32),
            sequence_ids=to(seq.sequence_ids, torch.long),
            sequence_lengths=to(seq.sample_loss_tokens or [0], torch.long),
            num_loss_tokens=seq.num_loss_tokens,
            documents=torch.tensor(seq.documents, dtype=torch.long).to(device) if seq.documents else None,
        )
