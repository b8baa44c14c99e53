"""Loading datasets: one call for hub names and local files, and stable sample ids.

:func:`load_rows` always goes through ``datasets.load_dataset``:

- a hub name (``"HuggingFaceH4/MATH-500"``) loads as usual (with ``subset`` as the
  config name);
- a local file (``.json``, ``.jsonl``, ``.csv``, ``.parquet``) loads with the matching
  builder and ``data_files=``, so tests and offline runs use the same code path. It is
  checked first (:func:`telescope.config.data_files.data_file_problems`, the check
  ``telescope config validate`` runs on an environment's ``data_files``): a missing
  file, a line that does not parse, or a row without one of ``fields`` raises
  ``ValueError`` naming the file, the line and the field, where ``datasets`` would
  fail with a message that names none of them (or look the name up on the hub);
- a local directory loads as a dataset folder.

``datasets`` is imported on first use, never when a plugin module is imported.
:func:`stable_id` makes ids that survive re-ordering or filtering of the source: a
short hash of the environment name and the row's identifying content.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

from telescope.config.data_files import DATA_FILE_SUFFIXES, data_file_problems

_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_rows(
    dataset_name: str, split: str = "train", subset: str | None = None, fields: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The rows of a dataset (hub name, local file or local folder) as plain dicts.

    A local file must exist, parse, and give every row ``fields`` (else ``ValueError``).
    """
    ext = os.path.splitext(dataset_name)[1].lower()
    if ext in DATA_FILE_SUFFIXES:
        problems = data_file_problems(dataset_name, fields)
        if problems:
            raise ValueError("bad data file: " + "; ".join(problems))
    import datasets

    if os.path.isfile(dataset_name) and ext in _BUILDERS:
        ds = datasets.load_dataset(_BUILDERS[ext], data_files={split: dataset_name}, split=split)
    elif subset is not None:
        ds = datasets.load_dataset(dataset_name, subset, split=split)
    else:
        ds = datasets.load_dataset(dataset_name, split=split)
    return [dict(row) for row in ds]


def stable_id(prefix: str, *parts: Any) -> str:
    """``prefix-<12 hex>``: a content hash, the same on every machine and run."""
    blob = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=True)
    return f"{prefix}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def unique_ids(ids: list[str]) -> list[str]:
    """Disambiguate duplicate ids (identical rows) by their occurrence: ``id``, ``id.1``, ..."""
    seen: dict[str, int] = {}
    out: list[str] = []
    for i in ids:
        n = seen.get(i, 0)
        seen[i] = n + 1
        out.append(i if n == 0 else f"{i}.{n}")
    return out
