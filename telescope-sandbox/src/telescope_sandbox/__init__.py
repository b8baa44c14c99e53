"""Telescope sandboxes: pool and providers."""

__version__ = "0.1.0"
