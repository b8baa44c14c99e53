"""The system sampler (psutil for real, NVML faked), torch memory on CPU, the periodic sampler."""

from __future__ import annotations

import logging
import sys
import time
import types
from pathlib import Path
from typing import Any

import psutil
import pytest

from telescope.recording.system_metrics import GB, PeriodicSampler, SystemSampler, torch_memory_sample

CPU_FIELDS = {
    "cpu_utilization_percent",
    "cpu_per_core_percent",
    "cpu_count",
    "system_memory_used_gb",
    "system_memory_available_gb",
    "system_memory_total_gb",
    "system_memory_percent",
    "disk_used_gb",
    "disk_total_gb",
    "disk_percent",
}


class NVMLError(Exception):
    pass


def fake_pynvml(gpus: list[dict[str, Any]], fail_init: bool = False) -> types.ModuleType:
    """A pynvml stand-in with the calls the sampler makes; a GPU dict lacking ``power`` raises NotSupported."""
    module = types.ModuleType("pynvml")
    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    module.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    module.shutdowns = 0  # type: ignore[attr-defined]

    def init() -> None:
        if fail_init:
            raise NVMLError("Driver Not Loaded")

    def shutdown() -> None:
        module.shutdowns += 1  # type: ignore[attr-defined]

    def power(handle: dict[str, Any]) -> int:
        if "power" not in handle:
            raise NVMLError("Not Supported")
        return int(handle["power"] * 1000)

    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlShutdown = shutdown  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]  # type: ignore[attr-defined]
    module.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=h["util"], memory=h["mem_util"])  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        used=h["used"], total=h["total"], free=h["total"] - h["used"]
    )
    module.nvmlDeviceGetPowerUsage = power  # type: ignore[attr-defined]
    module.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000  # type: ignore[attr-defined]
    module.nvmlDeviceGetTemperature = lambda h, sensor: h["temp"]  # type: ignore[attr-defined]
    return module


def test_cpu_memory_disk_and_network_fields_come_from_psutil(tmp_path: Path) -> None:
    sampler = SystemSampler(str(tmp_path), gpus=False)
    first = sampler.sample()
    assert CPU_FIELDS <= set(first)
    assert "disk_read_mb_s" not in first or first["disk_read_mb_s"] >= 0  # rates need a previous sample
    assert len(first["cpu_per_core_percent"]) == psutil.cpu_count()
    assert all(0.0 <= x <= 100.0 for x in first["cpu_per_core_percent"])
    assert first["system_memory_total_gb"] == pytest.approx(psutil.virtual_memory().total / GB)
    assert first["disk_total_gb"] == pytest.approx(psutil.disk_usage(str(tmp_path)).total / GB)
    second = sampler.sample()
    assert {"network_sent_mb_s", "network_recv_mb_s"} <= set(second)
    assert second["network_sent_mb_s"] >= 0 and second["network_recv_mb_s"] >= 0
    assert not any(k.startswith("gpu_") for k in second)


def test_a_missing_disk_path_falls_back_to_the_root(tmp_path: Path) -> None:
    sampler = SystemSampler(str(tmp_path / "not-on-this-node"), gpus=False)
    assert sampler.disk_path == "/"
    assert sampler.sample()["disk_total_gb"] == pytest.approx(psutil.disk_usage("/").total / GB)


def test_gpu_fields_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [
        {"util": 87, "mem_util": 40, "used": 30 * GB, "total": 80 * GB, "power": 350.5, "temp": 61},
        {"util": 3, "mem_util": 1, "used": 1 * GB, "total": 80 * GB, "temp": 35},  # no power reading
    ]
    module = fake_pynvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    sampler = SystemSampler()
    sample = sampler.sample()
    assert sample["gpu_count"] == 2
    assert sample["gpu_0_utilization_percent"] == 87.0
    assert sample["gpu_0_memory_bandwidth_utilization_percent"] == 40.0
    assert sample["gpu_0_memory_used_gb"] == pytest.approx(30.0)
    assert sample["gpu_0_memory_total_gb"] == pytest.approx(80.0)
    assert sample["gpu_0_memory_used_percent"] == pytest.approx(37.5)
    assert sample["gpu_0_power_w"] == pytest.approx(350.5) and sample["gpu_0_power_limit_w"] == 700.0
    assert sample["gpu_0_temperature_c"] == 61.0
    assert sample["gpu_1_utilization_percent"] == 3.0 and sample["gpu_1_temperature_c"] == 35.0
    assert "gpu_1_power_w" not in sample and sample["gpu_1_power_limit_w"] == 700.0  # the unsupported field only
    assert CPU_FIELDS <= set(sample)
    sampler.close()
    assert module.shutdowns == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", ["no driver", "no package", "no gpu"])
def test_no_gpu_fields_and_no_error_without_nvml(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if case == "no package":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    else:
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], fail_init=case == "no driver"))
    sample = SystemSampler().sample()
    assert CPU_FIELDS <= set(sample)
    assert not any(k.startswith("gpu_") for k in sample)


def test_torch_memory_on_cpu_is_the_process_rss() -> None:
    import torch

    sample = torch_memory_sample(None)
    assert sample["device"] == "cpu"
    assert sample["process_rss_gb"] == pytest.approx(psutil.Process().memory_info().rss / GB, rel=0.5)
    if not torch.cuda.is_available():  # a CUDA device asked for on a machine without one: still the RSS
        assert torch_memory_sample(0)["device"] == "cpu"


def test_periodic_sampler_buffers_timestamped_samples_until_drained() -> None:
    values = iter(range(100))
    sampler = PeriodicSampler(lambda: {"value": next(values)}, 60.0, max_samples=3, name="test")
    before = time.time()
    for _ in range(5):
        sampler.sample_once()
    drained = sampler.drain()
    assert [s["value"] for s in drained] == [2, 3, 4]  # the newest max_samples
    assert sampler.dropped == 2
    assert all(before <= s["time"] <= time.time() for s in drained)
    assert sampler.drain() == []


def test_periodic_sampler_survives_a_failing_sample(caplog: pytest.LogCaptureFixture) -> None:
    calls = {"n": 0}

    def flaky() -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] % 2:
            raise RuntimeError("sensor gone")
        return {"ok": True}

    sampler = PeriodicSampler(flaky, 60.0, name="flaky")
    with caplog.at_level(logging.DEBUG, logger="telescope.recording.system_metrics"):
        for _ in range(4):
            sampler.sample_once()
    assert [s["ok"] for s in sampler.drain()] == [True, True]
    assert sampler.failures == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "flaky" in warnings[0].getMessage()


def test_periodic_sampler_thread_samples_at_its_interval_until_stopped() -> None:
    sampler = PeriodicSampler(lambda: {"x": 1}, 0.01, name="thread").start()
    deadline = time.monotonic() + 30
    samples: list[dict[str, Any]] = []
    while len(samples) < 3 and time.monotonic() < deadline:
        samples += sampler.drain()
        time.sleep(0.01)
    sampler.stop()
    assert len(samples) >= 3
    times = [s["time"] for s in samples]
    assert times == sorted(times)
    sampler.drain()
    time.sleep(0.05)
    assert sampler.drain() == []  # stopped: nothing more
    with pytest.raises(ValueError):
        PeriodicSampler(dict, 0)
