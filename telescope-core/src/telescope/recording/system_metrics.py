"""What a node and a process use: CPU, memory, disk, network, GPUs (NVML), torch memory.

Three pieces, none of them tied to Ray (the run's Ray glue is :mod:`telescope.runtime.monitoring`):

- :class:`SystemSampler` reads one node: psutil for CPU (total and per-core busy %),
  memory, the disk holding ``disk_path`` (usage) and all disks (read/write rates),
  the network (send/receive rates); NVML (``pynvml`` from ``nvidia-ml-py``,
  imported on first use) for each GPU of the node: utilisation, memory-bandwidth
  utilisation, memory used/total, power and its limit, temperature. Without
  ``pynvml``, without a driver or without GPUs there are simply no ``gpu_*``
  fields; a field a GPU does not support (power on some boards) is left out.
- :func:`torch_memory_sample` reads one process: torch's CUDA allocator
  (allocated, reserved, peak allocated) when CUDA is initialised, else the
  process's resident memory.
- :class:`PeriodicSampler` calls a sampling function every ``interval_s`` in a
  daemon thread and keeps the timestamped samples in a bounded buffer until
  :meth:`~PeriodicSampler.drain` takes them (the orchestrator drains the buffers
  of remote actors periodically, so sampling never waits on the network).

Field names (flat, JSON numbers; ``gpu_<i>_`` uses NVML's index on the node, which is
not the ``CUDA_VISIBLE_DEVICES`` order of a process): ``cpu_utilization_percent``,
``cpu_per_core_percent`` (a list), ``cpu_count``, ``load_avg_1m``,
``system_memory_{used,available,total}_gb``, ``system_memory_percent``,
``disk_{used,total}_gb``, ``disk_percent``, ``disk_{read,write}_mb_s``,
``network_{sent,recv}_mb_s``, ``gpu_count``, ``gpu_<i>_utilization_percent``,
``gpu_<i>_memory_bandwidth_utilization_percent``, ``gpu_<i>_memory_{used,total}_gb``,
``gpu_<i>_memory_used_percent``, ``gpu_<i>_power_w``, ``gpu_<i>_power_limit_w``,
``gpu_<i>_temperature_c``. Rates are over the time since the previous sample, so the
first sample of a sampler has none.

Limits: psutil's CPU percentages compare with the previous call *in this process*
(module-level state), so keep one :class:`SystemSampler` per process. A sample takes
well under a millisecond plus one NVML query per GPU field.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

log = logging.getLogger(__name__)

GB = float(1024**3)
MB = float(1024**2)
Sample = dict[str, Any]


class _Nvml:
    """The node's GPUs through NVML; empty when pynvml, the driver or the GPUs are missing."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.nvml = pynvml
        except Exception as exc:  # ImportError, NVMLError (no driver, no GPU), ...
            log.debug("no GPU metrics: %s: %s", type(exc).__name__, exc)
            self.handles = []

    def sample(self) -> Sample:
        if not self.handles:
            return {}
        out: Sample = {"gpu_count": len(self.handles)}
        readers = (self._utilization, self._memory, self._power, self._power_limit, self._temperature)
        for index, handle in enumerate(self.handles):
            for read in readers:
                try:
                    out.update(read(handle, f"gpu_{index}_"))
                except Exception as exc:  # a field this GPU does not support (NVMLError_NotSupported, ...)
                    log.debug("GPU %d: %s unavailable: %s", index, read.__name__, exc)
        return out

    def _utilization(self, handle: Any, p: str) -> Sample:
        rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
        return {
            p + "utilization_percent": float(rates.gpu),
            p + "memory_bandwidth_utilization_percent": float(rates.memory),
        }

    def _memory(self, handle: Any, p: str) -> Sample:
        info = self.nvml.nvmlDeviceGetMemoryInfo(handle)
        total = float(info.total)
        return {
            p + "memory_used_gb": info.used / GB,
            p + "memory_total_gb": total / GB,
            p + "memory_used_percent": 100.0 * info.used / total if total else 0.0,
        }

    def _power(self, handle: Any, p: str) -> Sample:
        return {p + "power_w": self.nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0}  # milliwatts

    def _power_limit(self, handle: Any, p: str) -> Sample:
        return {p + "power_limit_w": self.nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0}

    def _temperature(self, handle: Any, p: str) -> Sample:
        return {p + "temperature_c": float(self.nvml.nvmlDeviceGetTemperature(handle, self.nvml.NVML_TEMPERATURE_GPU))}

    def close(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown failed: %s", exc)
            self.nvml, self.handles = None, []


class SystemSampler:
    """One node's resource use (see the module docstring for the fields).

    ``gpus=False`` skips NVML. ``disk_path``: whose file system ``disk_*`` usage
    describes (the run directory, or ``/`` when it does not exist on this node).
    """

    def __init__(self, disk_path: str = "/", *, gpus: bool = True) -> None:
        self.disk_path = disk_path if os.path.exists(disk_path) else "/"
        self._nvml = _Nvml() if gpus else None
        psutil.cpu_percent()  # the first call only sets the reference point
        psutil.cpu_percent(percpu=True)
        self._last_time = time.monotonic()
        self._last_disk = psutil.disk_io_counters()
        self._last_net = psutil.net_io_counters()

    def sample(self) -> Sample:
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-9)
        memory = psutil.virtual_memory()
        out: Sample = {
            "cpu_utilization_percent": float(psutil.cpu_percent()),
            "cpu_per_core_percent": [float(x) for x in psutil.cpu_percent(percpu=True)],
            "cpu_count": psutil.cpu_count() or 0,
            "system_memory_used_gb": (memory.total - memory.available) / GB,
            "system_memory_available_gb": memory.available / GB,
            "system_memory_total_gb": memory.total / GB,
            "system_memory_percent": float(memory.percent),
        }
        with contextlib.suppress(OSError):  # no load average on this platform
            out["load_avg_1m"] = float(os.getloadavg()[0])
        try:
            usage = psutil.disk_usage(self.disk_path)
            out.update(disk_used_gb=usage.used / GB, disk_total_gb=usage.total / GB, disk_percent=float(usage.percent))
        except OSError as exc:
            log.debug("disk usage of %s unavailable: %s", self.disk_path, exc)
        disk = psutil.disk_io_counters()  # None where the kernel exposes no disk statistics
        if disk is not None and self._last_disk is not None:
            out["disk_read_mb_s"] = max(0, disk.read_bytes - self._last_disk.read_bytes) / MB / elapsed
            out["disk_write_mb_s"] = max(0, disk.write_bytes - self._last_disk.write_bytes) / MB / elapsed
        net = psutil.net_io_counters()
        if net is not None and self._last_net is not None:
            out["network_sent_mb_s"] = max(0, net.bytes_sent - self._last_net.bytes_sent) / MB / elapsed
            out["network_recv_mb_s"] = max(0, net.bytes_recv - self._last_net.bytes_recv) / MB / elapsed
        self._last_time, self._last_disk, self._last_net = now, disk, net
        if self._nvml is not None:
            out.update(self._nvml.sample())
        return out

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()


def torch_memory_sample(cuda_device: int | None = None) -> Sample:
    """This process's memory as torch sees it.

    With ``cuda_device`` set and CUDA initialised: ``torch_allocated_gb``,
    ``torch_reserved_gb``, ``torch_max_allocated_gb`` of that device (reading the
    allocator's statistics does not initialise CUDA). Otherwise the process's
    resident memory, ``process_rss_gb`` (a CPU trainer's tensors live there).
    """
    import torch

    if cuda_device is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return {
            "device": f"cuda:{cuda_device}",
            "torch_allocated_gb": torch.cuda.memory_allocated(cuda_device) / GB,
            "torch_reserved_gb": torch.cuda.memory_reserved(cuda_device) / GB,
            "torch_max_allocated_gb": torch.cuda.max_memory_allocated(cuda_device) / GB,
        }
    return {"device": "cpu", "process_rss_gb": psutil.Process().memory_info().rss / GB}


class PeriodicSampler:
    """Calls ``sample()`` every ``interval_s`` in a daemon thread; :meth:`drain` takes the samples.

    Each kept sample is ``{"time": <UNIX seconds>, **sample()}``. Ticks follow a fixed
    schedule (no drift); when a sample overruns, the missed ticks are skipped. The
    buffer keeps the newest ``max_samples``; older ones are dropped and counted in
    :attr:`dropped` (nobody drained for a long time). A failing ``sample()`` is
    logged (the first time as a warning) and sampling goes on.
    """

    def __init__(
        self, sample: Callable[[], Sample], interval_s: float, *, max_samples: int = 10_000, name: str = "sampler"
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.sample = sample
        self.interval_s = float(interval_s)
        self.name = name
        self.dropped = 0
        self.failures = 0
        self._buffer: collections.deque[Sample] = collections.deque(maxlen=max_samples)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PeriodicSampler:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"telescope-{self.name}", daemon=True)
            self._thread.start()
        return self

    def sample_once(self) -> None:
        """Take one sample now (also what the thread does on every tick)."""
        try:
            fields = self.sample()
        except Exception as exc:
            self.failures += 1
            if self.failures == 1:
                log.warning("%s: sampling failed (later failures are logged at debug level)", self.name, exc_info=True)
            else:
                log.debug("%s: sampling failed: %s", self.name, exc)
            return
        with self._lock:
            if len(self._buffer) == self._buffer.maxlen:
                self.dropped += 1
            self._buffer.append({"time": time.time(), **fields})

    def drain(self) -> list[Sample]:
        """The samples taken since the last drain, oldest first."""
        with self._lock:
            samples = list(self._buffer)
            self._buffer.clear()
        return samples

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            next_tick += self.interval_s
            now = time.monotonic()
            if next_tick < now:  # overran: skip the missed ticks
                next_tick = now + self.interval_s - ((now - next_tick) % self.interval_s)
            self._stop.wait(next_tick - now)
