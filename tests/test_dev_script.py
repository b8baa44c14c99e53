"""``./dev``: a run installs Python packages only; the test suite's system tools come with ``test`` and ``setup --all``.

The script runs for real against a stand-in environment: a venv whose ``python`` and
``telescope`` record what they are asked (the install stamp is fresh, so nothing is
installed through them), a ``PATH`` without ``ip`` and with an ``apt-get`` and an ``id``
(root) that record their calls. What ``apt-get`` is asked for is what each command would
install on a bare Debian machine as root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$CALLS"
exit 0
"""
FAKE_TELESCOPE = """#!/usr/bin/env bash
echo "telescope $*" >> "$CALLS"
"""
FAKE_APT = """#!/usr/bin/env bash
echo "apt-get $*" >> "$CALLS"
"""
FAKE_ID = """#!/usr/bin/env bash
echo 0
"""
#: The tools ``./dev`` uses besides the ones faked here.
TOOLS = ("bash", "env", "dirname", "ls", "head", "sed", "touch")


def write_script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def dev_env(tmp_path: Path) -> dict[str, str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    write_script(venv / "bin" / "python", FAKE_PYTHON)
    write_script(venv / "bin" / "telescope", FAKE_TELESCOPE)
    (venv / ".telescope-installed").touch()  # newer than every pyproject.toml: nothing to install
    tools = tmp_path / "bin"
    tools.mkdir()
    write_script(tools / "apt-get", FAKE_APT)
    write_script(tools / "id", FAKE_ID)
    for name in TOOLS:
        found = shutil.which(name)
        assert found, name
        (tools / name).symlink_to(found)
    return {
        "PATH": str(tools),
        "HOME": str(tmp_path),
        "TELESCOPE_VENV": str(venv),
        "CALLS": str(tmp_path / "calls.log"),
    }


def run_dev(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    calls = Path(env["CALLS"])
    calls.unlink(missing_ok=True)
    result = subprocess.run([str(REPO / "dev"), *args], env=env, capture_output=True, text=True, timeout=120)
    return result, calls.read_text().splitlines() if calls.exists() else []


def test_run_installs_no_system_package(dev_env: dict[str, str]) -> None:
    result, calls = run_dev(dev_env, "run", "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert not [c for c in calls if c.startswith("apt-get")], calls
    assert calls[-1] == "telescope run configs/examples/countdown_tiny.yaml --seed 3"
    assert "iproute2" not in result.stdout + result.stderr and "Chromium" not in result.stdout + result.stderr
    result, calls = run_dev(dev_env, "setup")
    assert result.returncode == 0 and not [c for c in calls if c.startswith("apt-get")], calls


@pytest.mark.parametrize("args", [("setup", "--all"), ("test", "tests/nothing")])
def test_test_and_setup_all_install_the_test_tools(dev_env: dict[str, str], args: tuple[str, ...]) -> None:
    result, calls = run_dev(dev_env, *args)
    assert result.returncode == 0, result.stderr
    installs = [c for c in calls if c.startswith("apt-get") and "install" in c]
    assert any(c.endswith(" iproute2") for c in installs), calls
    if not os.path.exists("/usr/bin/chromium"):  # ./dev installs Debian's where it is missing
        assert any(c.endswith(" chromium") for c in installs), calls
    if args[0] == "test":
        assert calls[-1] == "python -m pytest -m not gpu tests/nothing"


def test_setup_rejects_an_unknown_option(dev_env: dict[str, str]) -> None:
    result, _ = run_dev(dev_env, "setup", "--al")
    assert result.returncode == 2 and "unknown option '--al' of ./dev setup" in result.stderr
