"""Shared test setup: a clean plugin manager per test, local-only services, the ``requires_dist`` marker.

``@pytest.mark.requires_dist("telescope-envs")`` (or as a module's ``pytestmark``) skips a
test when that distribution is not installed - its modules *and* its ``telescope`` entry
points, which is what registers its plugins - so ``nox -s "tests(package='core')"``
(telescope-core alone) skips the core tests that use an environment or sandbox provider
from the satellite packages instead of failing.
"""

from __future__ import annotations

import importlib.metadata
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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "requires_dist(*names): skip unless these distributions are installed (e.g. telescope-envs)"
    )


def distribution_installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers("requires_dist"):
        missing = [name for name in marker.args if not distribution_installed(name)]
        if missing:
            pytest.skip(f"needs {', '.join(missing)} installed (pip install {' '.join(missing)})")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On pytest-xdist workers, the end-to-end runs first (a stable sort: otherwise as collected).

    They are the longest tests (a minute or more each, a Ray cluster apiece); collected in
    the middle of the suite, the last of them ran at the end of ``./dev test``'s first part
    with one worker idle (six minutes at half the machine in one CI run). ``./dev test``
    hands each worker one test more as it finishes one (``--maxschedchunk 1``; by default
    xdist gives each a quarter of its share at once, so the first worker would get every
    end-to-end run).

    The first test that needs the dashboard tests' real run (``real_run_source`` in
    tests/ui_sync/conftest.py, a short run through Ray that workers share) goes with them:
    it makes the run early, and the other tests that need it find it made. Left where they
    were collected, two of them (next to each other) went to both workers at once, and one
    worker waited idle for the other to make it (37 s in one CI run).
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        builder = next((item for item in items if "real_run_source" in getattr(item, "fixturenames", ())), None)
        items.sort(key=lambda item: 0 if item.nodeid.startswith("tests/e2e/") or item is builder else 1)
