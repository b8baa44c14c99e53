"""Reading a config file and the command line: the bad inputs each give one clear message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from telescope.config import ConfigError, parse_overrides, yaml_reader
from telescope.config.sources import read_yaml_file, schema_field_kind
from telescope.config.yaml_reader import load_yaml

MINIMAL = "environments:\n  - name: countdown\n"
PARSERS = [pytest.param(yaml_reader.PARSER, id="libyaml"), pytest.param(yaml.SafeLoader, id="pure-python")]


@pytest.fixture(params=PARSERS)
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> type:
    """Run a test with libyaml's parser and again with PyYAML's pure-Python one (the fallback)."""
    monkeypatch.setattr(yaml_reader, "PARSER", request.param)
    return request.param  # type: ignore[no-any-return]


def write(tmp_path: Path, text: str | bytes, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def problems_reading(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        read_yaml_file(path)
    return info.value.problems


# ------------------------------------------------------------------ what is read


def test_values_and_lines_at_every_depth(tmp_path: Path, parser: type) -> None:
    text = MINIMAL + "    kwargs:\n      seed: 4\n      sizes: [1, 2]\n  - name: wordle\nwandb_tags:\n  - a\n  - b\n"
    data, source = read_yaml_file(write(tmp_path, text))
    assert data["environments"][0]["kwargs"] == {"seed": 4, "sizes": [1, 2]}
    assert source.lines[("environments",)] == 1
    assert source.lines[("environments", 0)] == 2
    assert source.lines[("environments", 0, "kwargs", "seed")] == 4
    assert source.lines[("environments", 1)] == 6
    assert source.lines[("wandb_tags", 1)] == 9
    assert source.where(("environments", 0, "kwargs", "sizes", 1)) == f"{tmp_path / 'run.yaml'}:5"
    assert source.line_of(("environments", 0, "kwargs", "nope")) == (3, False)  # nearest ancestor


def test_the_same_values_as_pyyaml(tmp_path: Path, parser: type) -> None:
    text = (
        "a: [1, 1.5, true, null, 2024-01-02, '3', 0x1F, .inf, ~]\n"
        "base: &base {x: 1, y: [a, b]}\n"
        "merged: {<<: *base, y: c}\n"
        "again: *base\n"
        "tagged: !!str 12\n"
        "block: |\n  line\n"
        "set: !!set {p, q}\n"
        "? (a, b)\n: complex key\n"
    )
    data, _ = load_yaml(text, "x")
    assert data == yaml.safe_load(text)
    assert data["again"] is data["base"]  # an alias is one shared value, as in PyYAML
    with pytest.raises(ConfigError, match=r"invalid YAML at x:1:5: while constructing a mapping, found unhashable"):
        load_yaml("a: {[1]: 2}\n", "x")


def test_the_libyaml_parser_is_used_and_the_text_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []

    class Counting(yaml_reader.PARSER):  # type: ignore[name-defined,misc]
        def __init__(self, stream: Any) -> None:
            made.append(1)
            super().__init__(stream)

    assert yaml_reader.PARSER is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    monkeypatch.setattr(yaml_reader, "PARSER", Counting)
    for name in ("compose", "safe_load", "load"):
        monkeypatch.setattr(yaml, name, lambda *a, **k: pytest.fail("a second, pure-Python parse"))
    data, _ = read_yaml_file(write(tmp_path, MINIMAL + "seed: 1\n"))
    assert data["seed"] == 1 and made == [1]


# ------------------------------------------------------------------ duplicate keys


def test_duplicate_top_level_key_names_the_key_and_both_lines(tmp_path: Path, parser: type) -> None:
    path = write(tmp_path, MINIMAL + "learning_rate: 1.0e-6\nseed: 1\nlearning_rate: 3.0e-6\n")
    [problem] = problems_reading(path)
    assert "duplicate key 'learning_rate' at the top level" in problem
    assert f"{path}:3 and {path}:5" in problem


def test_duplicate_keys_inside_nested_mappings(tmp_path: Path, parser: type) -> None:
    text = MINIMAL + "    kwargs:\n      seed: 1\n      num_samples: 5\n      seed: 2\n    weight: 1\n    weight: 2\n"
    path = write(tmp_path, text)
    problems = problems_reading(path)
    assert any("'seed' in environments[0].kwargs" in p and f"{path}:4 and {path}:6" in p for p in problems)
    assert any("'weight' in environments[0]" in p and f"{path}:7 and {path}:8" in p for p in problems)
    [flow] = problems_reading(write(tmp_path, "environments: [{name: a, kwargs: {x: 1, x: 2}}]\n"))
    assert "duplicate key 'x' in environments[0].kwargs" in flow and "run.yaml:1 (twice)" in flow


def test_merge_keys_and_repeated_aliases_are_not_duplicates(tmp_path: Path, parser: type) -> None:
    text = "base: &b {seed: 1}\nenvironments:\n  - {name: a, kwargs: {<<: *b, seed: 2}}\n  - {name: b, kwargs: *b}\n"
    data, _ = read_yaml_file(write(tmp_path, text))
    assert [e["kwargs"]["seed"] for e in data["environments"]] == [2, 1]


# ------------------------------------------------------------------ aliases, nesting, documents


def _bomb(levels: int, fanout: int = 9) -> str:
    lines = [f"l0: &l0 [{', '.join(['lol'] * fanout)}]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_expanding(tmp_path: Path, parser: type) -> None:
    [problem] = problems_reading(write(tmp_path, _bomb(9)))
    sizes = [10]  # nodes of l0 expanded: the list and its 9 strings; each level is 1 + 9 of the one before
    for _ in range(8):
        sizes.append(1 + 9 * sizes[-1])
    expanded = 1 + 9 + sum(sizes)  # the top mapping, its keys and values: 490 million, counted not built
    assert f"expand to {expanded:,} nodes from the 28 written" in problem and "alias bomb" in problem
    assert "max(100,000, the nodes written)" in problem and "*l7 at" in problem


def test_moderate_alias_use_is_allowed(tmp_path: Path, parser: type) -> None:
    data, _ = read_yaml_file(write(tmp_path, _bomb(4, fanout=10)))  # 10**4 leaves: under the allowance
    assert len(data["l3"]) == 10


def test_recursive_undefined_and_redefined_aliases(tmp_path: Path, parser: type) -> None:
    [recursive] = problems_reading(write(tmp_path, "a: &x [1, *x]\n"))
    assert "run.yaml:1:" in recursive and "*x refers to a collection that contains it" in recursive
    [undefined] = problems_reading(write(tmp_path, "a: *nope\n"))
    assert "*nope" in undefined and "run.yaml:1:" in undefined
    [twice] = problems_reading(write(tmp_path, "a: &x 1\nb: &x 2\n"))
    assert "&x is defined twice" in twice and "run.yaml:2:" in twice


def test_deep_nesting_is_refused_without_crashing(tmp_path: Path, parser: type) -> None:
    depth = 50_000 if parser is not yaml.SafeLoader else 2_000  # libyaml's own composer segfaults here
    [problem] = problems_reading(write(tmp_path, "a: " + "[" * depth + "]" * depth + "\n"))
    assert f"nesting deeper than {yaml_reader.MAX_DEPTH} levels" in problem and "run.yaml:1:" in problem


def test_a_second_document_is_refused(tmp_path: Path, parser: type) -> None:
    [problem] = problems_reading(write(tmp_path, MINIMAL + "---\nseed: 1\n"))
    assert "run.yaml:3:1: a second YAML document" in problem


# ------------------------------------------------------------------ encoding, emptiness, keys


def test_non_utf8_bytes_give_line_column_and_offset(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.encode() + b"wandb_run_name: caf\xe9 run\n")
    [problem] = problems_reading(path)
    offset = len(MINIMAL) + len("wandb_run_name: caf")
    assert f"{path}:3:20: not UTF-8: byte 0xe9 at offset {offset}" in problem and "save the file as UTF-8" in problem
    [utf16] = problems_reading(write(tmp_path, MINIMAL.encode("utf-16")))
    assert ":1:1: not UTF-8" in utf16 and "UTF-16" in utf16


def test_control_characters_are_located(tmp_path: Path) -> None:
    [problem] = problems_reading(write(tmp_path, MINIMAL + "seed: 1\x00\n"))
    assert "run.yaml:3:8: the character U+0000" in problem


@pytest.mark.parametrize("text", ["", "\n\n  \n", "# only a comment\n# and another\n", "---\n", "null\n"])
def test_an_empty_file_says_so(tmp_path: Path, text: str) -> None:
    [problem] = problems_reading(write(tmp_path, text))
    assert ("is empty" in problem or "holds no values" in problem) and "needs at least `environments:`" in problem


def test_a_utf8_bom_is_accepted(tmp_path: Path) -> None:
    data, source = read_yaml_file(write(tmp_path, b"\xef\xbb\xbf" + MINIMAL.encode()))
    assert data["environments"] == [{"name": "countdown"}] and source.lines[("environments",)] == 1


def test_top_level_keys_that_yaml_reads_as_non_strings(tmp_path: Path) -> None:
    [problem] = problems_reading(write(tmp_path, MINIMAL + "on: 1\n"))
    assert "run.yaml:3: YAML reads the key 'on' as a boolean" in problem and '"on":' in problem


def test_invalid_dates_are_located_and_quoting_suggested(tmp_path: Path, parser: type) -> None:
    [problem] = problems_reading(write(tmp_path, MINIMAL + "wandb_run_name: 2024-13-45\n"))
    assert "run.yaml:3:17: '2024-13-45' is read by YAML as a timestamp" in problem and '"2024-13-45"' in problem


def test_locations_are_capped_and_fall_back_to_ancestors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(yaml_reader, "MAX_LOCATIONS", 5)
    tags = "".join(f"  - t{i}\n" for i in range(20))
    data, source = read_yaml_file(write(tmp_path, "wandb_tags:\n" + tags + "seed: 1\n"))
    assert len(data["wandb_tags"]) == 20 and len(source.lines) <= 6
    assert source.lines[("seed",)] == 22  # top-level keys are always recorded
    assert source.line_of(("wandb_tags", 19)) == (1, False)


# ------------------------------------------------------------------ command line


def test_a_bare_flag_is_true_only_for_boolean_fields() -> None:
    assert parse_overrides(["--use_tis", "--seed", "3"])[1] == {"use_tis": True, "seed": 3}
    with pytest.raises(ConfigError) as info:
        parse_overrides(["--learning_rate", "--seed", "3"])
    [problem] = info.value.problems
    assert problem.startswith("--learning_rate needs a value")
    for args in (["--wandb_run_name"], ["--learning-rate"], ["--learning_rate="], ["--config"]):
        with pytest.raises(ConfigError, match="needs a value"):
            parse_overrides(args)
    assert parse_overrides(["--wandb_run_name="])[1] == {"wandb_run_name": ""}  # text may be empty
    assert parse_overrides(["--use_tiss"])[1] == {"use_tiss": True}  # unknown: validation names it


def test_field_kinds_come_from_a_callback() -> None:
    kinds = {"fast": "bool", "label": "text"}
    kind = lambda name: kinds.get(name, "unknown")  # noqa: E731
    assert parse_overrides(["--fast", "--label", "007"], field_kind=kind)[1] == {"fast": True, "label": "007"}
    with pytest.raises(ConfigError, match="--fast needs a value"):
        parse_overrides(["--fast"], field_kind=lambda name: "other")
    from telescope.schema.config import TelescopeConfig

    of = schema_field_kind(TelescopeConfig)
    assert [of(n) for n in ("use_tis", "resume_from_checkpoint", "model", "chat_template", "seed", "x")] == [
        "bool",
        "bool",
        "text",
        "text",
        "other",
        "unknown",
    ]


def test_cli_values_get_the_same_yaml_checks() -> None:
    with pytest.raises(ConfigError) as info:
        parse_overrides(["--environments", "[{name: a, name: b}]"])
    assert "duplicate key 'name' in environments[0] at --environments:1" in info.value.problems[0]
    with pytest.raises(ConfigError, match="alias bomb"):
        parse_overrides(["--ray_runtime_env", _bomb(8).replace("\n", ", ").join("{}")[:-3] + "}"])


def test_without_libyaml_large_files_warn_and_still_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(yaml_reader, "PARSER", yaml.SafeLoader)
    monkeypatch.setattr(yaml_reader, "SLOW_PARSER_WARNING_BYTES", 10)
    with pytest.warns(yaml_reader.SlowYamlWarning, match="pure-Python parser"):
        data, _ = load_yaml(MINIMAL, "run.yaml")
    assert data == {"environments": [{"name": "countdown"}]}
