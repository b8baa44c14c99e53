"""metadata.json and the code snapshot of a run directory."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, ClassVar

from telescope.api.environment import BaseEnvironment
from telescope.api.records import RewardResult, Sample
from telescope.config.loader import load_config
from telescope.plugins.facade import Plugins
from telescope.plugins.manager import TelescopePluginManager
from telescope.plugins.registry import PluginKind, Registrar, Registry
from telescope.recording.run_metadata import write_run_metadata


class Ranged(BaseEnvironment):
    metrics_ranges: ClassVar[dict[str, dict[str, float]]] = {"correct": {"min": 0.0, "max": 1.0}}

    def load_dataset(self) -> list[Sample]:
        return [Sample(prompt="p", sample_id="s0")]

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return RewardResult(total_reward=0.0)


def plugins() -> Plugins:
    registry = Registry()
    Registrar(registry, PluginKind.ENVIRONMENT, "tests", "telescope-tests", "1.2.3")("ranged", Ranged)
    return Plugins(TelescopePluginManager(builtins=(), load_entry_points=False), registry)


def test_metadata_and_code_snapshot(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "train.py").write_text("print('hi')\n")
    (project / "pkg" / "huge.py").write_text("#" * 3000)  # over the 0.002 MB limit
    (project / "skipme").mkdir()
    (project / "skipme" / "secret.py").write_text("x = 1\n")
    (project / "data.bin").write_bytes(b"\0")
    run_dir = project / "out" / "run"  # inside the project, under a name no pattern excludes
    run_dir.mkdir(parents=True)
    (run_dir / "leftover.py").write_text("never snapshotted\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "add", "pkg/train.py"], check=True)
    subprocess.run(
        ["git", "-C", str(project), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c"], check=True
    )
    values: dict[str, Any] = {
        "environments": [{"name": "ranged", "reward_min": 0.0, "reward_max": 2.0}],
        "wandb_run_name": "meta",
        "wandb_code_max_file_size_mb": 0.002,
        "wandb_code_exclude_patterns": ["skipme", ".git"],
    }
    config = load_config(None, values, check_plugins=False).config

    metadata = write_run_metadata(run_dir, config, plugins(), root=project)

    assert json.loads((run_dir / "metadata.json").read_text()) == json.loads(json.dumps(metadata))
    assert metadata["run_name"] == "meta"
    assert metadata["environments"] == [
        {
            "name": "ranged",
            "weight": 1.0,
            "reward_min": 0.0,
            "reward_max": 2.0,
            "metrics_ranges": {"correct": {"min": 0.0, "max": 1.0}},
        }
    ]
    assert {
        "kind": "environments",
        "name": "ranged",
        "plugin": "tests",
        "distribution": "telescope-tests",
        "version": "1.2.3",
    } in metadata["plugins"]
    host = metadata["host"]
    assert host["hostname"] and host["python"] and host["cpu_count"] >= 1 and host["memory_gb"] > 0
    assert host["versions"]["torch"] and "ray" in host["versions"] and isinstance(host["gpus"], list)
    head = subprocess.run(["git", "-C", str(project), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert metadata["git"]["commit"] == head.stdout.strip() and metadata["git"]["dirty"] is False
    snapshot = sorted(p.relative_to(run_dir / "code").as_posix() for p in (run_dir / "code").rglob("*") if p.is_file())
    assert snapshot == ["pkg/train.py"]  # no oversized, excluded, non-source or run-directory files
    assert metadata["code"]["files"] == 1 and metadata["code"]["root"] == str(project)

    (project / "pkg" / "train.py").write_text("print('changed')\n")  # a resumed run snapshots again
    write_run_metadata(run_dir, config, plugins(), root=project)
    assert (run_dir / "code" / "pkg" / "train.py").read_text() == "print('changed')\n"
    assert json.loads((run_dir / "metadata.json").read_text())["git"]["dirty"] is True


def test_no_git_repository_gives_null(tmp_path: Path) -> None:
    config = load_config(None, {"environments": [{"name": "ranged"}]}, check_plugins=False).config
    metadata = write_run_metadata(tmp_path / "run", config, plugins(), root=tmp_path)
    assert metadata["git"] is None and metadata["code"]["files"] == 0
