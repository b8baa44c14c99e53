"""Turn the code blocks of docs/*.md into the example plugin projects they describe.

Conventions (docs/README.md states them for readers):

- a fenced block whose first line is ``# file: <path>`` is (part of) the file
  ``<path>`` of the page's example project; blocks naming the same file are
  joined in order, so a page can explain a module piece by piece;
- a block whose first line is ``# excerpt: <page>.md <path>`` repeats lines of a
  file of another page's project; it must appear there verbatim;
- in a ``console`` block, each ``$ telescope ...`` line is a command and the lines
  up to the next ``$`` are what it prints.

:func:`materialise` writes a page's project to a folder and "installs" it the way
pip would for the plugin system: a ``<name>-<version>.dist-info`` folder with the
``[project.entry-points.telescope]`` of the page's ``pyproject.toml``, next to the
packages, so that ``importlib.metadata`` finds its entry points on ``sys.path``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

_FENCE = re.compile(r"^```(\S*)\s*$")
_FILE = re.compile(r"^# file: (\S+)\s*$")
_EXCERPT = re.compile(r"^# excerpt: (\S+\.md) (\S+)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str
    line: int
    lang: str
    text: str

    @property
    def first_line(self) -> str:
        return self.text.split("\n", 1)[0]

    @property
    def body(self) -> str:
        """The block without its marker line."""
        return self.text.split("\n", 1)[1] if "\n" in self.text else ""

    @property
    def file(self) -> str | None:
        match = _FILE.match(self.first_line)
        return match.group(1) if match else None

    @property
    def excerpt(self) -> tuple[str, str] | None:
        match = _EXCERPT.match(self.first_line)
        return (match.group(1), match.group(2)) if match else None

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def pages() -> list[str]:
    return sorted(p.name for p in DOCS.glob("*.md"))


def blocks(page: str) -> list[Block]:
    """The fenced code blocks of ``docs/<page>``, in order."""
    found: list[Block] = []
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        start, lang = i + 1, match.group(1)
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            i += 1
        if i == len(lines):
            raise AssertionError(f"docs/{page}:{start}: a code block is not closed")
        found.append(Block(page, start, lang, "\n".join(lines[start:i])))
        i += 1
    return found


def project_files(page: str) -> dict[str, str]:
    """The files of a page's example project: ``path -> text`` (blocks of one file joined)."""
    parts: dict[str, list[str]] = {}
    for block in blocks(page):
        if block.file is not None:
            parts.setdefault(block.file, []).append(block.body.strip("\n"))
    return {path: "\n\n\n".join(chunks) + "\n" for path, chunks in parts.items()}


@dataclass
class Command:
    """A ``$ telescope ...`` line of a console block and the output it shows."""

    where: str
    argv: list[str]
    output: str


def console_commands(page: str) -> list[Command]:
    import shlex

    commands: list[Command] = []
    for block in blocks(page):
        if block.lang != "console":
            continue
        current: Command | None = None
        for offset, line in enumerate(block.text.split("\n")):
            if line.startswith("$ "):
                argv = shlex.split(line[2:])
                assert argv[0] == "telescope", f"{block.where}: only telescope commands are run, not {line!r}"
                current = Command(f"docs/{page}:{block.line + offset + 1}", argv[1:], "")
                commands.append(current)
            elif current is not None:
                current.output += line + "\n"
    return commands


@dataclass
class Project:
    """A page's example project, written to ``root`` and findable as an installed distribution."""

    page: str
    root: Path
    name: str
    version: str
    entry_points: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)

    @property
    def packages(self) -> list[str]:
        return sorted({p.split("/", 1)[0] for p in self.files if "/" in p and not p.startswith("tests/")})


def materialise(page: str, root: Path) -> Project:
    """Write the page's project under ``root`` and its ``.dist-info`` next to its packages."""
    files = project_files(page)
    assert "pyproject.toml" in files, f"docs/{page} has no `# file: pyproject.toml` block"
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    pyproject = tomllib.loads(files["pyproject.toml"])
    meta = pyproject["project"]
    entry_points: dict[str, str] = dict(meta.get("entry-points", {}).get("telescope", {}))
    assert entry_points, f"docs/{page}: pyproject.toml declares no [project.entry-points.telescope]"
    project = Project(page, root, meta["name"], meta["version"], entry_points, files)
    for package in project.packages:
        init = root / package / "__init__.py"
        if not init.exists():
            init.write_text("", encoding="utf-8")
    info = root / f"{re.sub(r'[-.]+', '_', project.name)}-{project.version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project.name}\nVersion: {project.version}\n", encoding="utf-8"
    )
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[telescope]\n{lines}", encoding="utf-8")
    return project


#: The repository's ruff rules, applied as in the example's own repository (telescope is third-party there).
RUFF_TOML = """\
line-length = 120
target-version = "py311"
src = ["."]

[lint]
select = ["E", "F", "W", "I", "B", "UP", "RUF", "SIM"]
ignore = ["RUF001", "RUF002", "RUF003", "B008", "SIM300", "B027"]
"""


def ruff_commands(root: Path) -> list[list[str]] | None:
    """``ruff check`` and ``ruff format --check`` over ``root`` (None when ruff is not installed)."""
    import shutil

    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        return None
    config = root / "ruff.toml"
    config.write_text(RUFF_TOML, encoding="utf-8")
    return [
        [ruff, "check", "--config", str(config), str(root)],
        [ruff, "format", "--check", "--config", str(config), str(root)],
    ]


def run_project_tests(project: Project, *pytest_args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the project's own ``tests/`` with pytest in a fresh interpreter, the project on its path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(project.root), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("TELESCOPE_DISABLE_PLUGINS", None)
    (project.root / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")  # not the repository's settings
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::pytest.PytestUnknownMarkWarning",
        "--rootdir",
        str(project.root),
        "-c",
        str(project.root / "pytest.ini"),
        str(project.root / "tests"),
        *pytest_args,
    ]
    return subprocess.run(command, cwd=project.root, env=env, capture_output=True, text=True, timeout=timeout)


def passed_count(result: subprocess.CompletedProcess[str]) -> int:
    """How many tests pytest's summary line says passed (asserting it ran cleanly)."""
    tail = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, f"the example's tests failed:\n{tail}"
    match = re.search(r"(\d+) passed", result.stdout)
    assert match, f"no test passed:\n{tail}"
    return int(match.group(1))
