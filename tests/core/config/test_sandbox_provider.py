"""``sandbox_provider`` chooses the provider of every environment that runs code (issue 15).

Through the run context (``EnvironmentContext``, set on every environment the core
builds); an environment's own ``sandbox_provider`` keyword argument overrides it; and a
provider that is not installed (unknown, or registered with SDK modules that are missing),
or an environment's missing ``requires`` module, is a validate-time error naming what to
install. Uses a plugin of its own (an environment that runs code, a provider whose SDK is
always missing), so it needs neither telescope-envs nor telescope-sandbox.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from telescope.api.context import EnvironmentContext
from telescope.config import ConfigError, load_config
from telescope.orchestrator.assembly import build_slots
from telescope.orchestrator.evals import EvalRunner
from telescope.plugins.facade import get_plugins

MakeDist = Callable[[str, str, str], str]

PLUGIN = """
from telescope import hookimpl
from telescope.api import BaseEnvironment, RewardResult, Sample, SandboxProvider


class CodeEnv(BaseEnvironment):
    name = "code_env"
    uses_sandbox = True

    def __init__(self, sandbox_provider=None):
        self.sandbox_provider = sandbox_provider

    @property
    def provider_name(self):
        return self.sandbox_provider or self.context.sandbox_provider

    def load_dataset(self):
        return [Sample(prompt="p", sample_id=str(i)) for i in range(4)]

    def compute_reward(self, completion, sample, eos_token=""):
        return RewardResult(total_reward=0.0)


class NeedsModule(CodeEnv):
    name = "needs_module"
    requires = {"telescope_no_such_module": "pip install 'demo-envs[extra]'"}


class PlainEnv(CodeEnv):
    name = "plain_env"
    uses_sandbox = False


@hookimpl
def telescope_register_environments(register):
    register("code_env", CodeEnv)
    register("needs_module", NeedsModule)
    register("plain_env", PlainEnv)
"""

PROVIDERS = """
from telescope import hookimpl
from telescope.api import SandboxProvider


class Provider(SandboxProvider):
    name = "fake_local"

    def create(self, limits=None):
        raise NotImplementedError


@hookimpl
def telescope_register_sandbox_providers(register):
    register("fake_local", Provider)
    register("fake_remote", "demo_sandbox_plugin:Provider", requires=("telescope_no_such_sdk",),
             install_hint="pip install 'demo-sandbox[remote]'")
"""


@pytest.fixture
def demo(make_distribution: MakeDist, tmp_path: Path) -> Path:
    make_distribution("demo-envs", "demo_envs_plugin", PLUGIN)
    make_distribution("demo-sandbox", "demo_sandbox_plugin", PROVIDERS)
    return tmp_path


def problems_of(*args: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, list(args))
    return str(info.value)


def test_the_run_context_carries_the_provider_to_every_environment(demo: Path) -> None:
    config = load_config(
        None,
        [
            "--environments",
            "[{name: code_env}, {name: code_env, kwargs: {sandbox_provider: fake_local}}]",
            "--sandbox_provider",
            "local",
            "--evals",
            "[{name: code_env, num_samples: 2}]",
        ],
    ).config
    first, second = (slot.environment for slot in build_slots(config, get_plugins()))
    assert first.context == EnvironmentContext(sandbox_provider="local") and first.provider_name == "local"
    assert second.provider_name == "fake_local"  # the environment's own keyword wins
    runner = EvalRunner(config, get_plugins(), renderer=None, generation=None, sink=None)  # type: ignore[arg-type]
    environment, _ = runner._environment(0, config.evals[0])
    assert environment.context.sandbox_provider == "local"  # evals get it too


def test_a_provider_whose_sdk_is_missing_is_an_error_at_validate_time(demo: Path) -> None:
    # the run's field, used by an environment that runs code
    message = problems_of("--environments", "[{name: code_env}]", "--sandbox_provider", "fake_remote")
    assert "sandbox_provider: sandbox provider 'fake_remote'" in message and "is not installed" in message
    assert "'telescope_no_such_sdk'" in message and "pip install 'demo-sandbox[remote]'" in message
    # an environment's override, with the entry it came from
    message = problems_of("--environments", "[{name: code_env, kwargs: {sandbox_provider: fake_remote}}]")
    assert "environments[0].kwargs.sandbox_provider (code_env): sandbox provider 'fake_remote'" in message
    # set on the run with no environment running code: still checked, it was asked for
    message = problems_of("--environments", "[{name: plain_env}]", "--sandbox_provider", "fake_remote")
    assert "pip install 'demo-sandbox[remote]'" in message
    # an installed one validates, and an environment's installed override wins over a missing run provider
    load_config(None, ["--environments", "[{name: code_env}]", "--sandbox_provider", "fake_local"])
    message = problems_of(
        "--environments",
        "[{name: code_env, kwargs: {sandbox_provider: fake_local}}]",
        "--sandbox_provider",
        "fake_remote",
    )
    assert message.count("is not installed") == 1 and "environments[0]" not in message


def test_an_unknown_provider_is_an_error_with_the_registered_names(demo: Path) -> None:
    message = problems_of("--environments", "[{name: code_env, kwargs: {sandbox_provider: fake_locl}}]")
    assert "unknown sandbox provider 'fake_locl'" in message and "Did you mean 'fake_local'?" in message


def test_without_any_provider_an_environment_that_runs_code_names_the_package(
    demo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TELESCOPE_DISABLE_PLUGINS", "demo-sandbox,telescope-sandbox")
    message = problems_of("--environments", "[{name: code_env}]")
    assert "sandbox_provider (the default, used by environments[0]: code_env): sandbox provider 'local'" in message
    assert "no sandbox provider is" in message and "pip install telescope-sandbox" in message
    # the default provider, left unset, is not checked when no environment runs code
    load_config(None, ["--environments", "[{name: plain_env}]"])


def test_a_missing_required_module_is_an_error_at_validate_time(demo: Path) -> None:
    message = problems_of("--environments", "[{name: needs_module}]", "--evals", "[{name: needs_module}]")
    assert "environments[0]: environment 'needs_module' needs the 'telescope_no_such_module' package" in message
    assert "evals[0]: environment 'needs_module'" in message and "pip install 'demo-envs[extra]'" in message
