"""Loggers on top of the local run store (W&B)."""
