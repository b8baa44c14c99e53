"""What the syncer of every source shares: the result of a pass, the run's row, saved
positions and transactions (:class:`Syncer`); see :mod:`.syncer` and :mod:`.wandb_source`."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import duckdb

log = logging.getLogger("telescope_ui_sync.sync.syncer")


@dataclass
class PassResult:
    """What one pass of a run's syncer added."""

    rows: dict[str, int] = field(default_factory=dict)
    missing: bool = False

    @property
    def total(self) -> int:
        return sum(self.rows.values())


class Syncer:
    """What the syncer of any source has: its run's row, its saved positions, transactions."""

    source = "local"

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str, name: str, path: str, root: str) -> None:
        self.con = con
        self.run_id = run_id
        self._missing: bool | None = None
        self.con.execute(
            "INSERT INTO runs (run_id, name, path, root, source, first_seen) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (run_id) DO UPDATE SET root = excluded.root",
            [run_id, name, path, root, self.source, time.time()],
        )

    def sync_once(self) -> PassResult:
        raise NotImplementedError

    def saved_positions(self) -> dict[str, dict[str, Any]]:
        rows = self.con.execute("SELECT stream, cursor_json FROM sync_cursors WHERE run_id = ?", [self.run_id])
        return {stream: json.loads(text) for stream, text in rows.fetchall()}

    def _save_cursor(self, stream: str, position: dict[str, Any]) -> None:
        self.con.execute(
            "INSERT OR REPLACE INTO sync_cursors VALUES (?, ?, ?)", [self.run_id, stream, json.dumps(position)]
        )

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self.con.begin()
        try:
            yield
            self.con.commit()
        except BaseException:
            self.con.rollback()
            raise

    def _set_missing(self, missing: bool, what: object = None) -> None:
        if self._missing is missing:
            return
        self._missing = missing
        self.con.execute("UPDATE runs SET missing = ? WHERE run_id = ?", [missing, self.run_id])
        if missing:
            log.warning("%s has gone; its synced data stays viewable", what or self.run_id)
