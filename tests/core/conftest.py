"""Fixtures for the core tests: publish throwaway distributions with ``telescope`` entry points.

A distribution is a ``<name>-<version>.dist-info`` folder (METADATA and
entry_points.txt) next to its plugin module in a folder put on ``sys.path``;
``importlib.metadata`` discovers it exactly as it discovers a pip-installed one.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

MakeDist = Callable[[str, str, str], str]


@pytest.fixture
def make_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeDist]:
    """make_distribution(dist_name, module_name, module_source) -> module name."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    created: list[str] = []

    def make(dist_name: str, module_name: str, source: str) -> str:
        (site / f"{module_name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        info = site / f"{dist_name.replace('-', '_')}-1.2.3.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 1.2.3\n", encoding="utf-8")
        (info / "entry_points.txt").write_text(f"[telescope]\n{module_name} = {module_name}\n", encoding="utf-8")
        created.append(module_name)
        return module_name

    yield make
    for name in created:
        sys.modules.pop(name, None)
