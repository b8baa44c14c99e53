"""The ``telescope`` command line."""
