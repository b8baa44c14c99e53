"""A third-party plugin works by installation alone, and uninstalling removes it.

Builds a small package (an environment and an algorithm) in a temporary folder,
pip-installs it into this interpreter's environment, and drives the real
``telescope`` command in subprocesses, as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DIST = "telescope-demo-thirdparty"
PYPROJECT = f"""
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{DIST}"
version = "0.0.1"
dependencies = []

[project.entry-points.telescope]
demo_thirdparty = "demo_thirdparty.plugin"
"""
PLUGIN = '''
"""A third-party Telescope plugin: one environment, one algorithm."""
from telescope import hookimpl
from telescope.api import AlgorithmCapabilities, BaseEnvironment, RewardResult, Sample


class EchoEnvironment(BaseEnvironment):
    name = "demo_echo"

    def load_dataset(self):
        return [Sample(prompt="say hi", answer="hi", sample_id="0")]

    def compute_reward(self, completion, sample, eos_token=""):
        return RewardResult(total_reward=float(sample.answer in completion))


class LoneAlgorithm:
    """Advantages without groups: group_size 1 is valid for it."""
    name = "demo_lone"
    capabilities = AlgorithmCapabilities(group_based=False, supports_ppo_clip=False)


@hookimpl
def telescope_register_environments(register):
    register("demo_echo", EchoEnvironment)


@hookimpl
def telescope_register_algorithms(register):
    register("demo_lone", LoneAlgorithm)
'''


def telescope(*args: str) -> subprocess.CompletedProcess[str]:
    probe = "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120)


def pip(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_install_list_validate_uninstall(tmp_path: Path) -> None:
    package = tmp_path / "demo"
    (package / "demo_thirdparty").mkdir(parents=True)
    (package / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT), encoding="utf-8")
    (package / "demo_thirdparty" / "__init__.py").write_text("", encoding="utf-8")
    (package / "demo_thirdparty" / "plugin.py").write_text(PLUGIN, encoding="utf-8")
    config = tmp_path / "run.yaml"
    config.write_text("environments: [{name: demo_echo}]\nalgorithm: demo_lone\ngroup_size: 1\n", encoding="utf-8")

    assert "demo_echo" not in telescope("plugins").stdout
    pip("install", "--quiet", "--no-build-isolation" if _has_setuptools() else "--quiet", str(package))
    try:
        listed = json.loads(telescope("plugins", "--json").stdout)["plugins"]
        mine = {(p["name"], p["kind"]) for p in listed if p["distribution"] == DIST}
        assert mine == {("demo_echo", "environment"), ("demo_lone", "algorithm")}
        validated = telescope("config", "validate", str(config))
        assert validated.returncode == 0, validated.stderr
    finally:
        pip("uninstall", "--yes", "--quiet", DIST)

    assert "demo_echo" not in telescope("plugins").stdout
    gone = telescope("config", "validate", str(config))
    assert gone.returncode == 2
    assert "unknown environment 'demo_echo'" in gone.stderr and "unknown algorithm 'demo_lone'" in gone.stderr


def _has_setuptools() -> bool:
    try:
        import setuptools  # noqa: F401
    except ImportError:
        return False
    return True
