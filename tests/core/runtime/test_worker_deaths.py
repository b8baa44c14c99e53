"""A trainer rank killed by a signal is reported as killed, not with Ray's out-of-memory guess."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import ray
from ray.core.generated.common_pb2 import ActorDiedErrorContext  # type: ignore[attr-defined]  # protobuf, no stubs

from telescope.config import load_config
from telescope.orchestrator.services import TrainerFailure
from telescope.runtime.ray_services import RayServices
from telescope.runtime.worker_deaths import death_reason, oom_kills

#: What Ray says of any actor whose process vanished, a SIGKILL by hand included.
RAY_GUESS = (
    "Worker unexpectedly exits with a connection error code 2. End of file. There are some potential root causes. "
    "(1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force is called."
)


def _actor_died(message: str = RAY_GUESS) -> ray.exceptions.ActorDiedError:
    context = ActorDiedErrorContext(error_message=message, class_name="TrainerWorker", actor_id=b"0" * 16, pid=4321)
    return ray.exceptions.ActorDiedError(context)


def _here() -> list[dict[str, str]]:
    return [{"node": ray.util.get_node_ip_address()}]


def test_a_rank_that_vanished_with_no_oom_kill_on_the_node_reads_as_killed_not_out_of_memory(tmp_path: Path) -> None:
    config = load_config(None, ["--model", "tiny:test", "--environments", "[{name: countdown}]"]).config
    services = RayServices(config, tmp_path)
    services.trainer_placements = _here()

    async def collect() -> None:
        died: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        died.set_exception(_actor_died())
        await services._collect("training step 3", [died])

    with pytest.raises(TrainerFailure) as failure:
        asyncio.run(collect())
    message = str(failure.value)
    assert message.startswith("trainer rank 0 died during training step 3: its process was killed by a signal")
    assert "OOM" not in message and "memory usage" not in message and "ran out of memory" not in message


@pytest.mark.skipif(oom_kills() is None, reason="no oom_kill counter in /proc/vmstat here")
def test_an_oom_kill_on_the_node_since_the_start_reads_as_likely_out_of_memory() -> None:
    before = oom_kills()
    assert before is not None
    assert "likely ran out of memory" in death_reason(_actor_died(), before - 1, _here())
    assert "killed by a signal" in death_reason(_actor_died(), before, _here())


def test_rays_memory_monitor_and_another_node_are_said_as_such() -> None:
    memory = _actor_died("Task was killed due to the node running low on memory.")
    assert "ran out of memory" in death_reason(memory, oom_kills(), _here())
    elsewhere = death_reason(_actor_died(), oom_kills(), [{"node": "10.255.0.9"}])
    assert "another node" in elsewhere and "memory" not in elsewhere
