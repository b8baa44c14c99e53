"""Each worker uses the GPUs Ray assigned it: assignments as Ray makes them, faked, on the CPU.

Ray gives an actor asking for ``num_gpus`` a set of ids
(``get_accelerator_ids()["GPU"]``) and narrows its ``CUDA_VISIBLE_DEVICES`` to them
(or leaves every device visible with ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``).
The cases below are what a 4-GPU (or 8-GPU) node hands out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from telescope.api.context import InferenceContext
from telescope.inference.embedded.backend import EmbeddedBackend
from telescope.inference.vllm_backend import serve_env
from telescope.system.devices import embedded_device, local_cuda_index, ray_gpu_ids, worker_visible_devices

#: (workers x TP): per worker, the ids Ray assigns and the CUDA_VISIBLE_DEVICES it sets in the actor.
RAY_ASSIGNMENTS = {
    "2 workers x TP 1": (1, [(("0",), "0"), (("1",), "1")]),
    "1 worker x TP 2": (2, [(("0", "1"), "0,1")]),
    "2 workers x TP 2": (2, [(("0", "1"), "0,1"), (("2", "3"), "2,3")]),
    # Ray does not hand out ids in worker order: the second worker may get the lower ones
    "2 workers x TP 2, out of order": (2, [(("2", "3"), "2,3"), (("0", "1"), "0,1")]),
    # a node started with CUDA_VISIBLE_DEVICES=4,5,6,7: Ray's ids are those values
    "2 workers x TP 2 on a narrowed node": (2, [(("4", "5"), "4,5"), (("6", "7"), "6,7")]),
}


@pytest.mark.parametrize("case", list(RAY_ASSIGNMENTS))
def test_a_vllm_server_gets_exactly_the_gpus_ray_assigned_its_worker(case: str) -> None:
    tp, workers = RAY_ASSIGNMENTS[case]
    for index, (ids, actor_visible) in enumerate(workers):
        context = InferenceContext(model="m", tensor_parallel_size=tp, gpu_ids=ids)
        env = serve_env(context, index, base={"CUDA_VISIBLE_DEVICES": actor_visible})
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(ids), (case, index)
        # with RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES the actor sees the whole node: the same devices
        env = serve_env(context, index, base={})
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(ids), (case, index)


def test_the_old_remap_against_the_narrowed_list_is_gone() -> None:
    """Before: worker 1 (TP 1) asked for index 1 of the actor's one visible device and raised."""
    context = InferenceContext(model="m", tensor_parallel_size=1, gpu_ids=("1",))
    assert serve_env(context, 1, base={"CUDA_VISIBLE_DEVICES": "1"})["CUDA_VISIBLE_DEVICES"] == "1"


def test_an_assignment_of_the_wrong_size_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"assigned 1 GPUs .* inference_tensor_parallel_size=2"):
        worker_visible_devices(("3",), "3", 0, 2)


def test_without_ray_worker_i_takes_its_share_of_the_visible_devices() -> None:
    assert worker_visible_devices(None, None, 1, 2) == "2,3"
    assert worker_visible_devices(None, "4,5,6,7", 1, 2) == "6,7"
    assert worker_visible_devices((), "4,5,6,7", 0, 1) == "4"
    with pytest.raises(ValueError, match=r"needs GPUs 2\.\.3"):
        worker_visible_devices(None, "0,1", 1, 2)
    context = InferenceContext(model="m", tensor_parallel_size=2)
    kept = serve_env(context, 1, base={"CUDA_VISIBLE_DEVICES": "3", "TELESCOPE_VLLM_KEEP_DEVICES": "1"})
    assert kept["CUDA_VISIBLE_DEVICES"] == "3"


@pytest.mark.parametrize(
    ("ids", "visible", "expected"),
    [
        (("0",), "0", 0),  # rank 0 of 2 x 1 GPU: Ray narrowed the actor to its GPU
        (("1",), "1", 0),  # rank 1: still cuda:0 in its own process (not rank % count, not 1)
        (("3",), None, 3),  # nothing hidden: the id is the index
        (("6",), "4,5,6,7", 2),  # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES on a narrowed node
        (None, "0,1", None),  # not under Ray: the backend's LOCAL_RANK / rank rule
    ],
)
def test_a_trainer_rank_uses_the_cuda_device_ray_assigned(
    ids: tuple[str, ...] | None, visible: str | None, expected: int | None
) -> None:
    assert local_cuda_index(ids, visible) == expected


def test_a_trainer_assignment_outside_the_visible_devices_is_an_error() -> None:
    with pytest.raises(ValueError, match="not among"):
        local_cuda_index(("5",), "0,1")
    with pytest.raises(ValueError, match="one GPU"):
        local_cuda_index(("0", "1"), "0,1")


@pytest.mark.parametrize("case", list(RAY_ASSIGNMENTS))
def test_the_embedded_engine_uses_its_workers_first_assigned_gpu(case: str) -> None:
    _, workers = RAY_ASSIGNMENTS[case]
    for index, (ids, _) in enumerate(workers):
        assert embedded_device(ids, index, device_count=len(ids)) == "cuda:0"  # its process sees only `ids`
    assert embedded_device(None, 3, device_count=2) == "cuda:1"  # no scheduler: i mod count
    assert embedded_device(None, 0, device_count=0) == "cpu"


def test_the_embedded_server_sees_only_the_assigned_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The child's environment and device, with CUDA faked (nothing is started)."""
    import telescope.inference.embedded.backend as backend_module

    started: dict[str, object] = {}

    def fake_spawn(command: list[str], env: dict[str, str], log_file: object) -> object:
        started["env"], started["command"] = env, command
        raise RuntimeError("not started in this test")

    monkeypatch.setattr(backend_module, "spawn", fake_spawn)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    context = InferenceContext(model="m", gpu_ids=("2",))
    with pytest.raises(RuntimeError, match="not started"):
        EmbeddedBackend(context).start_server(1, tmp_path)
    env = started["env"]
    assert isinstance(env, dict) and env["CUDA_VISIBLE_DEVICES"] == "2"
    engine = (tmp_path / "logs" / "inference_1_engine.json").read_text()
    assert '"device": "cuda:0"' in engine


def test_outside_ray_there_is_no_assignment() -> None:
    assert ray_gpu_ids() is None
    assert dataclasses.replace(InferenceContext(model="m"), gpu_ids=("0",)).gpu_ids == ("0",)
