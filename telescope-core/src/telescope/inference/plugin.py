"""Registers the built-in inference backends (``embedded``, ``vllm``) and the settings each owns."""

from __future__ import annotations

from pydantic import Field

from telescope.api.settings import PluginSettings
from telescope.plugins.hookspecs import hookimpl
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


class EmbeddedSettings(PluginSettings):
    """The fields only the ``embedded`` backend reads."""

    section = "inference server"

    embedded_prefix_cache_tokens: int = Field(
        16384,
        ge=0,
        description="Prompt tokens whose KV the embedded engine keeps for later prompts that start with them "
        "(an agent's later calls, a shared system prompt); 0 turns the prefix cache off",
    )


@hookimpl
def telescope_register_inference_backends(register: Registrar) -> None:
    register("embedded", "telescope.inference.embedded.backend:EmbeddedBackend", settings=EmbeddedSettings)
    register(
        "vllm",
        "telescope.inference.vllm_backend:VLLMBackend",
        settings=VLLMSettings,
        install_hint="pip install 'telescope-core[vllm]' (a CUDA GPU is needed)",
    )
