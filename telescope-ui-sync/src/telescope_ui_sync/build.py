"""Build the front end into ``static/`` (``python -m telescope_ui_sync.build [--if-stale|--check]``).

The built assets are committed and ship inside the wheel, so installing the package needs
neither Node.js nor the network. ``static/build-info.json`` records a digest of the
front-end sources (``frontend/src``, ``package.json``, ``package-lock.json``, the build
script); the assets are *stale* when that digest differs from the sources' (a digest, not
file times, because a git checkout sets every time to the checkout's). ``--if-stale``
builds only then (what ``./dev setup`` runs); ``--check`` exits 1 when stale (what a test
asserts, so a change to the sources without a rebuild fails the suite).

Building runs ``npm ci`` (the committed lockfile, exactly) when ``node_modules`` is
missing or older than the lockfile, then ``npm run build`` (esbuild, see
``frontend/build.mjs``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
STATIC_DIR = PACKAGE_DIR / "static"
BUILD_INFO = STATIC_DIR / "build-info.json"
#: ``frontend/`` of a source checkout (absent from an installed wheel).
FRONTEND_DIR = PACKAGE_DIR.parent.parent / "frontend"
SOURCE_FILES = ("package.json", "package-lock.json", "build.mjs", "tsconfig.json")


def source_digest(frontend: Path = FRONTEND_DIR) -> str:
    """SHA-256 over the names and contents of the front end's sources, in a fixed order."""
    digest = hashlib.sha256()
    files = [frontend / name for name in SOURCE_FILES if (frontend / name).is_file()]
    files += sorted(p for p in (frontend / "src").rglob("*") if p.is_file())
    for path in files:
        digest.update(path.relative_to(frontend).as_posix().encode() + b"\0")
        digest.update(path.read_bytes().replace(b"\r\n", b"\n") + b"\0")
    return digest.hexdigest()


def built_digest() -> str | None:
    """The digest recorded by the last build, or ``None`` when there is no build."""
    try:
        return str(json.loads(BUILD_INFO.read_text(encoding="utf-8"))["source_digest"])
    except (FileNotFoundError, KeyError, ValueError):
        return None


def is_stale(frontend: Path = FRONTEND_DIR) -> bool:
    """Whether the built assets are missing or were built from other sources."""
    if not (STATIC_DIR / "index.html").is_file():
        return True
    if not frontend.is_dir():  # an installed package: what shipped is what there is
        return False
    return built_digest() != source_digest(frontend)


def build(frontend: Path = FRONTEND_DIR) -> None:
    """``npm ci`` when needed, then ``npm run build``, then record the digest."""
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("building the telescope ui front end needs Node.js and npm (https://nodejs.org)")
    marker = frontend / "node_modules" / ".package-lock.json"
    lock = frontend / "package-lock.json"
    if not marker.is_file() or marker.stat().st_mtime < lock.stat().st_mtime:
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=frontend, check=True)
    subprocess.run([npm, "run", "build"], cwd=frontend, check=True)
    BUILD_INFO.write_text(json.dumps({"source_digest": source_digest(frontend)}, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m telescope_ui_sync.build", description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--if-stale", action="store_true", help="build only when the assets are missing or stale")
    mode.add_argument("--check", action="store_true", help="exit 1 when the assets are missing or stale")
    args = parser.parse_args(argv)
    stale = is_stale()
    if args.check:
        print("front end assets are " + ("STALE: run python -m telescope_ui_sync.build" if stale else "up to date"))
        return 1 if stale else 0
    if args.if_stale and not stale:
        return 0
    if not FRONTEND_DIR.is_dir():
        raise SystemExit(f"no front-end sources at {FRONTEND_DIR} (an installed package cannot be rebuilt)")
    build()
    print(f"built the telescope ui front end into {STATIC_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
