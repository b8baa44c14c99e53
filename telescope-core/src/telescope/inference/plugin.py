"""Registers the built-in inference backends (``embedded``, ``vllm``) and the settings vLLM owns."""

from __future__ import annotations

from pydantic import Field

from telescope.api.settings import PluginSettings
from telescope.hookspecs import hookimpl
from telescope.plugins.registry import Registrar


class VLLMSettings(PluginSettings):
    """The fields only the ``vllm`` backend reads."""

    section = "inference server"

    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Fraction of GPU memory allocated to vLLM")
    enable_vllm_tracing: bool = Field(
        True, description="Trace vLLM requests (queue, prefill, decode) into the run's timeline through OpenTelemetry"
    )
    otlp_receiver_port: int = Field(
        4318, ge=1, le=65535, description="Port of the run's OTLP/HTTP trace receiver (another one when it is taken)"
    )


@hookimpl
def telescope_register_inference_backends(register: Registrar) -> None:
    register("embedded", "telescope.inference.embedded.backend:EmbeddedBackend")
    register(
        "vllm",
        "telescope.inference.vllm_backend:VLLMBackend",
        settings=VLLMSettings,
        install_hint="pip install 'telescope-core[vllm]' (a CUDA GPU is needed)",
    )
