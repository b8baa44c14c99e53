"""Validation of compaction and staleness settings: lengths that cannot work, an unknown compaction, a setting pair."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from telescope.config import ConfigError, load_config
from telescope.schema.long_horizon import MIN_SUMMARY_ROOM

NEEDS_ENVS = pytest.mark.requires_dist("telescope-envs")
LENGTHS = ["--max_model_len", "1000", "--max_tokens", "200", "--seq_len", "1024"]


def load(tmp_path: Path, overrides: list[str]):  # type: ignore[no-untyped-def]
    path = tmp_path / "run.yaml"
    path.write_text("environments:\n  - name: countdown\n", encoding="utf-8")
    return load_config(path, [*LENGTHS, *overrides])


def problems(tmp_path: Path, overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, overrides)
    return info.value.problems


@NEEDS_ENVS
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # 0.2 x 1000 = 200 tokens of working context: one 200-token reply fills it
        (["--compaction", "sliding", "--compaction_threshold", "0.2"], "must exceed max_tokens (200)"),
        # 0.99 x 1000: 10 tokens left above it for the instruction and the summary
        (
            ["--compaction", "summarize", "--compaction_threshold", "0.99"],
            f"summarize needs at least {MIN_SUMMARY_ROOM}",
        ),
        (["--compaction", "summarise"], "unknown compaction 'summarise'"),
        (["--compaction_threshold", "1.0"], "compaction_threshold"),
        (["--compaction_keep_turns", "0"], "compaction_keep_turns"),
        (
            ["--continue_requests_across_updates"],
            "continue_requests_across_updates: true needs stale_token_policy: mask",
        ),
        (["--stale_token_policy", "keep"], "stale_token_policy"),
    ],
)
def test_settings_that_cannot_work_are_rejected(tmp_path: Path, overrides: list[str], expected: str) -> None:
    found = problems(tmp_path, overrides)
    assert any(expected in p for p in found), found


@NEEDS_ENVS
def test_the_unknown_name_message_lists_the_built_ins(tmp_path: Path) -> None:
    (found,) = [p for p in problems(tmp_path, ["--compaction", "summarise"]) if "compaction" in p]
    assert "Did you mean 'summarize'?" in found and "drop_tool_outputs" in found


@NEEDS_ENVS
@pytest.mark.parametrize("name", ["summarize", "drop_tool_outputs", "sliding"])
def test_working_settings_load(tmp_path: Path, name: str) -> None:
    config = load(
        tmp_path,
        ["--compaction", name, "--stale_token_policy", "mask", "--continue_requests_across_updates", "true"],
    ).config
    assert config.compaction == name and config.continue_requests_across_updates


def test_the_summary_room_rule_does_not_apply_to_the_other_compactions() -> None:
    from telescope.schema.config import TelescopeConfig
    from telescope.schema.long_horizon import long_horizon_problems

    base: dict[str, Any] = {"max_model_len": 1000, "max_tokens": 200, "compaction_threshold": 0.99}
    assert long_horizon_problems(TelescopeConfig.model_construct(**base, compaction="sliding")) == []
    assert len(long_horizon_problems(TelescopeConfig.model_construct(**base, compaction="summarize"))) == 1
    off = {**base, "compaction": "none", "compaction_threshold": 0.01}
    assert long_horizon_problems(TelescopeConfig.model_construct(**off)) == []
