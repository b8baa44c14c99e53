"""What a run ran with: ``metadata.json`` and a snapshot of the code, in the run directory.

Written once at the start of ``telescope run`` (again when a run is resumed: it then
describes the resumed process) by :func:`write_run_metadata`:

- ``metadata.json``: ``telescope_version``, ``created`` (UNIX s), ``run_name``;
  ``environments`` (per training environment: ``name``, ``weight``,
  ``reward_min`` / ``reward_max`` and the class's ``metrics_ranges``, what a dashboard
  needs to normalise its charts); ``evals`` (names); ``plugins`` (every registered
  name: ``kind``, ``name``, ``plugin``, ``distribution``, ``version``); ``host``
  (hostname, platform, Python, the versions of torch / transformers / ray / vllm /
  wandb and the Telescope packages, CPU count, memory, GPUs); ``git`` (``commit``,
  ``branch``, ``dirty`` of the working directory's repository, or ``null``); ``code``
  (where the snapshot is and what it holds).
- ``code/``: the source files under the working directory (:func:`code_files`:
  source suffixes only, ``wandb_code_exclude_patterns`` pruned, files over
  ``wandb_code_max_file_size_mb`` skipped, the run directory itself never included),
  copied with their relative paths. The W&B logger uploads this folder when it exists.

Nothing here stops a run: a fact that cannot be had is ``null``.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.recording.run_store import to_jsonable, write_atomic

if TYPE_CHECKING:
    from telescope.plugins.facade import Plugins
    from telescope.schema.config import TelescopeConfig

METADATA_FILE = "metadata.json"
CODE_DIR = "code"
#: File types that count as source code.
CODE_SUFFIXES = frozenset({".py", ".pyi", ".yaml", ".yml", ".toml", ".json", ".cfg", ".ini", ".sh", ".md", ".txt"})
#: At most this many files go into a snapshot...
MAX_CODE_FILES = 5000
#: ...and at most this many files are looked at (a run started from a home directory stays quick).
MAX_FILES_SCANNED = 200_000
VERSIONED_PACKAGES = (
    "telescope-core",
    "telescope-envs",
    "telescope-sandbox",
    "torch",
    "transformers",
    "ray",
    "vllm",
    "wandb",
)


def _is_excluded(relative: str, name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(relative, p) for p in patterns)


def code_files(
    root: Path, max_file_size_mb: float, exclude_patterns: list[str], max_files: int, skip: Path | None = None
) -> list[Path]:
    """Source files under ``root``, sorted; excluded folders (and ``skip``) are not descended into.

    ``exclude_patterns`` are globs matched against each file or folder name and its path
    relative to ``root``. Stops at ``max_files`` found or :data:`MAX_FILES_SCANNED` looked at.
    """
    max_bytes = max_file_size_mb * 1024 * 1024
    skipped = skip.resolve() if skip is not None else None
    found: list[Path] = []
    scanned = 0
    for dirpath, dirnames, filenames in os.walk(root):
        scanned += len(filenames)
        if scanned > MAX_FILES_SCANNED:
            return found
        relative_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not _is_excluded(os.path.normpath(os.path.join(relative_dir, d)), d, exclude_patterns)
            and (skipped is None or (Path(dirpath) / d).resolve() != skipped)
        )
        for filename in sorted(filenames):
            path = Path(dirpath) / filename
            relative = os.path.normpath(os.path.join(relative_dir, filename))
            if path.suffix not in CODE_SUFFIXES or _is_excluded(relative, filename, exclude_patterns):
                continue
            try:
                if not path.is_file() or path.stat().st_size > max_bytes:
                    continue
            except OSError:
                continue
            found.append(path)
            if len(found) >= max_files:
                return found
    return found


def snapshot_code(
    root: Path, destination: Path, max_file_size_mb: float, exclude_patterns: list[str], *, skip: Path | None = None
) -> dict[str, Any]:
    """Copy :func:`code_files` of ``root`` into ``destination`` (replaced); returns what it holds."""
    files = code_files(root, max_file_size_mb, exclude_patterns, MAX_CODE_FILES, skip=skip)
    if destination.exists():
        shutil.rmtree(destination)
    total = 0
    for path in files:
        target = destination / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        total += target.stat().st_size
    return {
        "dir": destination.name,
        "root": str(root),
        "files": len(files),
        "bytes": total,
        "truncated": len(files) >= MAX_CODE_FILES,
    }


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(command: list[str], cwd: Path | None = None) -> str | None:
    try:
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def gpus() -> list[dict[str, Any]]:
    """The machine's NVIDIA GPUs (name, memory) through NVML, else ``nvidia-smi``; ``[]`` when none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            found = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                name = pynvml.nvmlDeviceGetName(handle)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
                found.append({"index": index, "name": str(name), "memory_gb": round(int(memory) / 2**30, 2)})
            return found
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no pynvml, no driver: ask nvidia-smi
        pass
    if shutil.which("nvidia-smi") is None:
        return []
    text = _run(["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"])
    found = []
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            found.append({"index": int(parts[0]), "name": parts[1], "memory_gb": round(float(parts[2]) / 1024, 2)})
    return found


def host_facts() -> dict[str, Any]:
    """This machine and its software: hostname, platform, Python, package versions, CPUs, memory, GPUs."""
    memory_gb: float | None = None
    try:
        import psutil

        memory_gb = round(psutil.virtual_memory().total / 2**30, 2)
    except ImportError:
        pass
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_executable": os.path.realpath(sys.executable),
        "versions": {name: _version(name) for name in VERSIONED_PACKAGES},
        "cpu_count": os.cpu_count(),
        "memory_gb": memory_gb,
        "gpus": gpus(),
    }


def git_info(root: Path) -> dict[str, Any] | None:
    """The commit, branch and dirtiness of the git repository holding ``root``; ``None`` outside one."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if commit is None:
        return None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return {
        "commit": commit,
        "branch": _run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=root),
        "dirty": bool(status) if status is not None else None,
    }


def environment_ranges(config: TelescopeConfig, plugins: Plugins) -> list[dict[str, Any]]:
    """Per training environment: its reward range (config) and its class's ``metrics_ranges``."""
    out = []
    for entry in config.environments:
        try:
            metrics_ranges: dict[str, Any] | None = dict(getattr(plugins.environment(entry.name), "metrics_ranges", {}))
        except Exception:  # an environment that does not load is reported by the run itself
            metrics_ranges = None
        out.append(
            {
                "name": entry.name,
                "weight": entry.weight,
                "reward_min": entry.reward_min,
                "reward_max": entry.reward_max,
                "metrics_ranges": metrics_ranges,
            }
        )
    return out


def plugin_list(plugins: Plugins) -> list[dict[str, Any]]:
    """Every registered name with the plugin and distribution (and version) that registered it."""
    return [
        {
            "kind": str(e.kind.value),
            "name": e.name,
            "plugin": e.plugin,
            "distribution": e.distribution,
            "version": e.version,
        }
        for e in plugins.registry
    ]


def write_run_metadata(
    run_dir: Path, config: TelescopeConfig, plugins: Plugins, *, root: Path | None = None
) -> dict[str, Any]:
    """Write ``metadata.json`` and ``code/`` into ``run_dir`` (see the module docstring); returns the metadata."""
    root = Path.cwd() if root is None else root
    code = snapshot_code(
        root,
        run_dir / CODE_DIR,
        config.wandb_code_max_file_size_mb,
        list(config.wandb_code_exclude_patterns),
        skip=run_dir,
    )
    metadata = {
        "telescope_version": _version("telescope-core"),
        "created": time.time(),
        "run_name": config.wandb_run_name,
        "environments": environment_ranges(config, plugins),
        "evals": [entry.name for entry in config.evals],
        "plugins": plugin_list(plugins),
        "host": host_facts(),
        "git": git_info(root),
        "code": code,
    }
    write_atomic(run_dir / METADATA_FILE, json.dumps(to_jsonable(metadata), indent=2) + "\n")
    return metadata
