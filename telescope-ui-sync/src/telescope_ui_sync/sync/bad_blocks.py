"""The sealed blocks of a run that could not be read: skipped, named, and read again only when they change.

A sealed Parquet block of ``rollouts/`` or ``events/`` that DuckDB or Arrow cannot read
(truncated, corrupt, unreadable) must not hide the rest of the run, nor be retried on
every pass. The syncer skips it (its cursor moves past it), and :class:`BadBlocks`
remembers it in the ``bad_blocks`` table with the error and the file's size and
modification time, logs it once, and offers it again (:meth:`BadBlocks.changed`) only
when its size or modification time differ, e.g. after the file was restored. The
dashboard shows the table (``/api/health``, ``/api/runs`` and a banner on the page).

Limits: a block read later (after it was repaired) gets record numbers after those
already synced, so its rows sort after the blocks that followed it; a block that is
deleted is forgotten.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

log = logging.getLogger("telescope_ui_sync.sync.syncer")


@dataclass(frozen=True)
class BadBlock:
    """A block that could not be read: its stream, file, error and the file's state then."""

    stream: str
    path: Path
    error: str
    size: int | None
    mtime: float | None


def _stat(path: Path) -> tuple[int | None, float | None]:
    try:
        stat = os.stat(path)
    except OSError:
        return None, None
    return stat.st_size, stat.st_mtime


class BadBlocks:
    """The bad blocks of one run, kept in the ``bad_blocks`` table (see the module docstring)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str, run_dir: Path) -> None:
        self.con = con
        self.run_id = run_id
        self.run_dir = run_dir

    def _name(self, path: Path) -> str:
        try:
            return path.relative_to(self.run_dir).as_posix()
        except ValueError:
            return str(path)

    def add(self, stream: str, path: Path, error: BaseException) -> None:
        """Remember ``path`` as unreadable (replacing what was known of it) and log it once."""
        size, mtime = _stat(path)
        message = f"{type(error).__name__}: {error}".strip()
        self.con.execute(
            "INSERT OR REPLACE INTO bad_blocks VALUES (?, ?, ?, ?, ?, ?, ?)",
            [self.run_id, stream, self._name(path), message[:2000], size, mtime, time.time()],
        )
        log.warning(
            "skipping %s block %s of run %s, which cannot be read (%s); the rest of the run is synced, "
            "and the block is read again when the file changes",
            stream,
            path,
            self.run_dir,
            message,
        )

    def remove(self, stream: str, path: Path) -> None:
        self.con.execute(
            "DELETE FROM bad_blocks WHERE run_id = ? AND stream = ? AND file = ?",
            [self.run_id, stream, self._name(path)],
        )

    def clear(self, stream: str) -> None:
        """Forget the stream's bad blocks (it is read again from its start)."""
        self.con.execute("DELETE FROM bad_blocks WHERE run_id = ? AND stream = ?", [self.run_id, stream])

    def known(self, stream: str) -> list[BadBlock]:
        rows = self.con.execute(
            "SELECT file, error, size, mtime FROM bad_blocks WHERE run_id = ? AND stream = ? ORDER BY file",
            [self.run_id, stream],
        ).fetchall()
        return [BadBlock(stream, self.run_dir / file, error, size, mtime) for file, error, size, mtime in rows]

    def changed(self, stream: str) -> list[BadBlock]:
        """The stream's bad blocks whose file changed since it failed (a file that is gone is forgotten)."""
        out = []
        for block in self.known(stream):
            size, mtime = _stat(block.path)
            if size is None:
                self.remove(stream, block.path)
            elif (size, mtime) != (block.size, block.mtime):
                out.append(block)
        return out
