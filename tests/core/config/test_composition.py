"""The schema is composed from what is installed: plugin fields, collisions, owners' rules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from telescope.config import ConfigError, load_config
from telescope.config.composition import composed_schema
from telescope.plugins.registry import PluginError

MakeDist = Callable[[str, str, str], str]

SETTINGS_PLUGIN = """
from pydantic import Field

from telescope import hookimpl
from telescope.api import BaseEnvironment, RewardResult, Sample
from telescope.api.settings import PluginSettings, SettingsProblem


class {cls}(PluginSettings):
    section = "demo"
    {field}: int = Field(4, ge=1, description="A knob of the demo plugin")

    @classmethod
    def config_problems(cls, config):
        own = config.settings(cls)
        if own.{field} > config.group_size:
            return [SettingsProblem(f"{field} ({{own.{field}}}) cannot exceed group_size ({{config.group_size}})",
                                    fields=("{field}",))]
        return []


class Env(BaseEnvironment):
    name = "{env}"

    def load_dataset(self):
        return [Sample(prompt="p", sample_id="0")]

    def compute_reward(self, completion, sample, eos_token=""):
        return RewardResult(total_reward=0.0)


@hookimpl
def telescope_register_environments(register):
    register("{env}", Env, settings={cls})
"""


def plugin(env: str, field: str, cls: str = "DemoSettings") -> str:
    return SETTINGS_PLUGIN.format(env=env, field=field, cls=cls)


def test_a_plugin_field_is_a_config_field_in_yaml_and_on_the_command_line(
    make_distribution: MakeDist, tmp_path: Path
) -> None:
    make_distribution("knob-dist", "knob_plugin", plugin("knob_env", "demo_knob"))
    schema = composed_schema()
    assert schema.owner_label("demo_knob") == "knob-dist" and schema.section("demo_knob") == "demo"
    path = tmp_path / "run.yaml"
    path.write_text("environments: [{name: knob_env}]\ndemo_knob: 2\n", encoding="utf-8")
    loaded = load_config(path)
    assert loaded.config.demo_knob == 2 and loaded.provenance["demo_knob"] == f"{path}:2"
    from_cli = load_config(path, ["--demo_knob", "3"])
    assert from_cli.config.demo_knob == 3 and from_cli.provenance["demo_knob"] == "cli"
    with pytest.raises(ConfigError, match=r"demo_knb.*did you mean 'demo_knob'"):
        load_config(path, ["--demo_knb", "3"])


def test_the_owner_contributes_its_cross_field_rule_with_file_and_line(
    make_distribution: MakeDist, tmp_path: Path
) -> None:
    make_distribution("knob-dist", "knob_plugin", plugin("knob_env", "demo_knob"))
    path = tmp_path / "run.yaml"
    path.write_text("environments: [{name: knob_env}]\ngroup_size: 4\ndemo_knob: 9\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    [problem] = info.value.problems
    assert "demo_knob (9) cannot exceed group_size (4)" in problem and f"{path}:3" in problem


def test_a_field_declared_by_two_distributions_is_an_error_naming_both(make_distribution: MakeDist) -> None:
    make_distribution("first-knobs", "first_knobs", plugin("first_env", "shared_knob", "FirstSettings"))
    make_distribution("second-knobs", "second_knobs", plugin("second_env", "shared_knob", "SecondSettings"))
    with pytest.raises(PluginError) as info:
        composed_schema()
    message = str(info.value)
    assert "'shared_knob'" in message and "first-knobs" in message and "second-knobs" in message


def test_a_plugin_field_may_not_reuse_a_core_field(make_distribution: MakeDist) -> None:
    make_distribution("greedy-dist", "greedy_plugin", plugin("greedy_env", "learning_rate"))
    with pytest.raises(PluginError, match=r"'learning_rate' is declared by greedy-dist .* and by telescope-core"):
        composed_schema()
