"""Shared test setup: a clean plugin manager per test, local-only services."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Services this machine must never reach during tests.
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _fresh_plugin_manager() -> Iterator[None]:
    """Each test sees the installed plugins, loaded anew (tests may register extra ones)."""
    from telescope.plugins.manager import reset_plugin_manager

    reset_plugin_manager()
    yield
    reset_plugin_manager()
