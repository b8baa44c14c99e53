"""Where config values come from: a YAML file and ``--name value`` command-line overrides.

Reading only: this module turns text into plain Python values (and remembers the
line of each key, at any depth, for messages); validating them against the schema
is :mod:`telescope.config.loader`'s job. The YAML parsing and its checks (duplicate
keys, alias bombs, nesting) are in :mod:`telescope.config.yaml_reader`.

Schema knowledge comes in as parameters: :func:`parse_overrides` asks a
``field_kind`` callback whether a name is a boolean, text or other field (by
default derived from the composed schema), so a schema composed elsewhere can
pass its own.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from telescope.config.errors import ConfigError
from telescope.config.yaml_reader import SourceMap, load_yaml
from telescope.schema.entries import BOUNDED_LISTS

#: What :func:`parse_overrides` needs to know of a field: ``bool`` (a bare ``--flag``
#: means true), ``text`` (the value is kept verbatim), ``other`` (parsed as YAML,
#: a value is required), ``unknown`` (not a field: parsed like ``other``, but a
#: bare flag is kept as true so that validation reports the unknown name).
FieldKind = Literal["bool", "text", "other", "unknown"]

# Characters YAML forbids (C0/C1 controls except tab and line breaks, surrogates, U+FFFE/FFFF).
_NOT_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

EMPTY_HINT = (
    "a run config needs at least `environments:` (e.g. `environments: [{name: countdown}]`); "
    "`telescope config defaults` prints every parameter"
)


def _decode(path: Path, raw: bytes) -> str:
    """UTF-8 text of a config; a bad byte is reported by line, column and offset."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        hint = ""
        if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
            hint = " (the file starts with a UTF-16 byte-order mark)"
        raise ConfigError(
            [
                f"{path}:{line}:{column}: not UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start} "
                f"({exc.reason}){hint}; save the file as UTF-8"
            ]
        ) from None
    bad = _NOT_PRINTABLE.search(text)
    if bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        raise ConfigError(
            [
                f"{path}:{line}:{column}: the character U+{ord(bad.group()):04X} is not allowed in YAML "
                "(a control character); delete it"
            ]
        )
    return text.removeprefix("\ufeff")


def read_yaml_file(path: Path) -> tuple[dict[str, Any], SourceMap]:
    """Parse a YAML config; returns (mapping, where each key and item was written).

    The :class:`SourceMap` gives the line of keys at any depth by path
    (``source.lines[("environments", 0, "kwargs", "seed")]``; top-level keys are
    1-tuples). Raises :class:`ConfigError` for a missing, unreadable, non-UTF-8,
    empty or invalid file, and for a top level that is not a mapping of names.
    """
    if not path.exists():
        raise ConfigError([f"config file not found: {path}. Check the path (relative to {Path.cwd()})."])
    if path.is_dir():
        raise ConfigError([f"{path} is a directory, not a config file"])
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError([f"cannot read config file {path}: {exc}"]) from None
    data, source = load_yaml(_decode(path, raw), str(path), max_items=BOUNDED_LISTS)
    if data is None:
        what = "is empty" if not raw.strip() else "holds no values (only comments, `---` or null)"
        raise ConfigError([f"{path} {what}: {EMPTY_HINT}"])
    if not isinstance(data, dict):
        raise ConfigError(
            [
                f"{path}: the top level must be a mapping of parameter names to values (key: value), "
                f"not a {type(data).__name__}"
            ]
        )
    if not all(isinstance(key, str) for key in data):
        # keys YAML read as booleans, numbers, dates or null: their text is in the source map
        odd = [(loc[0], line) for loc, line in source.lines.items() if len(loc) == 1 and loc[0] not in data]
        raise ConfigError(
            [
                f"{path}:{line}: YAML reads the key {text!r} as a {_kind_name(text)}, not a name; "
                f'parameter names are text (if {text!r} is meant, quote it: "{text}":)'
                for text, line in odd
            ]
        )
    return data, source


def _kind_name(text: Any) -> str:
    value = yaml.safe_load(f"{text}\n")
    return "null" if value is None else type(value).__name__.replace("bool", "boolean")


def schema_field_kind(model: Any) -> Callable[[str], FieldKind]:
    """A ``field_kind`` callback for :func:`parse_overrides` from a pydantic model's fields."""

    def kind(name: str) -> FieldKind:
        info = model.model_fields.get(name)
        if info is None:
            return "unknown"
        annotation = info.annotation
        members = {annotation}
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            members = {a for a in typing.get_args(annotation) if a is not type(None)}
        if bool in members:
            return "bool"
        if members == {str}:
            return "text"
        return "other"

    return kind


def _default_field_kind(name: str) -> FieldKind:
    """Field kinds of the composed schema (the core's and the installed plugins' fields)."""
    from telescope.config.composition import composed_schema

    return schema_field_kind(composed_schema().model)(name)


def parse_overrides(
    args: Sequence[str], field_kind: Callable[[str], FieldKind] | None = None
) -> tuple[str | None, dict[str, Any]]:
    """Parse CLI overrides; returns (``--config`` value if given, {field: value}).

    ``--name value`` and ``--name=value`` (dashes in names read as underscores);
    values are YAML (so ``[a, b]`` is a list; duplicate keys and alias bombs are
    refused as in files), except for text fields, which keep the text as given
    (``null``/``~`` still mean null). A bare ``--name`` means true for boolean fields
    only (and for unknown names, which validation then reports with suggestions);
    any other field given bare, or as ``--name=``, is an error ("--learning_rate
    needs a value"). ``field_kind`` says which is which (default: the fields of
    composed schema; see :func:`schema_field_kind`).
    """
    kind_of = field_kind or _default_field_kind
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
        written, eq, raw = token[2:].partition("=")
        name = written.replace("-", "_")
        given = bool(eq)
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
            raw, given = args[i + 1], True
            i += 1
        i += 1
        kind: FieldKind = "text" if name == "config" else kind_of(name)
        if not given and kind in ("bool", "unknown"):
            values[name] = True
            continue
        if not given or (raw == "" and kind != "text") or (name == "config" and not raw):
            example = "FILE" if name == "config" else "VALUE"
            bare = " (only true/false parameters may be given bare)" if not given else ""
            problems.append(f"--{written} needs a value: write --{written} {example} or --{written}={example}{bare}")
            continue
        if name == "config":
            config_path = raw
        elif kind == "text" and raw not in ("null", "~"):
            values[name] = raw
        else:
            try:
                values[name] = load_yaml(raw, f"--{written}", (name,), BOUNDED_LISTS)[0]
            except ConfigError as exc:
                problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems, "command line")
    return config_path, values
