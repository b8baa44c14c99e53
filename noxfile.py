"""Nox sessions: tests per package, all tests, lint, typecheck, the plugin smoke test, e2e, gpu.

Each session gets its own virtualenv (reused between runs with ``nox -r``). The
torch build is installed first from ``TELESCOPE_TORCH_SPEC`` (default
``torch==2.13.0``, the CPU build) so that pip does not resolve the packages' plain
``torch`` requirement to the newest CUDA release.

``tests(package=...)`` tests one package *without the others installed*: ``core``
alone (``telescope-core[dev]``), ``envs`` with core but no sandbox, ``sandbox`` with
core but no envs, ``megatron`` with core and megatron-core; tests that need a
package the session lacks skip. ``all`` installs
the whole workspace (``requirements-dev.txt``) and runs every CPU test, as
``./dev test`` does. ``nox`` with no arguments runs tests, e2e, lint, typecheck and
plugins; ``nox -s gpu`` is for a GPU machine, ``nox -s bench`` runs the
benchmarks by hand, and ``nox -s sandbox_sdk`` tests the daytona and prime providers
against their SDKs, each in an environment of its own.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests", "e2e", "lint", "typecheck", "plugins"]
nox.options.reuse_existing_virtualenvs = True

CORE = "./telescope-core[dev]"
#: What each package session installs (editable, besides torch) and the tests it runs.
PACKAGES: dict[str, tuple[list[str], str]] = {
    "core": ([CORE], "tests/core"),
    "envs": ([CORE, "./telescope-envs[math]"], "tests/envs"),
    "sandbox": ([CORE, "./telescope-sandbox[e2b,modal]"], "tests/sandbox"),
    "ui_sync": ([CORE, "./telescope-ui-sync[test]"], "tests/ui_sync"),
    "megatron": ([CORE, "./telescope-megatron"], "tests/megatron"),
}
TORCH_SPEC = os.environ.get("TELESCOPE_TORCH_SPEC", "torch==2.13.0")
ENV = {"RAY_AUTH_MODE": "disabled", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


def install_workspace(session: nox.Session) -> None:
    session.install(TORCH_SPEC)
    session.install("-r", "requirements-dev.txt")


@nox.session
@nox.parametrize("package", list(PACKAGES))
def tests(session: nox.Session, package: str) -> None:
    """The CPU tests of one package (pytest -m "not gpu"), with only it and what it depends on installed."""
    requirements, test_dir = PACKAGES[package]
    session.install(TORCH_SPEC)
    session.install(*(arg for requirement in requirements for arg in ("-e", requirement)))
    session.run("pytest", "-m", "not gpu", test_dir, *session.posargs, env=ENV)


@nox.session(name="all")
def all_tests(session: nox.Session) -> None:
    """Every CPU test with the whole workspace installed (what ./dev test runs)."""
    install_workspace(session)
    session.run("pytest", "-m", "not gpu", "tests", *session.posargs, env=ENV)


@nox.session
def e2e(session: nox.Session) -> None:
    """The end-to-end tests (they run the packages together), whole workspace installed."""
    install_workspace(session)
    session.run("pytest", "-m", "not gpu", "tests/e2e", *session.posargs, env=ENV)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the three packages."""
    install_workspace(session)
    session.run(
        "mypy",
        "telescope-core/src",
        "telescope-envs/src",
        "telescope-sandbox/src",
        "telescope-ui-sync/src",
        "telescope-megatron/src",
    )


@nox.session
def plugins(session: nox.Session) -> None:
    """Smoke test of the plugin system: install a third-party plugin, list it, uninstall it."""
    install_workspace(session)
    session.run("telescope", "plugins")
    session.run("pytest", "tests/core/plugins", "tests/e2e/test_third_party_plugin.py", env=ENV)


@nox.session
@nox.parametrize("provider", ["daytona", "prime"])
def sandbox_sdk(session: nox.Session, provider: str) -> None:
    """The remote-provider tests with one provider SDK that the dev workspace leaves out.

    The workspace installs ``[e2b,modal]``; ``[prime]`` cannot share an environment with
    ``[e2b]`` (telescope-sandbox/README.md), so daytona and prime get a session each.
    """
    session.install(TORCH_SPEC)
    session.install("-e", CORE, "-e", f"./telescope-sandbox[{provider}]")
    session.run(
        "pytest",
        "tests/sandbox/test_remote_providers.py",
        "tests/sandbox/test_remote_prime.py",
        *session.posargs,
        env=ENV,
    )


@nox.session
def gpu(session: nox.Session) -> None:
    """The GPU tests (CUDA FSDP, NCCL weight sync, bf16); run on a GPU machine."""
    install_workspace(session)
    session.run("pytest", "-m", "gpu", "tests", *session.posargs, env=ENV)


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks in bench/ (run by hand; prints figures, asserts nothing)."""
    install_workspace(session)
    for script in sorted(os.listdir("bench")):
        if script.startswith("bench_") and script.endswith(".py"):
            session.run("python", f"bench/{script}", *session.posargs, env=ENV)
