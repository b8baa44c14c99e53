"""telescope-core's packages stand on floors: a module imports only from its own package or from a floor below.

The floors follow the data flow (docs/architecture.md): the schema and the plugin API
at the ground, the host helpers and the plugin system above them, the config loader,
the components (trainer, transports, recording, algorithms, compaction), the
inference side, the orchestrator, the runtime that launches it all, the CLI on top.
Every import counts, also one inside a function or under ``TYPE_CHECKING``: a cycle
held apart by a lazy import is still a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import telescope

#: Each floor's packages (a top-level module is its own package), from the ground up.
FLOORS: list[set[str]] = [
    {"schema", "models"},
    {"api"},
    {"system", "plugins"},
    {"config"},
    {"algorithms", "compaction", "transports", "trainer", "recording"},
    {"inference"},
    {"orchestrator"},
    {"runtime", "testing"},
    {"cli"},
]

ROOT = Path(telescope.__file__).parent


def floor_of(package: str) -> int:
    return next(i for i, packages in enumerate(FLOORS) if package in packages)


def package_of(module: str) -> str | None:
    """``telescope.x.y`` -> ``x``; None for the package face ``telescope`` itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "telescope" else None


def imported_modules(tree: ast.AST) -> list[tuple[str, int]]:
    """Every ``telescope...`` module an import names (``from telescope.x import y`` also names ``telescope.x.y``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "telescope":
                found += [(f"telescope.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((node.module, node.lineno))
    return [(name, line) for name, line in found if name.split(".")[0] == "telescope"]


def climbing_imports() -> list[str]:
    found = []
    for source in sorted(ROOT.rglob("*.py")):
        relative = source.relative_to(ROOT)
        if len(relative.parts) == 1:
            continue  # the package face (telescope/__init__.py) hands names on
        own = relative.parts[0].removesuffix(".py")
        for module, line in imported_modules(ast.parse(source.read_text(encoding="utf-8"))):
            target = package_of(module)
            if target is None or target == own or target == "__version__" or target == "hookimpl":
                continue
            if floor_of(target) >= floor_of(own):
                found.append(f"{relative}:{line} imports {module} ({target} is not below {own})")
    return found


def test_every_package_has_a_floor() -> None:
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    packages |= {p.stem for p in ROOT.glob("*.py") if p.name != "__init__.py"}
    assert packages <= set().union(*FLOORS), f"packages without a floor: {packages - set().union(*FLOORS)}"


def test_no_import_climbs_to_a_floor_above() -> None:
    found = climbing_imports()
    assert not found, "imports that climb:\n" + "\n".join(found)


def test_the_check_sees_lazy_and_type_checking_imports() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from telescope.schema.config import TelescopeConfig\n"
        "def f():\n    from telescope import orchestrator\n    import telescope.cli.main\n"
    )
    modules = [module for module, _ in imported_modules(ast.parse(source))]
    assert modules == ["telescope.schema.config", "telescope.orchestrator", "telescope.cli.main"]
    assert [package_of(m) for m in modules] == ["schema", "orchestrator", "cli"]
