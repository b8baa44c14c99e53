"""`telescope run` across two Ray nodes, built on this machine with a network namespace.

The head node runs in the default network namespace at 10.77.0.1 and a worker node
in a namespace of its own at 10.77.0.2 (10.77.N.1 and .2 when another test holds
10.77.0), joined by a veth pair: two Ray nodes with different addresses, as on a
real cluster, though they share the CPUs and the file system (the model cache and
the run directory). Custom resources pin the roles
(``node_a`` on the head, ``node_b`` on the worker): the trainer rank on the head, the
inference server on the worker. The run attaches with ``ray_address``; the weights
cross nodes through the broadcast transport over gloo (``weight_transport: auto``
picks it for this placement); evals and a checkpoint run.

The run is the CPU quick start (same seed; the warm start, RL steps and 64-problem eval it
had when measured, see ``STEPS_AS_MEASURED`` and ``EVALS_AS_MEASURED``), and it must learn
as the quick start does on one node. Measured (seed 0): the eval before
training is 1.031 on two nodes as on one (the warm start is deterministic; its
weights reach the other node's server), and after the 60 RL steps 1.141, 1.109 and
>= 1.111 in three two-node runs against 1.125, 1.141 in two one-node runs; the
training reward's mean over the last 20 steps exceeds the first 20's by +0.044 and
+0.056 on two nodes, +0.049 and +0.054 on one. Later (2026-11-27, the warm start as
since changed) the eval before was 1.078 on every run and after 1.094, 1.141 and 1.078
on two nodes (the trend +0.056, +0.074, +0.065): the eval's gain on 64 problems is about
+0.03 with a spread of about 0.025, so "the eval rises" failed one run in about ten.
Asserted: the training reward rises by at least ``TREND_MARGIN`` (the learning), and
the eval after the run is within ``EVAL_NOISE`` of the eval before (the server, on the
other node, evaluated the trained weights intact: weights corrupted on the way score
near 0).

Needs root (``ip netns``, a veth pair) and iproute2's ``ip``; skipped with the reason
otherwise. Everything started is stopped in the fixture, on failure too: the two
``ray start --block`` process groups, any process left in the namespace or using the
cluster's temporary directory (by PID), the namespace and the veth pair. ``ray stop``
is never used: it would stop every Ray cluster on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from telescope.recording.run_reader import RunReader

pytestmark = [pytest.mark.slow, pytest.mark.exclusive]  # asserts learning; its nodes share the 2 cores

#: Training reward (0..2), mean of the last 20 steps minus the first 20's, the run must gain at least
#: (measured +0.044 to +0.056 on one and two nodes; the difference's noise has a standard deviation of
#: about 0.016, so a run that learns as measured rarely fails it and one that does not rarely passes).
TREND_MARGIN = 0.02
#: How far below the eval before training the eval after may fall (64 problems, rewards 0..2: about
#: two and a half times the spread of the gain measured; see the module docstring).
EVAL_NOISE = 0.06

REPO = Path(__file__).resolve().parents[2]
QUICK_START = REPO / "configs" / "examples" / "countdown_tiny.yaml"
#: The quick start's eval as it was when the figures above were measured (64 held-out problems; the
#: quick start now evaluates 256). The reserved eval problems are left out of the warm start and the
#: training prompts, so their number changes the run; this keeps the measured run.
# The quick start's warm start (steps and learning rate), RL steps, prompts a step and group discarding when
# these figures were measured.
STEPS_AS_MEASURED = (
    "--warm_start_steps",
    "400",
    "--warm_start_learning_rate",
    "3.0e-3",
    "--number_of_steps",
    "60",
    "--discard_group_zero_advantage",
    "true",
    "--prompts_batch_size_for_trainer",
    "8",
)
EVALS_AS_MEASURED = (
    "[{name: countdown, num_samples: 64, separate_eval_samples: true, kwargs: {dataset_name: generated, "
    "num_samples: 2000, num_numbers: 2, max_number: 9, seed: 0, prompt_style: compact}}]"
)


def _subnet() -> str:
    """``10.77.N`` for the first N whose addresses no interface here holds (10.77.0 unless a test runs beside)."""
    import psutil

    held = {a.address for addresses in psutil.net_if_addrs().values() for a in addresses}
    for n in range(256):
        if not any(address.startswith(f"10.77.{n}.") for address in held):
            return f"10.77.{n}"
    raise RuntimeError("no free 10.77.N.0/24 subnet for the test's veth pair")


def _ray_executable() -> str | None:
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else shutil.which("ray")


def _skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces are a Linux feature"
    if os.geteuid() != 0:
        return "needs root to create a network namespace and a veth pair (run the tests as root, as CI does)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` (apt-get install iproute2; ./dev setup --all installs it as root)"
    if _ray_executable() is None:
        return "needs the `ray` command of this environment"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _processes_with(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(proc.name))
    return found


def _stop_group(process: subprocess.Popen[str] | None) -> None:
    """Stop a `ray start --block` (it stops its node on SIGTERM), then its process group."""
    if process is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def _wait_for_nodes(ray: str, address: str, env: dict[str, str], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        result = subprocess.run(
            [ray, "status", "--address", address], capture_output=True, text=True, env=env, timeout=60
        )
        status = result.stdout
        if "node_a" in status and "node_b" in status:
            return
        time.sleep(2)
    raise AssertionError(f"the two Ray nodes did not come up within {timeout:.0f} s:\n{status[-2000:]}")


@dataclass
class Cluster:
    address: str  # the head's GCS, host:port
    head_ip: str
    worker_ip: str
    env: dict[str, str]


@pytest.fixture
def two_node_cluster(tmp_path: Path) -> Iterator[Cluster]:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    ray = _ray_executable()
    assert ray is not None
    tag = f"ts{os.getpid() % 100000}"
    namespace, head_link, worker_link = f"{tag}ns", f"{tag}h", f"{tag}w"
    # a short path: Ray's sockets live under it (a Unix socket path has at most 107 bytes)
    temp_dir = tempfile.mkdtemp(prefix="tsray-", dir="/tmp")
    # No drain on SIGTERM: Ray's `ray start --block` would otherwise ask the GCS to drain its node for up to
    # 30 s, and the GCS gets the same SIGTERM (the whole process group), so every teardown waited the full 30 s.
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    }
    env.pop("RAY_ADDRESS", None)
    subnet = _subnet()
    head_ip, worker_ip = f"{subnet}.1", f"{subnet}.2"
    head = worker = None
    files = contextlib.ExitStack()
    try:
        try:
            _ip("netns", "add", namespace)
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot create a network namespace here: {exc.stderr.strip()}")
        _ip("link", "add", head_link, "type", "veth", "peer", "name", worker_link)
        _ip("link", "set", worker_link, "netns", namespace)
        _ip("addr", "add", f"{head_ip}/24", "dev", head_link)
        _ip("link", "set", head_link, "up")
        _ip("netns", "exec", namespace, "ip", "addr", "add", f"{worker_ip}/24", "dev", worker_link)
        _ip("netns", "exec", namespace, "ip", "link", "set", worker_link, "up")
        _ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        port = _free_port(head_ip)
        logs = tmp_path / "ray-logs"
        logs.mkdir()
        head_log = files.enter_context(open(logs / "head.log", "w"))  # noqa: SIM115  # closed by the stack
        worker_log = files.enter_context(open(logs / "worker.log", "w"))  # noqa: SIM115
        head = subprocess.Popen(
            [
                ray,
                "start",
                "--block",
                "--head",
                "--node-ip-address",
                head_ip,
                "--port",
                str(port),
                "--num-cpus",
                "1",
                "--resources",
                json.dumps({"node_a": 1}),
                "--include-dashboard",
                "false",
                "--ray-client-server-port",
                str(_free_port(head_ip)),
                "--dashboard-agent-listen-port",
                str(_free_port("")),
                "--temp-dir",
                temp_dir,
                "--disable-usage-stats",
            ],
            stdout=head_log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            text=True,
        )
        address = f"{head_ip}:{port}"
        deadline = time.monotonic() + 120
        while True:  # the worker node joins once the head's GCS answers
            with contextlib.suppress(OSError), socket.create_connection((head_ip, port), timeout=2):
                break
            assert head.poll() is None, (logs / "head.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the head node did not start"
            time.sleep(1)
        worker = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                namespace,
                ray,
                "start",
                "--block",
                "--address",
                address,
                "--node-ip-address",
                worker_ip,
                "--num-cpus",
                "1",
                "--resources",
                json.dumps({"node_b": 1}),
                "--disable-usage-stats",
            ],
            stdout=worker_log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            text=True,
        )
        _wait_for_nodes(ray, address, env)
        yield Cluster(address, head_ip, worker_ip, env)
    finally:
        _stop_group(worker)
        _stop_group(head)
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        for pid in _processes_with(temp_dir):  # this cluster's processes only (their command names its folder)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.SubprocessError):
            _ip("netns", "del", namespace)
        with contextlib.suppress(subprocess.SubprocessError):
            _ip("link", "del", head_link)  # gone with the namespace, normally
        shutil.rmtree(temp_dir, ignore_errors=True)
        files.close()


@pytest.mark.timeout(1800)  # the quick start takes about 5 minutes on 2 free cores; this bounds a hang
def test_a_run_across_two_nodes_completes_and_learns(two_node_cluster: Cluster, tmp_path: Path) -> None:
    cluster = two_node_cluster
    address, env, head_ip, worker_ip = cluster.address, cluster.env, cluster.head_ip, cluster.worker_ip
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-c",
        "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))",
        "run",
        str(QUICK_START),
        "--run_dir",
        str(run_dir),
        "--ray_address",
        address,
        "--ray_trainer_resources_per_worker",
        "{node_a: 1}",
        "--ray_inference_resources_per_worker",
        "{node_b: 1}",
        "--weight_transport",
        "auto",
        "--checkpoint_every",
        "30",
        "--inference_base_port",
        "8251",
        "--evals",
        EVALS_AS_MEASURED,
        *STEPS_AS_MEASURED,
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=1500, env={**env, "TELESCOPE_PROGRESS": "lines"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reader = RunReader(run_dir)
    assert reader.status()["status"] == "completed"
    events = reader.events()

    # where Ray put each worker, as the run recorded it: the server on the worker node, reached at its address
    placed = {e["component"]: e for e in events if e["kind"] == "worker.placed"}
    assert placed["inference"]["node"] == worker_ip and placed["inference"]["url"].startswith(f"http://{worker_ip}:")
    assert placed["trainer"]["node"] == head_ip
    scraped = {e["url"] for e in events if e["kind"] == "infra.inference"}  # the orchestrator reached it there
    assert scraped and all(url.startswith(f"http://{worker_ip}:") for url in scraped)
    assert {e["node"] for e in events if e["kind"] == "infra.system"} == {head_ip, worker_ip}
    log = (run_dir / "logs" / "orchestrator.log").read_text()
    assert "weight transport nccl connected" in log  # auto: shared memory cannot cross nodes

    # the weights crossed the nodes at every step: the server generated with the trainer's weights
    metrics = reader.metrics()
    assert len(metrics) == 60
    assert metrics[0]["kl_divergence_inference"] < 1e-3
    assert {e["version"] for e in events if e["kind"] == "weights.load"} == set(range(61))
    assert {e["version"] for e in events if e["kind"] == "weights.send"} == set(range(61))

    # a checkpoint, written by the trainer rank on the head
    assert (run_dir / "checkpoints" / "step_00000060" / "model.safetensors").exists()

    # it learns as the one-node quick start does (see the module docstring for the figures)
    evals = {e["phase"]: e["metrics"] for e in reader.evals()}
    before = evals["before"]["eval/countdown/reward_mean"]
    after = evals["after"]["eval/countdown/reward_mean"]
    rewards = [m["reward/mean"] for m in metrics]
    trend = statistics.mean(rewards[-20:]) - statistics.mean(rewards[:20])
    print(f"two nodes: eval reward {before:.3f} -> {after:.3f}, training reward +{trend:.3f} (last 20 vs first 20)")
    assert before > 0.5, before  # the warm start (on the head) reached the server on the worker node
    assert after > before - EVAL_NOISE, (before, after)
    assert trend >= TREND_MARGIN, rewards
