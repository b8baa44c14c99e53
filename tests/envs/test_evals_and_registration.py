"""The package registers every environment and eval by entry point, lazily and cheaply."""

from __future__ import annotations

import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from telescope.api.environment import EnvironmentBase
from telescope.api.evals import EvalSpec
from telescope.plugins.manager import get_plugin_manager
from telescope.plugins.registry import PluginKind
from telescope_envs.hendrycks_math import MathEnvironment

DATA = Path(__file__).parent / "data"
ENVS = [
    "calculator",
    "code_tracker",
    "countdown",
    "dapo_math",
    "deepdive",
    "deepscaler",
    "hendrycks_math",
    "i3_code",
    "miniwob",
    "wordle",
]
EVALS = {
    "math500": ("HuggingFaceH4/MATH-500", "test"),
    "aime_2024": ("HuggingFaceH4/aime_2024", "train"),
    "aime_2025": ("yentinglin/aime_2025", "train"),
    "gpqa_diamond": ("Idavidrein/gpqa", "train"),
}


def test_environments_registered_with_distribution() -> None:
    registry = get_plugin_manager().registry
    for name in ENVS:
        entry = registry.entry(PluginKind.ENVIRONMENT, name)
        assert entry.distribution == "telescope-envs"
        cls = entry.load()
        assert issubclass(cls, EnvironmentBase) and cls.name == name


@pytest.mark.parametrize("name", sorted(EVALS))
def test_evals_registered_with_upstream_datasets(name: str) -> None:
    spec = get_plugin_manager().registry.get(PluginKind.EVAL, name)
    assert isinstance(spec, EvalSpec) and spec.name == name
    dataset, split = EVALS[name]
    assert spec.default_kwargs["dataset_name"] == dataset
    assert spec.default_kwargs["dataset_split"] == split


def test_eval_builds_on_a_local_file() -> None:
    spec = get_plugin_manager().registry.get(PluginKind.EVAL, "aime_2024")
    env = spec.build(dataset_name=str(DATA / "aime.jsonl"))
    assert isinstance(env, MathEnvironment)
    (sample,) = env.load_dataset()
    assert sample.answer == "24"
    assert env.compute_reward("\\boxed{24}", sample).total_reward == 1.0


def test_plugin_import_is_cheap() -> None:
    plugins = ["telescope_envs.plugin"] + (["telescope_sandbox.plugin"] if find_spec("telescope_sandbox") else [])
    code = (
        f"import sys, {', '.join(plugins)}\n"
        "heavy = [m for m in ('datasets', 'torch', 'math_verify', 'textarena', 'e2b', 'modal', 'daytona',"
        " 'prime_sandboxes') if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_unknown_kwarg_is_a_type_error() -> None:
    from telescope_envs.countdown import CountdownEnvironment

    with pytest.raises(TypeError, match="dataset_nmae"):
        CountdownEnvironment(dataset_nmae="x")


def test_missing_optional_dependency_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    from telescope_envs import math_answers
    from telescope_envs._deps import MissingDependencyError

    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` fail
    with pytest.raises(MissingDependencyError, match=r"pip install 'telescope-envs\[math\]'"):
        math_answers.answers_match("\\frac{1}{2}", "0.5")
