"""Checks of local data files named by environment keyword arguments, before anything starts.

An environment declares which of its keyword arguments may name a local data file,
and the fields every row needs (:attr:`telescope.api.environment.EnvironmentBase.data_files`,
for example countdown's ``{"dataset_name": ("nums", "target")}``). A value is taken
for a local file when it ends in a data file suffix (``.json``, ``.jsonl``, ``.csv``,
``.parquet``) or is written as a path (it starts with ``/``, ``.`` or ``~``); anything
else (a hub id, ``generated``) is left to the environment. For such a value
:func:`data_file_kwargs_problems` reports, one message each, naming the keyword
argument, the file, the line and the field:

- a path that does not exist (a folder that exists is accepted: it loads as a dataset
  folder, which is not read here);
- JSON Lines (``.jsonl``, and ``.json`` holding one object a line): a line that is not
  valid JSON (a truncated file: its last line), or not an object;
- a JSON array (``.json``): the file's syntax, an element that is not an object;
- CSV: a missing column in the header line;
- every row of these: a declared field that is missing or null (an empty cell in CSV).

Parquet files are only checked for existence (reading them needs pyarrow). The whole
file is read (one JSON parse per row: seconds for millions of rows); at most
:data:`MAX_PROBLEMS_PER_FILE` problems are listed per file, with how many more there are.
:func:`data_file_problems` is the same check for one file; environments call it when they
load a local file, so a file edited after validation still fails with these messages.
Pure functions: nothing raises for bad input, nothing is imported from the network side.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from telescope.config.constructors import constructor_of

#: Suffixes that make a keyword value a local data file (what ``datasets`` loads with a builder).
DATA_FILE_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")

#: Problems listed per file before the rest are only counted.
MAX_PROBLEMS_PER_FILE = 5


def looks_like_data_file(value: object) -> TypeGuard[str]:
    """Whether a keyword value names a local data file or folder rather than a hub dataset or a keyword."""
    if not isinstance(value, str) or not value.strip():
        return False
    return value.lower().endswith(DATA_FILE_SUFFIXES) or value.startswith(("/", ".", "~"))


def data_file_problems(value: str, fields: Sequence[str] = ()) -> list[str]:
    """Problems with data file ``value`` whose rows need ``fields`` (see the module docstring); [] if none."""
    path = Path(value).expanduser()
    shown = value if str(path.resolve()) == value else f"{value} ({path.resolve()})"
    if not path.exists():
        return [f"{shown} does not exist; give an existing data file ({', '.join(DATA_FILE_SUFFIXES)}) or folder"]
    if path.is_dir():
        return []
    suffix = path.suffix.lower()
    if suffix not in (".json", ".jsonl", ".csv"):
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [f"{shown} cannot be read as UTF-8 text: {exc}"]
    if suffix == ".csv":
        found = _csv_problems(text, fields)
    elif suffix == ".json" and text.lstrip().startswith("["):
        found = _json_array_problems(text, fields)
    else:
        found = _json_lines_problems(text, fields)
    problems = [f"{shown} {p}" for p in found]
    if len(problems) > MAX_PROBLEMS_PER_FILE:
        more = len(problems) - MAX_PROBLEMS_PER_FILE
        problems = [*problems[:MAX_PROBLEMS_PER_FILE], f"{shown}: {more} more problem(s) like these"]
    return problems


def data_file_kwargs_problems(name: str, cls: type, kwargs: Mapping[Any, Any]) -> list[str]:
    """Problems with the local data files that environment ``name``'s ``kwargs`` name (its class's ``data_files``)."""
    declared = getattr(cls, "data_files", None)
    if not isinstance(declared, Mapping):
        return []
    problems: list[str] = []
    for key, fields in declared.items():
        value = kwargs[key] if key in kwargs else _default(cls, key)
        if looks_like_data_file(value):
            problems.extend(f"environment {name!r}: {key}: {p}" for p in data_file_problems(value, tuple(fields)))
    return problems


def _default(cls: type, key: str) -> object:
    """The constructor's default for ``key`` (its signature read once per class, as the kwargs checks read it)."""
    parameter = constructor_of(cls).keyword.get(key)
    return None if parameter is None or parameter.default is parameter.empty else parameter.default


def _row_problems(row: object, fields: Sequence[str], where: str) -> Iterator[str]:
    if not isinstance(row, dict):
        yield f"{where}: a row must be a JSON object ({{...}}), not {type(row).__name__}"
        return
    for field in fields:
        if field not in row:
            yield f"{where}: the row has no {field!r} field (every row needs: {', '.join(fields)})"
        elif row[field] is None:
            yield f"{where}: field {field!r} is null"


def _json_lines_problems(text: str, fields: Sequence[str]) -> list[str]:
    problems: list[str] = []
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            truncated = " (the file looks truncated)" if number == len(lines) else ""
            problems.append(f"line {number}: not valid JSON{truncated}: {exc.msg} at column {exc.colno}")
            continue
        problems.extend(_row_problems(row, fields, f"line {number}"))
    return problems


def _json_array_problems(text: str, fields: Sequence[str]) -> list[str]:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        return [f"line {exc.lineno}: not valid JSON: {exc.msg} at column {exc.colno}"]
    starts = _element_lines(text)
    problems: list[str] = []
    for index, row in enumerate(rows):
        line = starts[index] if index < len(starts) else 0
        problems.extend(_row_problems(row, fields, f"line {line} (element {index})"))
    return problems


def _element_lines(text: str) -> list[int]:
    """The line where each element of a valid top-level JSON array starts."""
    decoder = json.JSONDecoder()
    lines: list[int] = []
    position = text.index("[") + 1
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            return lines
        lines.append(text.count("\n", 0, position) + 1)
        _, position = decoder.raw_decode(text, position)


def _csv_problems(text: str, fields: Sequence[str]) -> list[str]:
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    missing = [f for f in fields if f not in header]
    if missing:
        return [f"line 1 (the header): no {f!r} column (columns: {', '.join(header) or 'none'})" for f in missing]
    problems: list[str] = []
    for row in reader:
        for field in fields:
            if not (row.get(field) or "").strip():
                problems.append(f"line {reader.line_num}: field {field!r} is empty")
    return problems
