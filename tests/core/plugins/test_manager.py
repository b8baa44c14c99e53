"""The plugin manager: built-ins and entry points through the same hooks, containment."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from telescope.config import ConfigError, load_config
from telescope.plugins import hookspecs
from telescope.plugins.manager import (
    BUILTIN_PLUGINS,
    PluginImportWarning,
    TelescopePluginManager,
    reset_plugin_manager,
)
from telescope.plugins.registry import DuplicatePluginError, PluginKind, PluginLoadError, UnknownPluginError

MakeDist = Callable[[str, str, str], str]

ENV_PLUGIN = """
from telescope import hookimpl
from telescope.api import BaseEnvironment, RewardResult, Sample

@hookimpl
def telescope_register_environments(register):
    register("{name}", "{module}:Env")

class Env(BaseEnvironment):
    def load_dataset(self):
        return [Sample(prompt="p", sample_id="0")]

    def compute_reward(self, completion, sample, eos_token=""):
        return RewardResult(total_reward=0.0)
"""


def test_builtins_register_through_the_public_hooks() -> None:
    manager = TelescopePluginManager(load_entry_points=False)
    for module_name in BUILTIN_PLUGINS:
        module = importlib.import_module(module_name)
        hook_functions = [
            name for name, _ in inspect.getmembers(module, inspect.isfunction) if name.startswith("telescope_")
        ]
        assert hook_functions, f"{module_name} implements no hook"
        assert all(hasattr(hookspecs, name) for name in hook_functions)
        assert manager.plugins[module_name].builtin
    registry = manager.registry
    assert registry.names(PluginKind.ALGORITHM) == sorted(
        ["grpo", "rloo", "reinforce_pp", "dr_grpo", "cispo", "gspo", "sapo"]
    )
    assert registry.entry(PluginKind.TRAINER_BACKEND, "fsdp").distribution == "telescope-core"


@pytest.mark.requires_dist("telescope-envs", "telescope-sandbox")
def test_satellite_packages_register_by_entry_point() -> None:
    manager = TelescopePluginManager()
    entry = manager.registry.entry(PluginKind.ENVIRONMENT, "countdown")
    assert entry.distribution == "telescope-envs"
    assert manager.plugins["telescope_envs"].builtin is False
    assert manager.registry.entry(PluginKind.SANDBOX_PROVIDER, "local").distribution == "telescope-sandbox"


def test_registering_does_not_import_the_target(make_distribution: MakeDist) -> None:
    make_distribution("lazy-dist", "lazy_plugin", ENV_PLUGIN.format(name="lazy", module="lazy_target_module"))
    manager = TelescopePluginManager()
    entry = manager.registry.entry(PluginKind.ENVIRONMENT, "lazy")
    assert entry.is_lazy and entry.distribution == "lazy-dist" and entry.version == "1.2.3"
    with pytest.raises(
        PluginLoadError, match=re.escape("environment 'lazy' (from lazy-dist 1.2.3) could not be imported")
    ):
        entry.load()


def test_duplicate_names_fail_naming_both_distributions(make_distribution: MakeDist) -> None:
    make_distribution("first-dist", "first_plugin", ENV_PLUGIN.format(name="twin", module="first_plugin"))
    make_distribution("second-dist", "second_plugin", ENV_PLUGIN.format(name="twin", module="second_plugin"))
    registry = TelescopePluginManager().registry  # loading succeeds: only the clashing name is unusable
    with pytest.raises(DuplicatePluginError) as info:
        registry.entry(PluginKind.ENVIRONMENT, "twin")
    message = str(info.value)
    assert "'twin'" in message and "first-dist 1.2.3" in message and "second-dist 1.2.3" in message
    assert "twin" not in registry.names(PluginKind.ENVIRONMENT)
    assert {e.distribution for e in registry.clashes()} == {"first-dist", "second-dist"}
    assert registry.entry(PluginKind.ALGORITHM, "grpo").name == "grpo"  # everything else still works


def test_duplicate_of_a_builtin_name_breaks_only_what_uses_it(make_distribution: MakeDist, tmp_path: Path) -> None:
    make_distribution(
        "shadow-dist",
        "shadow_plugin",
        """
        from telescope import hookimpl

        @hookimpl
        def telescope_register_algorithms(register):
            register("grpo", "shadow_plugin:X")
        """,
    )
    registry = TelescopePluginManager().registry
    with pytest.raises(DuplicatePluginError, match=re.escape("telescope-core 0.1.0 and by shadow-dist 1.2.3")):
        registry.entry(PluginKind.ALGORITHM, "grpo")
    reset_plugin_manager()
    config = tmp_path / "c.yaml"
    config.write_text("environments: [{name: countdown}]\nalgorithm: rloo\n", encoding="utf-8")
    assert load_config(config).config.algorithm == "rloo"  # a config that does not use the name is fine
    config.write_text("environments: [{name: countdown}]\nalgorithm: grpo\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="registered more than once"):
        load_config(config)


def test_a_plugin_that_fails_to_import_is_reported_and_contained(make_distribution: MakeDist, tmp_path: Path) -> None:
    make_distribution("broken-dist", "broken_plugin", "import does_not_exist_anywhere\n")
    make_distribution("good-dist", "good_plugin", ENV_PLUGIN.format(name="good_env", module="good_plugin"))
    with pytest.warns(PluginImportWarning, match="plugin 'broken_plugin' \\(from broken-dist 1.2.3\\) failed to load"):
        manager = TelescopePluginManager()
    [failure] = manager.load_failures
    assert "ModuleNotFoundError" in failure.error
    # everything else still works, including validating a config
    assert manager.registry.has(PluginKind.ALGORITHM, "grpo")
    reset_plugin_manager(manager)
    config = tmp_path / "c.yaml"
    config.write_text("environments: [{name: good_env}]\n", encoding="utf-8")
    assert load_config(config).config.algorithm == "grpo"


def test_a_registration_hook_that_raises_loses_only_its_own_names(make_distribution: MakeDist) -> None:
    make_distribution("good-dist", "good_plugin", ENV_PLUGIN.format(name="good_env", module="good_plugin"))
    make_distribution(
        "half-dist",
        "half_plugin",
        """
        from telescope import hookimpl

        @hookimpl
        def telescope_register_environments(register):
            register("half_env", "half_plugin:X")
            raise RuntimeError("boom")
        """,
    )
    with pytest.warns(PluginImportWarning, match="RuntimeError: boom"):
        manager = TelescopePluginManager()
        registry = manager.registry
    assert not registry.has(PluginKind.ENVIRONMENT, "half_env")
    assert registry.has(PluginKind.ENVIRONMENT, "good_env")


def test_disable_plugins_blocks_entry_points_and_builtins(
    make_distribution: MakeDist, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_distribution("extra-dist", "extra_plugin", ENV_PLUGIN.format(name="extra_env", module="extra_plugin"))
    make_distribution("kept-dist", "kept_plugin", ENV_PLUGIN.format(name="kept_env", module="kept_plugin"))
    monkeypatch.setenv("TELESCOPE_DISABLE_PLUGINS", "extra_plugin, telescope.recording.plugin,telescope-sandbox")
    registry = TelescopePluginManager().registry
    assert not registry.has(PluginKind.ENVIRONMENT, "extra_env")
    assert not registry.has(PluginKind.LOGGER, "wandb")
    assert not registry.has(PluginKind.SANDBOX_PROVIDER, "local")  # blocked by distribution name
    assert registry.has(PluginKind.ENVIRONMENT, "kept_env")


def test_unknown_names_suggest_the_closest(make_distribution: MakeDist) -> None:
    registry = TelescopePluginManager(load_entry_points=False).registry
    with pytest.raises(UnknownPluginError) as info:
        registry.get(PluginKind.SANDBOX_PROVIDER, "e2b")
    assert "No sandbox providers are registered" in str(info.value)
    with pytest.raises(UnknownPluginError, match="Did you mean 'grpo'"):
        registry.get(PluginKind.ALGORITHM, "grop")


def test_a_plugin_declares_its_own_install_hint(make_distribution: MakeDist) -> None:
    make_distribution(
        "hinted-dist",
        "hinted_plugin",
        """
        from telescope import hookimpl

        @hookimpl
        def telescope_register_sandbox_providers(register):
            register("cloudbox", "cloudbox_sdk_missing.provider:Box", install_hint="pip install 'hinted-dist[cloud]'")
        """,
    )
    registry = TelescopePluginManager().registry
    with pytest.raises(PluginLoadError, match=re.escape("Install it: pip install 'hinted-dist[cloud]'")):
        registry.get(PluginKind.SANDBOX_PROVIDER, "cloudbox")


def test_validate_config_hook_adds_rules(make_distribution: MakeDist, tmp_path: Path) -> None:
    make_distribution(
        "rules-dist",
        "rules_plugin",
        """
        from telescope import hookimpl

        @hookimpl
        def telescope_validate_config(config):
            if config.seed == 13:
                return ["seed: 13 is unlucky; pick another seed"]
        """,
    )
    config = tmp_path / "c.yaml"
    make_distribution("env-dist", "env_plugin", ENV_PLUGIN.format(name="some_env", module="env_plugin"))
    config.write_text("environments: [{name: some_env}]\nseed: 13\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="13 is unlucky"):
        load_config(config)
    assert load_config(config, ["--seed", "12"]).config.seed == 12


def test_a_third_party_can_register_every_kind(make_distribution: MakeDist) -> None:
    make_distribution(
        "every-dist",
        "every_plugin",
        """
        from telescope import hookimpl

        @hookimpl
        def telescope_register_environments(register):
            register("every_env", "every_plugin:Thing")

        @hookimpl
        def telescope_register_evals(register):
            register("every_eval", "every_plugin:Thing")

        @hookimpl
        def telescope_register_algorithms(register):
            register("every_algo", "every_plugin:Thing", group_based=False)

        @hookimpl
        def telescope_register_trainer_backends(register):
            register("every_trainer", "every_plugin:Thing")

        @hookimpl
        def telescope_register_inference_backends(register):
            register("every_inference", "every_plugin:Thing")

        @hookimpl
        def telescope_register_weight_transports(register):
            register("every_transport", "every_plugin:Thing")

        @hookimpl
        def telescope_register_sandbox_providers(register):
            register("every_sandbox", "every_plugin:Thing")

        @hookimpl
        def telescope_register_browser_providers(register):
            register("every_browser", "every_plugin:Thing")

        @hookimpl
        def telescope_register_loggers(register):
            register("every_logger", "every_plugin:Thing")

        @hookimpl
        def telescope_register_compactions(register):
            register("every_compaction", "every_plugin:Thing")

        @hookimpl
        def telescope_add_commands(cli):
            import click

            @cli.command(name="every-hello")
            def hello():
                click.echo("hello from every-dist")

        class Thing:
            pass
        """,
    )
    manager = TelescopePluginManager()
    registry = manager.registry
    for kind in PluginKind:
        [entry] = [e for e in registry if e.kind is kind and e.name.startswith("every_")]
        assert entry.distribution == "every-dist"
        assert entry.load().__name__ == "Thing"
    assert registry.entry(PluginKind.ALGORITHM, "every_algo").metadata == {"group_based": False}
    import click

    group = click.Group("t")
    manager.hook.telescope_add_commands(cli=group)
    assert "every-hello" in group.commands


def test_lifecycle_hooks_reach_plugins(make_distribution: MakeDist, tmp_path: Path) -> None:
    make_distribution(
        "watch-dist",
        "watch_plugin",
        """
        from telescope import hookimpl
        CALLS = []

        @hookimpl
        def telescope_run_start(config, run_dir):
            CALLS.append(("start", str(run_dir)))

        @hookimpl
        def telescope_step_end(step, metrics):
            CALLS.append(("step", step, metrics["reward/mean"]))

        @hookimpl
        def telescope_run_end(run_dir, status, error):
            CALLS.append(("end", status))
        """,
    )
    manager = TelescopePluginManager()
    manager.hook.telescope_run_start(config=None, run_dir=tmp_path)
    manager.hook.telescope_step_end(step=1, metrics={"reward/mean": 0.5})
    manager.hook.telescope_run_end(run_dir=tmp_path, status="completed", error=None)
    import watch_plugin  # type: ignore[import-not-found]

    assert watch_plugin.CALLS == [("start", str(tmp_path)), ("step", 1, 0.5), ("end", "completed")]


# Hooks are documented in docs/hooks.md, the one reference; tests/docs/test_hooks_documented.py
# checks that it covers exactly the hooks of hookspecs.py and that a run calls the lifecycle hooks.


def test_trace_plugins_shows_every_hook_call_registration_and_lifecycle_included(
    make_distribution: MakeDist, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``TELESCOPE_TRACE_PLUGINS=1`` traces what the registry and the facade call one plugin at a time."""
    from telescope.plugins.facade import Plugins

    make_distribution(
        "traced-dist",
        "traced_plugin",
        """
        from telescope import hookimpl

        @hookimpl
        def telescope_run_start(config, run_dir):
            pass

        @hookimpl
        def telescope_step_end(step, metrics):
            pass

        @hookimpl
        def telescope_run_end(run_dir, status, error):
            pass
        """,
    )
    monkeypatch.setenv("TELESCOPE_TRACE_PLUGINS", "1")
    manager = TelescopePluginManager()
    assert "grpo" in manager.registry.names(PluginKind.ALGORITHM)
    plugins = Plugins(manager)
    plugins.run_start(None, tmp_path)  # type: ignore[arg-type]
    plugins.step_end(3, {"reward/mean": 0.5})
    plugins.run_end(tmp_path, "completed", None)
    traced = capsys.readouterr().err
    for kind in PluginKind:
        assert f"{kind.hook_name} [hook]" in traced, kind.hook_name
    for hook in ("telescope_run_start", "telescope_step_end", "telescope_run_end"):
        assert f"{hook} [hook]" in traced, hook
    assert "status: completed" in traced  # with its arguments, as pluggy traces them
