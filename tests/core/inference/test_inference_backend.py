"""The backend plugins: registry names, defaults, and the embedded server as a child process."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import time
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest
import torch

from telescope.inference.client import InferenceClient
from telescope.schema.config import TelescopeConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_plugins_resolve_to_the_implementations() -> None:
    from telescope.api.inference import InferenceBackend
    from telescope.api.transport import WeightTransport
    from telescope.plugins.facade import get_plugins
    from telescope.transports import default_transport_name

    plugins = get_plugins()
    for name in ("embedded", "vllm"):
        backend = plugins.inference_backend(name)
        assert issubclass(backend, InferenceBackend) and backend.name == name
    for name in ("memory", "nccl"):
        transport = plugins.weight_transport(name)
        assert issubclass(transport, WeightTransport) and transport.name == name
    expected_transport = "nccl" if torch.cuda.is_available() else "memory"
    assert default_transport_name() == expected_transport


# ------------------------------------------- auto backend / transport, both ways on any machine


def fake_machine(monkeypatch: pytest.MonkeyPatch, *, vllm: bool, cuda: bool) -> None:
    """Pretend vLLM is (not) installed and CUDA is (not) usable; other modules are looked up as usual."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        if name == "vllm":
            return ModuleSpec("vllm", None) if vllm else None
        return real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)


@pytest.mark.parametrize(
    ("vllm", "cuda", "expected"),
    [(False, False, "embedded"), (False, True, "embedded"), (True, False, "embedded"), (True, True, "vllm")],
)
def test_auto_backend_is_vllm_only_with_vllm_and_a_gpu(
    monkeypatch: pytest.MonkeyPatch, vllm: bool, cuda: bool, expected: str
) -> None:
    from telescope.inference import default_backend_name
    from telescope.inference.vllm_backend import VLLMBackend

    fake_machine(monkeypatch, vllm=vllm, cuda=cuda)
    assert VLLMBackend.is_available() is (vllm and cuda)
    assert default_backend_name() == expected


@pytest.mark.parametrize("cuda_here", [False, True])
@pytest.mark.parametrize(
    ("vllm", "gpu", "expected"), [(False, True, "embedded"), (True, True, "vllm"), (True, False, "embedded")]
)
def test_auto_backend_follows_the_clusters_gpus_not_this_process(
    monkeypatch: pytest.MonkeyPatch, vllm: bool, gpu: bool, expected: str, cuda_here: bool
) -> None:
    """default_backend_name(gpu) (a Ray cluster's view) ignores whether this process sees CUDA."""
    from telescope.inference import default_backend_name

    fake_machine(monkeypatch, vllm=vllm, cuda=cuda_here)
    assert default_backend_name(gpu) == expected


@pytest.mark.parametrize("cuda", [False, True])
def test_auto_transport_is_nccl_only_with_a_gpu(monkeypatch: pytest.MonkeyPatch, cuda: bool) -> None:
    from telescope.transports import default_transport_name

    fake_machine(monkeypatch, vllm=False, cuda=cuda)
    assert default_transport_name() == ("nccl" if cuda else "memory")
    assert default_transport_name(gpu=not cuda) == ("memory" if cuda else "nccl")  # the cluster's view wins


def test_the_embedded_backend_chooses_a_device_without_importing_torch() -> None:
    """Importing torch in the Ray worker only to look for a GPU cost ~2 s before the server could start."""
    import subprocess
    import sys

    code = """
import dataclasses, sys
from telescope.api.context import InferenceContext
from telescope.schema.config import TelescopeConfig
from telescope.inference.embedded.backend import EmbeddedBackend
context = InferenceContext.from_config(TelescopeConfig.model_validate({"environments": [{"name": "countdown"}]}))
print(EmbeddedBackend(context)._device(), EmbeddedBackend(dataclasses.replace(context, gpu_ids=["3"]))._device())
print("torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    # no assignment: the server process picks (worker i takes GPU i mod count, else the CPU); an assigned
    # worker's process sees only its GPUs
    assert out == ["auto", "cuda:0", "False"]


def _embedded_config(model: Path) -> TelescopeConfig:
    """A run's config for one embedded server of ``model`` on a free local port (as a run loads it)."""
    from telescope.config.loader import load_config

    values = {
        "environments": [{"name": "countdown"}],
        "model": str(model),
        "max_model_len": 256,
        "max_tokens": 32,
        "seq_len": 256,
        "inference_host": "127.0.0.1",
        "inference_base_port": _free_port(),
    }
    return load_config(None, values, check_plugins=False).config


@pytest.mark.slow
def test_embedded_backend_starts_a_server_process(tiny_model_path: Path, tmp_path: Path) -> None:
    from telescope.api.context import InferenceContext
    from telescope.inference.embedded.backend import EmbeddedBackend

    config = _embedded_config(tiny_model_path)
    server = EmbeddedBackend(InferenceContext.from_config(config)).start_server(0, run_dir=tmp_path)
    try:
        assert server.address.port == config.inference_base_port

        async def go() -> list[int]:
            async with InferenceClient(server.address.base_url) as client:
                result = await client.complete([5, 6, 7], max_tokens=4, ignore_eos=True, seed=1)
                return result.completions[0].token_ids

        assert len(asyncio.run(go())) == 4
        # log records in logs/, the raw console (uvicorn, tracebacks) in logs/stdout/
        serving = (tmp_path / "logs" / "inference_0.log").read_text()
        assert "embedded engine serving" in serving
        # the backend left the device to the server ("auto"), which chose the GPU or the CPU itself
        assert '"device": "auto"' in (tmp_path / "logs" / "inference_0_engine.json").read_text()
        assert f"({'cuda:0' if torch.cuda.is_available() else 'cpu'})" in serving
        assert (tmp_path / "logs" / "stdout" / "inference_0.log").exists()
    finally:
        server.stop()
    assert server.process.poll() is not None  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.exclusive  # asserts the server exits within seconds of its grace: on free cores
def test_a_stopped_server_does_not_wait_for_a_weight_update_whose_sender_hung(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    """A hung trainer rank leaves the server waiting for weights that never come: its stop must not wait too.

    Without the server's stop deadline, uvicorn waited for that request until the
    transport's timeout, and :meth:`ProcessServer.stop` killed the process after 20 s
    (a run's shutdown took 30 s after its watchdog fired).
    """
    from telescope.api.context import InferenceContext
    from telescope.inference.embedded.backend import EmbeddedBackend
    from telescope.inference.embedded.server import STOP_GRACE_S
    from telescope.transports.memory import MemoryTransport

    config = _embedded_config(tiny_model_path)
    server = EmbeddedBackend(InferenceContext.from_config(config)).start_server(0, run_dir=tmp_path)
    sender = MemoryTransport(None)  # prepared, then never sends: the trainer rank hung
    info = sender.prepare_sender(num_receivers=1)

    async def stop_during_an_update() -> float:
        async with InferenceClient(server.address.base_url) as client:
            await client.init_weight_transfer("memory", info, rank_offset=1, context={"timeout_s": 600.0})
            update = asyncio.create_task(client.update_weights(1))
            await asyncio.sleep(1.0)
            assert not update.done(), "the update must be waiting for its sender"
            began = time.monotonic()
            await asyncio.to_thread(server.stop)
            took = time.monotonic() - began
            with contextlib.suppress(Exception):  # its connection closed with the process
                await update
            return took

    try:
        took = asyncio.run(stop_during_an_update())
    finally:
        server.stop()
        sender.close()
    assert server.process.poll() is not None  # type: ignore[attr-defined]
    assert STOP_GRACE_S <= took < STOP_GRACE_S + 8, f"the server took {took:.1f} s to stop"
    log = (tmp_path / "logs" / "inference_0.log").read_text()
    assert "exiting without it" in log


@pytest.mark.slow
def test_a_run_configs_server_binds_loopback_and_asks_for_the_token_it_got_privately(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    """``inference_host: auto`` (the default) outside Ray is loopback; the token is in the server's
    environment only: not on its command line (``ps`` shows that to every user), not in the run folder."""
    import httpx
    import psutil

    from telescope.plugins.facade import get_plugins
    from telescope.system.access import RUN_TOKEN_ENV, authorization_header, new_run_token

    token = new_run_token()
    config = _embedded_config(tiny_model_path).model_copy(update={"inference_host": "auto"})
    server = get_plugins().create_inference_backend("embedded", config, token).start_server(0, run_dir=tmp_path)
    try:
        process = psutil.Process(server.process.pid)  # type: ignore[attr-defined]
        listening = {c.laddr.ip for c in process.net_connections("inet") if c.status == psutil.CONN_LISTEN}
        assert listening == {"127.0.0.1"}
        assert server.address.base_url == f"http://127.0.0.1:{config.inference_base_port}"
        assert token not in " ".join(process.cmdline()) and process.environ()[RUN_TOKEN_ENV] == token
        with httpx.Client(base_url=server.address.base_url, timeout=30) as http:
            assert http.get("/metrics").status_code == 401
            assert http.get("/metrics", headers=authorization_header(token)).status_code == 200
    finally:
        server.stop()
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or token not in path.read_text(errors="replace"), path
