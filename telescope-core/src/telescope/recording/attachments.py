"""Rollout attachments (the screenshots a browser environment keeps) as files of the run directory.

A rollout record (:func:`telescope.recording.run_store.rollout_record`) lists its
:class:`~telescope.api.records.Attachment` objects with their bytes;
:func:`store_attachments` writes each to ``media/step-<step>/`` in the run directory and
replaces the bytes with the file's ``path`` (relative to the run directory) and its
``bytes`` (size), so the rollout streams and every logger see paths, never image data.
A record's attachment entry: ``{"name", "media_type", "turn", "path", "bytes"}``.

Design: the files are written in the calling thread (the step's recorder), one small PNG
per browser action; they are plain files rather than Parquet columns so the dashboard
serves them as they are and a rollout block stays kilobytes a rollout. Names are made
unique with a random suffix (trained and discarded rollouts of one step number their
groups apart). Limits: nothing prunes ``media/``; an attachment's name is reduced to
letters, digits, ``.``, ``-`` and ``_``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from telescope.api.records import Attachment

MEDIA_DIR = "media"

#: The file suffix of each media type an environment may attach (others are stored as ``.bin``).
SUFFIXES = {"image/png": ".png", "image/jpeg": ".jpg", "text/plain": ".txt", "text/html": ".html"}


def attachment_entry(attachment: Attachment) -> dict[str, Any]:
    """The record entry of an attachment not yet written (its bytes under ``data``)."""
    return {
        "name": attachment.name,
        "media_type": attachment.media_type,
        "turn": attachment.turn,
        "data": attachment.data,
    }


def store_attachments(run_dir: Path, records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``records`` with every attachment's bytes written to a file (see the module docstring).

    A record without attachments, or whose attachments are already written, is returned as it is.
    """
    stored: list[dict[str, Any]] = []
    for record in records:
        entries = record.get("attachments")
        if not entries or not any("data" in entry for entry in entries):
            stored.append(dict(record))
            continue
        folder = Path(run_dir, MEDIA_DIR, f"step-{int(record.get('step', 0))}")
        folder.mkdir(parents=True, exist_ok=True)
        written = [_write(run_dir, folder, record, entry) if "data" in entry else entry for entry in entries]
        stored.append({**record, "attachments": written})
    return stored


def _write(run_dir: Path, folder: Path, record: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    data: bytes = entry["data"]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", str(entry.get("name", "attachment")))[:60]
    suffix = SUFFIXES.get(str(entry.get("media_type")), ".bin")
    stem = f"g{record.get('group_index', -1)}-r{record.get('rollout_index', 0)}-t{entry.get('turn', 0)}-{name}"
    path = folder / f"{stem}-{uuid.uuid4().hex[:8]}{suffix}"
    path.write_bytes(data)
    return {
        "name": entry.get("name"),
        "media_type": entry.get("media_type"),
        "turn": entry.get("turn", 0),
        "path": path.relative_to(run_dir).as_posix(),
        "bytes": len(data),
    }
