"""A runaway list of environments is refused while it is read, before it is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from telescope.config.errors import ConfigError
from telescope.config.loader import load_config
from telescope.schema.entries import MAX_ENTRIES

ENTRY = "  - name: countdown\n    kwargs: {seed: 1}\n"


def test_one_entry_too_many_is_refused_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("model: tiny:test\nenvironments:\n" + ENTRY * (MAX_ENTRIES + 1))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    [problem] = info.value.problems
    line = 3 + 2 * MAX_ENTRIES
    assert f"run.yaml:{line}:" in problem and f"environments has more than {MAX_ENTRIES:,} entries" in problem


def test_reading_stops_at_the_entry_too_many(tmp_path: Path) -> None:
    """What follows the entry too many is never parsed: its invalid YAML is not what is reported."""
    path = tmp_path / "run.yaml"
    path.write_text("environments:\n" + ENTRY * (MAX_ENTRIES + 2) + "  - {unclosed: [\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert len(info.value.problems) == 1 and "more than" in info.value.problems[0]


def test_the_limit_allows_its_own_count_and_covers_evals_and_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("model: tiny:test\nenvironments:\n" + ENTRY * MAX_ENTRIES)
    assert len(load_config(path).config.environments) == MAX_ENTRIES
    evals = "[" + ", ".join(["{name: countdown}"] * (MAX_ENTRIES + 1)) + "]"
    with pytest.raises(ConfigError, match="evals has more than"):
        load_config(path, ["--evals", evals])
    with pytest.raises(ConfigError, match="at most 1000 items"):
        load_config(None, {"environments": [{"name": "countdown"}] * (MAX_ENTRIES + 1)}, check_plugins=False)
