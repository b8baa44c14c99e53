"""A megatron backend built, trained and closed in a process leaves the process as it found it.

The megatron tests run backends in the pytest process (TP 1) before other test files
do, so whatever process-wide state a backend changes and keeps reaches them (and the
ranks they spawn, which inherit the environment).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from tests.megatron.test_training import make_backend

from telescope.testing.trainer import synthetic_batch


def test_a_closed_backend_leaves_no_process_state(tiny_model: Path) -> None:
    from megatron.core import parallel_state

    environ = dict(os.environ)
    current_device, synchronize = torch.cuda.current_device, torch.cuda.synchronize
    assert not dist.is_initialized()
    backend = make_backend(str(tiny_model), "megatron", megatron_gradient_checkpointing=True)
    backend.setup(0, 1, "cpu")
    backend.train_step(synthetic_batch())
    backend.close()
    assert dict(os.environ) == environ  # megatron-core's GPTModel sets NVTE_* variables
    assert not dist.is_initialized()
    assert not parallel_state.model_parallel_is_initialized()
    assert (torch.cuda.current_device, torch.cuda.synchronize) == (current_device, synchronize)
    assert not torch.overrides._get_current_function_mode_stack()
    assert torch.get_default_dtype() == torch.float32
