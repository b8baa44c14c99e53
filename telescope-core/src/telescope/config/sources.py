"""Where config values come from: a YAML file and ``--name value`` command-line overrides.

Reading only: this module turns text into plain Python values (and remembers the
line of each key for messages); validating them against the schema is
:mod:`telescope.config.loader`'s job.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from telescope.config.errors import ConfigError
from telescope.config.schema import TelescopeConfig


def read_yaml_file(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """Parse a YAML config; returns (mapping, line number of each top-level key)."""
    if not path.exists():
        raise ConfigError([f"config file not found: {path}. Check the path (relative to {Path.cwd()})."])
    if path.is_dir():
        raise ConfigError([f"{path} is a directory, not a config file"])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"cannot read config file {path}: {exc}"]) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        detail = f"{context}, {problem}" if context else problem
        raise ConfigError([f"invalid YAML at {where}: {detail}"]) from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict) or not isinstance(node, yaml.MappingNode):
        raise ConfigError(
            [
                f"{path}: the top level must be a mapping of parameter names to values (key: value), "
                f"not a {type(data).__name__}"
            ]
        )
    lines = {str(key.value): key.start_mark.line + 1 for key, _ in node.value}
    return data, lines


def _is_text_field(name: str) -> bool:
    """Whether a top-level field takes a string (so CLI text is kept verbatim)."""
    info = TelescopeConfig.model_fields.get(name)
    if info is None:
        return False
    annotation = info.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = {a for a in typing.get_args(annotation) if a is not type(None)}
        return args == {str}
    return annotation is str


def parse_overrides(args: Sequence[str]) -> tuple[str | None, dict[str, Any]]:
    """Parse CLI overrides; returns (``--config`` value if given, {field: value})."""
    config_path: str | None = None
    values: dict[str, Any] = {}
    problems: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--") or token == "--":
            problems.append(f"unexpected argument {token!r}: overrides are written --name value or --name=value")
            i += 1
            continue
        name, eq, raw = token[2:].partition("=")
        name = name.replace("-", "_")
        if not eq:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                raw = args[i + 1]
                i += 1
            else:
                raw = "true"
        i += 1
        if name == "config":
            config_path = raw
            continue
        if _is_text_field(name) and raw not in ("null", "~"):
            values[name] = raw
            continue
        try:
            values[name] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problems.append(f"--{name}: the value {raw!r} is not valid YAML/JSON ({exc})")
    if problems:
        raise ConfigError(problems, "command line")
    return config_path, values
