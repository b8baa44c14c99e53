"""The inference side: the embedded engine, the vLLM backend and the shared client.

- :mod:`.protocol`: the vLLM-compatible completions wire format;
- :mod:`.client`: the orchestrator's one client for both backends;
- :mod:`.embedded`: the embedded engine (:mod:`.embedded.engine`), its HTTP
  server and the ``embedded`` backend;
- :mod:`.vllm_backend`: the ``vllm`` backend (optional extra ``telescope-core[vllm]``);
- :mod:`.weight_sync`: the weight-update calls both servers accept.
"""

from __future__ import annotations


def default_backend_name(gpu: bool | None = None) -> str:
    """``vllm`` when it is installed and a GPU is usable, else ``embedded`` (``inference_backend: auto``).

    ``gpu`` says whether the workers will have GPUs (a Ray cluster's view); None checks this process.
    """
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "embedded"
    if gpu is None:
        from telescope.inference.vllm_backend import VLLMBackend

        return "vllm" if VLLMBackend.is_available() else "embedded"
    return "vllm" if gpu else "embedded"
