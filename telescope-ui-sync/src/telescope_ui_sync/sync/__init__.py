"""Sync run directories into DuckDB: :mod:`.schema`, :mod:`.streams`, :mod:`.records`, :mod:`.syncer`."""

from telescope_ui_sync.sync.schema import connect
from telescope_ui_sync.sync.syncer import RunSyncer, SyncService, discover, run_id_for

__all__ = ["RunSyncer", "SyncService", "connect", "discover", "run_id_for"]
