"""telescope-ui-sync: ``telescope ui``, the dashboard of Telescope runs.

Two halves, each usable alone:

- :mod:`telescope_ui_sync.sync` copies run directories (read only through
  :class:`telescope.recording.run_reader.RunReader`) into one DuckDB file, incrementally
  and resumably, while the runs write them.
- :mod:`telescope_ui_sync.server` serves a JSON API over that DuckDB file and the
  built front end (``static/``, shipped inside the wheel).

The CLI entry (:mod:`telescope_ui_sync.plugin`) imports neither until ``telescope ui`` runs.
"""

__version__ = "0.1.0"
