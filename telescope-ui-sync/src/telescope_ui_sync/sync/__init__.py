"""Sync run directories (and W&B runs) into DuckDB: :mod:`.schema` (the tables), :mod:`.streams`
(reading a run's files from a saved position), :mod:`.ingest` (bulk inserts in DuckDB and
Arrow), :mod:`.records` (the same in Python, for small streams and fallbacks), :mod:`.base`
and :mod:`.syncer` (a run's syncer, the service that finds runs), :mod:`.wandb_source`."""

from telescope_ui_sync.sync.schema import connect
from telescope_ui_sync.sync.syncer import RunSyncer, SyncService, discover, run_id_for

__all__ = ["RunSyncer", "SyncService", "connect", "discover", "run_id_for"]
