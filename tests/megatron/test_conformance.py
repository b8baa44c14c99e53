"""The trainer conformance kit (telescope.testing.trainer) against the megatron backend, TP 1."""

from __future__ import annotations

from typing import Any, ClassVar

from telescope.testing.trainer import TrainerBackendConformance


class TestMegatronConformance(TrainerBackendConformance):
    backend_name = "megatron"
    config_overrides: ClassVar[dict[str, Any]] = {"megatron_gradient_checkpointing": False}
