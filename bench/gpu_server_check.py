"""The embedded server as a run starts it, on a GPU machine: it chooses the GPU itself.

The embedded backend leaves an unassigned worker's device to the server process
(``device: "auto"`` and ``--worker-index``; see
:meth:`telescope.inference.embedded.backend.EmbeddedBackend._device`). This starts one
server through the backend, as an inference worker does, asks it for a completion, and
prints what it chose, the engine settings it was given and the GPU memory its process
holds. Run by hand (``bench/gpu_checks.sh`` runs it); on a machine without a GPU it
prints ``(cpu)``.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from telescope.api.context import InferenceContext
from telescope.inference.embedded.backend import EmbeddedBackend
from telescope.models.tiny import PRESETS, build_tiny_model
from telescope.schema.config import TelescopeConfig


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="telescope-gpu-server-"))
    model = build_tiny_model(root / "model", PRESETS["small"])
    config = TelescopeConfig.model_validate(
        {
            "environments": [{"name": "countdown"}],
            "model": str(model),
            "max_model_len": 256,
            "max_tokens": 32,
            "seq_len": 256,
            "inference_host": "127.0.0.1",
        }
    )
    backend = EmbeddedBackend(InferenceContext.from_config(config))
    print(f"the backend's device: {backend._device()}; this process sees {torch.cuda.device_count()} GPU(s)")
    start = time.perf_counter()
    server = backend.start_server(0, run_dir=root / "run")
    print(f"server healthy after {time.perf_counter() - start:.1f} s")
    try:
        body = {"prompt": [5, 6, 7], "max_tokens": 8, "ignore_eos": True, "seed": 1}
        request = urllib.request.Request(
            f"{server.address.base_url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        reply = json.loads(urllib.request.urlopen(request, timeout=60).read())
        print(f"completion (seed 1): {reply['choices'][0]['text']!r}")
        logs = root / "run" / "logs"
        print("engine settings' device:", json.loads((logs / "inference_0_engine.json").read_text())["device"])
        print(*(line for line in (logs / "inference_0.log").read_text().splitlines() if "serving" in line))
        if torch.cuda.is_available():
            held = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            print(f"server pid {server.process.pid}; GPU processes (pid, memory): {held}")  # type: ignore[attr-defined]
    finally:
        server.stop()


if __name__ == "__main__":
    main()
