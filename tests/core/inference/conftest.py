"""Fixtures of the inference tests: a tiny local model, an engine, an in-thread server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from telescope.models.tiny import PRESETS, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", PRESETS["test"])


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path) -> Iterator[object]:
    from telescope.inference.embedded.engine import Engine, EngineSettings

    eng = Engine(EngineSettings(model_path=str(tiny_model_path), max_model_len=512, max_num_seqs=16)).start()
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def server(engine: object) -> Iterator[object]:
    from telescope.inference.embedded.server import ServerThread, create_app

    srv = ServerThread(create_app(engine), host="127.0.0.1", port=0).start()  # type: ignore[arg-type]
    yield srv
    srv.stop()
