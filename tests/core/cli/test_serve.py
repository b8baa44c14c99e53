"""``telescope serve``: a real process on a run's checkpoint, called with the ``openai`` SDK, stopped by SIGTERM.

Also the command lines it builds for vLLM (vLLM cannot run on this machine) and its
errors for a source that is not a model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import psutil
import pytest

from telescope.cli.main import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory whose latest checkpoint (step 3) holds the tiny test model and its tokenizer."""
    from telescope.models.tiny import PRESETS, build_tiny_model

    root = tmp_path_factory.mktemp("serve")
    model = build_tiny_model(root / "model", PRESETS["test"])
    checkpoint = root / "run" / "checkpoints" / "step_00000003"
    shutil.copytree(model, checkpoint)
    (checkpoint / "meta.json").write_text(json.dumps({"step": 3}), encoding="utf-8")
    return root / "run"


def _wait_for_url(process: subprocess.Popen[str], timeout: float = 240.0) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.startswith("serving "):
            return line.rsplit(" ", 1)[-1].strip()
        if not line and process.poll() is not None:
            break
    process.kill()
    raise AssertionError(f"telescope serve did not start (exit {process.poll()})")


@pytest.mark.slow
def test_serve_a_checkpoint_then_stop_on_sigterm(run_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TELESCOPE_CACHE": str(tmp_path / "cache")}
    command = [
        sys.executable,
        "-m",
        "telescope.cli.main",
        "serve",
        str(run_dir),
        "--port",
        "0",
        "--max-model-len",
        "256",
        "--api-key",
        "k",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = _wait_for_url(process)
        children = psutil.Process(process.pid).children(recursive=True)
        assert children  # the backend's server process
        with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as sdk:
            model = sdk.models.list().data[0]
            assert model.id.endswith("step_00000003")
            reply = sdk.chat.completions.create(
                model=model.id, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert reply.usage is not None and reply.usage.completion_tokens <= 4
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"left running: {alive}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_serve_refuses_what_is_not_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: no checkpoint at") and "Hugging Face model folder" in err


def test_vllm_command_line_serves_the_checkpoint_folder(run_dir: Path) -> None:
    """The ``vllm serve`` line ``telescope serve --backend vllm`` starts (vLLM itself cannot run here)."""
    from telescope.inference.vllm_backend import VLLMBackend, serve_command
    from telescope.runtime.serve import BACKEND_HOST, ServeOptions, create_backend, inference_context, model_folder

    options = ServeOptions(source=str(run_dir), backend="vllm", max_model_len=2048, dtype="bfloat16")
    folder = model_folder(options.source)
    context = inference_context(options, folder)
    backend = create_backend(options, context)
    assert isinstance(backend, VLLMBackend) and backend.vllm.enable_vllm_tracing is False
    line = serve_command(context, 0, backend.vllm, model_path=folder, executable="vllm", port=9000)
    assert line[:3] == ["vllm", "serve", str(run_dir / "checkpoints" / "step_00000003")]
    pairs = dict(zip(line[3::2], line[4::2], strict=False))
    assert pairs["--host"] == BACKEND_HOST and pairs["--max-model-len"] == "2048" and pairs["--dtype"] == "bfloat16"
    assert "--otlp-traces-endpoint" not in line


def test_the_context_length_defaults_to_the_models(run_dir: Path) -> None:
    from telescope.runtime.serve import ServeOptions, inference_context, model_folder

    folder = model_folder(str(run_dir))
    assert inference_context(ServeOptions(source=str(run_dir)), folder).max_model_len == 1024  # the tiny config's
    assert inference_context(ServeOptions(source=str(run_dir), max_model_len=64), folder).max_model_len == 64


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_without_vllm_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TELESCOPE_CACHE", str(tmp_path))
    code = main(["serve", "tiny:test", "--backend", "vllm", "--port", "0"])
    _, err = capsys.readouterr()
    assert code == 2 and "error: the vllm backend did not start:" in err and "pip install" in err
