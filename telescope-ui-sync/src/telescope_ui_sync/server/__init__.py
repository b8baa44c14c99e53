"""The dashboard server: a JSON API over the synced DuckDB file, and the built front end."""
