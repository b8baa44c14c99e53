"""Fixtures of the trainer tests: one tiny model per session, built locally."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from telescope.testing.trainer import tiny_model_for_session

    return tiny_model_for_session(tmp_path_factory)
