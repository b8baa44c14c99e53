"""Registers the built-in inference backends (``embedded``, ``vllm``) through the public hook."""

from __future__ import annotations

from telescope.hookspecs import hookimpl
from telescope.plugins.registry import Registrar


@hookimpl
def telescope_register_inference_backends(register: Registrar) -> None:
    register("embedded", "telescope.inference.embedded.backend:EmbeddedBackend")
    register("vllm", "telescope.inference.vllm_backend:VLLMBackend")
