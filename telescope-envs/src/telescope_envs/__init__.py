"""Telescope environments and evals."""

__version__ = "0.1.0"
