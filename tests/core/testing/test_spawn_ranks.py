"""spawn_ranks: ranks forked from a preloaded fork server still get the caller's environment, errors and stderr;
a rank killed by a signal leaves its Python stack in the error."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from telescope.testing.trainer import spawn_ranks


def environment_worker(rank: int, world_size: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    seen = {
        "probe": os.environ.get("TELESCOPE_SPAWN_PROBE"),
        "port": os.environ.get("MASTER_PORT"),
        "world": dist.get_world_size(),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
    dist.barrier()
    dist.destroy_process_group()


def failing_worker(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")


def chatty_worker(rank: int, world_size: int) -> None:
    print(f"rank {rank} of {world_size} writes to stderr", file=sys.stderr)


def aborting_worker(rank: int, world_size: int) -> None:
    if rank == 1:
        print("rank 1 is about to abort", file=sys.stderr, flush=True)
        os.abort()  # what glibc does on a corrupted heap ("malloc_consolidate(): unaligned fastbin chunk detected")


def test_each_rank_sees_the_environment_as_it_is_at_the_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("first", "second"):  # the second call reuses the fork server, started during the first
        monkeypatch.setenv("TELESCOPE_SPAWN_PROBE", value)
        spawn_ranks(environment_worker, 2, str(tmp_path))
        seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
        assert [s["probe"] for s in seen] == [value, value]
        assert seen[0]["port"] == seen[1]["port"] and seen[0]["port"] and [s["world"] for s in seen] == [2, 2]
    assert "MASTER_PORT" not in os.environ  # the caller's environment is left as it was


def test_an_error_in_a_rank_fails_the_call() -> None:
    with pytest.raises(Exception, match="rank 1 fails on purpose"):
        spawn_ranks(failing_worker, 2)


def test_each_ranks_stderr_reaches_the_caller(capfd: pytest.CaptureFixture[str]) -> None:
    spawn_ranks(chatty_worker, 2)
    err = capfd.readouterr().err
    assert "rank 0 of 2 writes to stderr" in err and "rank 1 of 2 writes to stderr" in err


def test_a_rank_killed_by_a_signal_leaves_its_stack_and_stderr_in_the_error() -> None:
    with pytest.raises(Exception, match="SIGABRT") as caught:
        spawn_ranks(aborting_worker, 2)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "rank 1 is about to abort" in notes
    assert "Fatal Python error: Aborted" in notes and "in aborting_worker" in notes  # faulthandler's stack
