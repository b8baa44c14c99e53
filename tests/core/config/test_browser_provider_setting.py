"""``browser_provider`` chooses the browser provider of every environment that acts on web pages.

The same contract as ``sandbox_provider``: the run context carries the run's provider to
every environment (``uses_browser``), an environment's own ``browser_provider`` keyword
argument overrides it, and a provider that is unknown or not installed is a
validate-time error naming what to install. Uses a plugin of its own, so it needs
neither telescope-envs nor Playwright.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from telescope.api.browser import BrowserProvider
from telescope.api.context import EnvironmentContext
from telescope.config import ConfigError, load_config
from telescope.orchestrator.assembly import build_slots
from telescope.plugins.facade import PluginTypeError, get_plugins

MakeDist = Callable[[str, str, str], str]

PLUGIN = """
from telescope import hookimpl
from telescope.api import BaseEnvironment, RewardResult, Sample


class WebEnv(BaseEnvironment):
    name = "web_env"
    uses_browser = True

    def __init__(self, browser_provider=None):
        self.browser_provider = browser_provider

    def load_dataset(self):
        return [Sample(prompt="p", sample_id=str(i)) for i in range(4)]

    def compute_reward(self, completion, sample, eos_token=""):
        return RewardResult(total_reward=0.0)


class PlainEnv(WebEnv):
    name = "plain_env"
    uses_browser = False


@hookimpl
def telescope_register_environments(register):
    register("web_env", WebEnv)
    register("plain_env", PlainEnv)

"""

PROVIDERS = """
from telescope import hookimpl
from telescope.api import BrowserProvider


class Provider(BrowserProvider):
    name = "fake_browser"

    def open(self, limits=None):
        raise NotImplementedError


class NotAProvider:
    pass


@hookimpl
def telescope_register_browser_providers(register):
    register("fake_browser", Provider)
    register("fake_cloud", "demo_browser_plugin:Provider", requires=("telescope_no_such_sdk",),
             install_hint="pip install 'demo-browser[cloud]'")
    register("not_a_provider", NotAProvider)
"""


@pytest.fixture
def demo(make_distribution: MakeDist, tmp_path: Path) -> Path:
    make_distribution("demo-web-envs", "demo_web_envs_plugin", PLUGIN)
    make_distribution("demo-browser", "demo_browser_plugin", PROVIDERS)
    return tmp_path


def problems_of(*args: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, list(args))
    return str(info.value)


def test_the_run_context_carries_the_browser_provider_and_the_facade_returns_its_class(demo: Path) -> None:
    config = load_config(None, ["--environments", "[{name: web_env}]", "--browser_provider", "fake_browser"]).config
    (slot,) = build_slots(config, get_plugins())
    assert slot.environment.context == EnvironmentContext(browser_provider="fake_browser")
    provider = get_plugins().browser_provider("fake_browser")
    assert issubclass(provider, BrowserProvider) and provider.name == "fake_browser"
    with pytest.raises(
        PluginTypeError, match=r"not_a_provider.*not a subclass of telescope\.api\.browser\.BrowserProvider"
    ):
        get_plugins().browser_provider("not_a_provider")


def test_a_provider_that_is_unknown_or_not_installed_is_an_error_at_validate_time(demo: Path) -> None:
    message = problems_of("--environments", "[{name: web_env}]", "--browser_provider", "fake_cloud")
    assert "browser_provider: browser provider 'fake_cloud'" in message and "is not installed" in message
    assert "'telescope_no_such_sdk'" in message and "pip install 'demo-browser[cloud]'" in message
    message = problems_of("--environments", "[{name: web_env, kwargs: {browser_provider: fake_browsr}}]")
    assert "environments[0].kwargs.browser_provider (web_env)" in message
    assert "unknown browser provider 'fake_browsr'" in message and "Did you mean 'fake_browser'?" in message
    # an installed override wins over a missing run provider: one problem, the run's own field
    message = problems_of(
        "--environments",
        "[{name: web_env, kwargs: {browser_provider: fake_browser}}]",
        "--browser_provider",
        "fake_cloud",
    )
    assert message.count("is not installed") == 1 and "environments[0]" not in message


def test_without_any_browser_provider_the_message_names_the_package(
    demo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TELESCOPE_DISABLE_PLUGINS", "demo-browser,telescope-sandbox")
    message = problems_of("--environments", "[{name: web_env}]")
    assert "browser_provider (the default, used by environments[0]: web_env): browser provider 'local'" in message
    assert "no browser provider is" in message and "pip install 'telescope-sandbox[browser]'" in message
    # left at its default, it is not checked when no environment uses a browser
    load_config(None, ["--environments", "[{name: plain_env}]"])
