"""The scripts that write the CPU examples' data files (``configs/examples/cpu/data/make_*.py``), loaded as modules."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

DATA = Path(__file__).resolve().parents[2] / "configs" / "examples" / "cpu" / "data"


def data_script(name: str) -> ModuleType:
    """``configs/examples/cpu/data/<name>.py`` as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, DATA / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
