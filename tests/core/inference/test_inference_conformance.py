"""The embedded backend passes the inference-backend conformance kit (a real server process)."""

from __future__ import annotations

from pathlib import Path

from telescope.api.context import InferenceContext
from telescope.api.inference import InferenceBackend
from telescope.inference.embedded.backend import EmbeddedBackend
from telescope.testing.inference import InferenceBackendConformance


class TestEmbeddedBackend(InferenceBackendConformance):
    def make_backend(self, model_path: Path, port: int) -> InferenceBackend:
        context = InferenceContext(
            model=str(model_path), host="127.0.0.1", base_port=port, max_model_len=256, scheduling_policy="fcfs"
        )
        return EmbeddedBackend(context)
