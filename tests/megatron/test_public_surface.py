"""telescope-megatron builds on the declared public surface of ``telescope.trainer`` only."""

from __future__ import annotations

import ast
from pathlib import Path

import telescope_megatron

from telescope.trainer import public


def trainer_imports(source: Path) -> list[tuple[str, str, int]]:
    """Every ``telescope.trainer...`` import of a file: (module, name, line)."""
    found = []
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("telescope.trainer"):
            found += [(node.module or "", alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names if a.name.startswith("telescope.trainer")]
    return found


def test_megatron_imports_only_the_public_trainer_surface() -> None:
    package = Path(telescope_megatron.__file__).parent
    outside = []
    for source in sorted(package.rglob("*.py")):
        for module, name, line in trainer_imports(source):
            if module != "telescope.trainer.public" or name not in public.__all__:
                outside.append(f"{source.name}:{line}: from {module} import {name}")
    assert not outside, "imports outside telescope.trainer.public:\n" + "\n".join(outside)


def test_the_surface_names_what_it_exports() -> None:
    assert sorted(public.__all__) == sorted(n for n in vars(public) if not n.startswith("_") and n != "annotations")
    for name in public.__all__:
        assert getattr(public, name) is not None


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    source = tmp_path / "module.py"
    source.write_text("from telescope.trainer.fsdp import FSDPBackend\nimport telescope.trainer.packing\n")
    assert trainer_imports(source) == [
        ("telescope.trainer.fsdp", "FSDPBackend", 1),
        ("telescope.trainer.packing", "", 2),
    ]
