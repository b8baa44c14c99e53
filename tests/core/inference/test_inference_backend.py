"""The backend plugins: registry names, defaults, and the embedded server as a child process."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from telescope.config.schema import TelescopeConfig
from telescope.inference.client import InferenceClient


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_plugins_resolve_to_the_implementations() -> None:
    from telescope.api.inference import InferenceBackend
    from telescope.api.transport import WeightTransport
    from telescope.inference import default_backend_name
    from telescope.plugins.facade import get_plugins
    from telescope.transports import default_transport_name

    plugins = get_plugins()
    for name in ("embedded", "vllm"):
        backend = plugins.inference_backend(name)
        assert issubclass(backend, InferenceBackend) and backend.name == name
    for name in ("memory", "nccl"):
        transport = plugins.weight_transport(name)
        assert issubclass(transport, WeightTransport) and transport.name == name
    assert default_backend_name() == "embedded"  # no vLLM on this machine
    assert default_transport_name() == "memory"


@pytest.mark.slow
def test_embedded_backend_starts_a_server_process(tiny_model_path: Path, tmp_path: Path) -> None:
    from telescope.api.context import InferenceContext
    from telescope.inference.embedded.backend import EmbeddedBackend

    config = TelescopeConfig.model_validate(
        {
            "environments": [{"name": "countdown"}],
            "model": str(tiny_model_path),
            "max_model_len": 256,
            "max_tokens": 32,
            "seq_len": 256,
            "inference_host": "127.0.0.1",
            "inference_base_port": _free_port(),
        }
    )
    server = EmbeddedBackend(InferenceContext.from_config(config)).start_server(0, run_dir=tmp_path)
    try:
        assert server.address.port == config.inference_base_port

        async def go() -> list[int]:
            async with InferenceClient(server.address.base_url) as client:
                result = await client.complete([5, 6, 7], max_tokens=4, ignore_eos=True, seed=1)
                return result.completions[0].token_ids

        assert len(asyncio.run(go())) == 4
        assert (tmp_path / "logs" / "inference_0.log").exists()
    finally:
        server.stop()
    assert server.process.poll() is not None  # type: ignore[attr-defined]
