"""The typed facade: interface checks once, settings to constructors, loud hook typos, clashes listed."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from telescope.cli.main import main
from telescope.plugins.facade import PluginTypeError, get_plugins
from telescope.plugins.manager import TelescopePluginManager
from telescope.plugins.registry import PluginError

MakeDist = Callable[[str, str, str], str]


def test_a_wrong_base_class_is_an_error_naming_the_plugin_and_its_distribution(make_distribution: MakeDist) -> None:
    make_distribution(
        "wrong-dist",
        "wrong_plugin",
        """
        from telescope import hookimpl

        class NotAnAlgorithm:
            name = "impostor"

        @hookimpl
        def telescope_register_algorithms(register):
            register("impostor", NotAnAlgorithm)
        """,
    )
    with pytest.raises(PluginTypeError) as info:
        get_plugins().algorithm("impostor")
    message = str(info.value)
    assert "algorithm 'impostor'" in message and "wrong-dist 1.2.3" in message and "telescope.api.algorithm" in message
    assert get_plugins().algorithm("grpo").name == "grpo"  # the others are unaffected


def test_constructors_receive_their_own_settings_and_a_narrow_context() -> None:
    from telescope.api.context import TrainerContext
    from telescope.config.composition import config_from_dict
    from telescope.trainer.plugin import FSDPSettings

    config = config_from_dict({"environments": [{"name": "countdown"}], "gradient_checkpointing": False})
    plugins = get_plugins()
    backend = plugins.create_trainer_backend(config, plugins.create_algorithm(config))
    assert isinstance(backend.context, TrainerContext) and backend.context.learning_rate == config.learning_rate
    assert backend.settings == FSDPSettings(gradient_checkpointing=False)
    assert not hasattr(backend, "config")


def test_a_hook_implementation_matching_no_hook_fails_loudly(make_distribution: MakeDist) -> None:
    make_distribution(
        "typo-dist",
        "typo_plugin",
        """
        from telescope import hookimpl

        @hookimpl
        def telescope_run_ended(run_dir, status, error):
            pass
        """,
    )
    with pytest.raises(PluginError) as info:
        TelescopePluginManager()
    message = str(info.value)
    assert "'telescope_run_ended'" in message and "typo-dist" in message and "telescope_run_end" in message


def test_plugins_lists_both_sides_of_a_clash(make_distribution: MakeDist, capsys: pytest.CaptureFixture[str]) -> None:
    for dist, module in (("left-dist", "left_plugin"), ("right-dist", "right_plugin")):
        make_distribution(
            dist,
            module,
            """
            from telescope import hookimpl

            @hookimpl
            def telescope_register_environments(register):
                register("twin", "nowhere:Env")
            """,
        )
    assert main(["plugins", "--json"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out)["plugins"] if r["name"] == "twin"]
    assert {r["distribution"] for r in rows} == {"left-dist", "right-dist"}
    assert all(r["status"].startswith("CLASH") for r in rows)
