"""A third-party plugin works by installation alone: it lists, owns config fields, trains, and uninstalls.

Builds a wheel of a small package (an environment, an :class:`~telescope.api.Algorithm`
subclass that reads a config field of its own) in a temporary folder outside the
repository, installs it into a fresh virtual environment (which sees the
workspace's packages through a ``.pth`` line, so the test interpreter's own
environment never gets the plugin), and drives the real ``telescope`` command in
that environment as a user would: ``plugins`` lists it, the plugin's field is set
in YAML and overridden on the command line, two training steps run on the CPU
through Ray, and the algorithm is seen to have read the command line's value.
"""

from __future__ import annotations

import json
import site
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

from telescope.recording.run_reader import RunReader

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
"""A third-party Telescope plugin: an environment, an algorithm and the config field it reads."""
from pydantic import Field

from telescope import hookimpl
from telescope.api import Algorithm, BaseEnvironment, RewardResult, Sample
from telescope.api.settings import PluginSettings


class EchoSettings(PluginSettings):
    section = "demo"
    demo_advantage_scale: float = Field(1.0, gt=0, description="Multiplies every advantage")


class ParityEnvironment(BaseEnvironment):
    """Reward 1 for a completion of even length: varied rewards from any model."""

    name = "demo_parity"

    def load_dataset(self):
        return [Sample(prompt=f"say something {i}", answer=i, sample_id=str(i)) for i in range(64)]

    def compute_reward(self, completion, sample, eos_token=""):
        return RewardResult(total_reward=float(len(completion) % 2 == 0))


class ScaledReinforce(Algorithm):
    """REINFORCE with group-centred advantages, times demo_advantage_scale."""

    name = "demo_scaled"

    def __init__(self, config, settings=None):
        super().__init__(config, settings)
        self.scale = (settings or EchoSettings()).demo_advantage_scale

    def group_advantages(self, rewards):
        centred = rewards - rewards.mean()
        return self.scale * centred / (centred.abs().max() + 1e-12)

    def token_loss(self, inputs):
        return -inputs.advantages * inputs.logprobs


@hookimpl
def telescope_register_environments(register):
    register("demo_parity", ParityEnvironment)


@hookimpl
def telescope_register_algorithms(register):
    register("demo_scaled", ScaledReinforce, settings=EchoSettings)
'''
CONFIG = """
model: "tiny:test"
model_dtype: float32
mixed_precision_dtype: null
gradient_checkpointing: false
environments: [{name: demo_parity}]
algorithm: demo_scaled
demo_advantage_scale: 2.0
group_size: 2
prompts_batch_size_for_trainer: 4
number_of_steps: 2
discard_group_zero_advantage: false
max_tokens: 8
max_model_len: 128
seq_len: 128
pad_to_multiple_of: 16
inference_num_workers: 1
trainer_num_workers: 1
ray_inference_cpus_per_worker: 1
ray_trainer_cpus_per_worker: 1
inference_backend: embedded
weight_transport: memory
inference_base_port: 8261
use_wandb: false
"""


def build_wheel(tmp_path: Path) -> Path:
    package = tmp_path / "src" / "demo"
    (package / "demo_thirdparty").mkdir(parents=True)
    (package / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT), encoding="utf-8")
    (package / "demo_thirdparty" / "__init__.py").write_text("", encoding="utf-8")
    (package / "demo_thirdparty" / "plugin.py").write_text(PLUGIN, encoding="utf-8")
    wheels = tmp_path / "wheels"
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels)]
    result = subprocess.run([*command, str(package)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    [wheel] = wheels.glob("*.whl")
    return wheel


def fresh_environment(tmp_path: Path) -> Path:
    """A new venv that sees the workspace's installed packages but holds its own installs; returns its python."""
    home = tmp_path / "fresh-venv"
    venv.EnvBuilder(with_pip=True).create(home)
    python = home / "bin" / "python"
    own_site = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True
    ).stdout.strip()
    workspace_sites = [p for p in site.getsitepackages() if Path(p).is_dir()]
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in workspace_sites)
    (Path(own_site) / "zz_workspace.pth").write_text(lines, encoding="utf-8")
    return python


def telescope(python: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    probe = "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))"
    env = {
        "PATH": f"{python.parent}:/usr/bin:/bin",
        "RAY_AUTH_MODE": "disabled",
        "TELESCOPE_PROGRESS": "lines",
        "WANDB_MODE": "disabled",
        "HOME": str(Path.home()),
    }
    return subprocess.run([str(python), "-c", probe, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_a_wheel_in_a_fresh_environment_lists_configures_trains_and_uninstalls(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    python = fresh_environment(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG, encoding="utf-8")

    assert "demo_parity" not in telescope(python, "plugins").stdout
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    assert subprocess.run([sys.executable, "-c", "import demo_thirdparty"], capture_output=True).returncode != 0

    listed = json.loads(telescope(python, "plugins", "--json").stdout)["plugins"]
    assert {(p["name"], p["kind"]) for p in listed if p["distribution"] == DIST} == {
        ("demo_parity", "environment"),
        ("demo_scaled", "algorithm"),
    }
    shown = telescope(python, "config", "show", str(config), "--demo_advantage_scale", "3")
    assert shown.returncode == 0, shown.stderr
    assert any(line.startswith("demo_advantage_scale: 3.0") and "# cli" in line for line in shown.stdout.splitlines())
    bad = telescope(python, "config", "validate", str(config), "--demo_advantage_scale", "-1")
    assert bad.returncode == 2 and "demo_advantage_scale" in bad.stderr and "greater than 0" in bad.stderr
    defaults = telescope(python, "config", "defaults").stdout
    assert "demo_advantage_scale: 1.0" in defaults and DIST in defaults

    run_dir = tmp_path / "run"
    trained = telescope(
        python, "run", str(config), "--run_dir", str(run_dir), "--demo_advantage_scale", "3", timeout=900
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    reader = RunReader(run_dir)
    assert reader.status()["status"] == "completed"  # type: ignore[index]
    assert [m["step"] for m in reader.metrics()] == [0, 1]
    advantages = {round(abs(r["advantage"]), 6) for r in reader.rollouts()}
    assert advantages <= {0.0, 3.0} and 3.0 in advantages, f"the algorithm did not read the CLI value: {advantages}"

    removed = subprocess.run(
        [str(python), "-m", "pip", "uninstall", "--yes", "--quiet", DIST], capture_output=True, text=True, timeout=300
    )
    assert removed.returncode == 0, removed.stderr
    gone = telescope(python, "config", "validate", str(config))
    assert gone.returncode == 2 and "unknown key 'demo_advantage_scale'" in gone.stderr  # its field left with it
    without_field = tmp_path / "without-field.yaml"
    without_field.write_text(CONFIG.replace("demo_advantage_scale: 2.0\n", ""), encoding="utf-8")
    gone = telescope(python, "config", "validate", str(without_field))
    assert gone.returncode == 2 and "unknown environment 'demo_parity'" in gone.stderr
