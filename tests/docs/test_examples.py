"""Every example in docs/ runs: each page's project is installed and exercised for real.

Each page's ``# file:`` blocks are written out as a project with its entry points
(see :mod:`docs_harness`); the test then loads the installed plugins the way every
command does (a new :class:`TelescopePluginManager`, entry points included), checks
the registration, drives the plugin through the path the run uses, and runs the
project's own tests (the conformance kits) with pytest in a fresh interpreter.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from docs_harness import (
    DOCS,
    Project,
    blocks,
    console_commands,
    materialise,
    pages,
    passed_count,
    ruff_commands,
    run_project_tests,
)

from telescope.plugins.facade import Plugins, get_plugins
from telescope.plugins.manager import TelescopePluginManager, reset_plugin_manager
from telescope.plugins.registry import PluginEntry, PluginKind

Install = Callable[[str], Project]

#: Pages without an example project of their own.
#: Pages without an example package: the index, a shipped package's description, the reference pages
#: (gateway.md's agent.py is run by tests/core/inference/test_gateway.py::test_the_docs_agent_runs).
NO_PROJECT = {
    "README.md",
    "megatron-backend.md",
    "architecture.md",
    "several-machines.md",
    "server-access.md",
    "run-store.md",
    "eval.md",
    "faults.md",
    "upstream-differences.md",
    "gateway.md",
}
#: Languages of blocks that are files of a project (they must carry a marker).
CODE_LANGS = {"python", "toml", "yaml"}


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Install]:
    """install(page): write the page's project, put it on sys.path, load the plugins anew."""
    installed: list[Project] = []

    def run(page: str) -> Project:
        project = materialise(page, tmp_path / page.removesuffix(".md"))
        monkeypatch.syspath_prepend(str(project.root))
        importlib.invalidate_caches()
        reset_plugin_manager(TelescopePluginManager())
        installed.append(project)
        return project

    yield run
    for project in installed:
        for name in list(sys.modules):
            if name.split(".")[0] in project.packages:
                del sys.modules[name]


def entry(project: Project, kind: PluginKind, name: str) -> PluginEntry:
    """The registry entry of ``name``, checked to come from the page's distribution."""
    found = get_plugins().registry.entry(kind, name)
    assert found.distribution == project.name, f"{name} is registered by {found.provider}"
    return found


def run_console(page: str, capsys: pytest.CaptureFixture[str]) -> int:
    """Run the page's ``$ telescope ...`` lines through the CLI entry point; compare the output."""
    from telescope.cli.main import main

    commands = console_commands(page)
    for command in commands:
        capsys.readouterr()
        code = main(command.argv)
        captured = capsys.readouterr()
        assert captured.out + captured.err == command.output, f"{command.where}: the output differs"
        assert (code != 0) == command.output.startswith("error:"), f"{command.where}: exit code {code}"
    return len(commands)


# --------------------------------------------------------------------------- the pages themselves


def test_every_code_block_is_part_of_an_example() -> None:
    """A code block either is a project file, or repeats one verbatim: nothing in docs/ goes unrun."""
    for page in pages():
        for block in blocks(page):
            if block.lang not in CODE_LANGS:
                continue
            assert block.file or block.excerpt, f"{block.where}: a {block.lang} block without `# file:` or `# excerpt:`"
            if block.excerpt:
                other, path = block.excerpt
                files = {b.file: b for b in blocks(other) if b.file}
                assert path in files, f"{block.where}: docs/{other} has no file {path}"
                from docs_harness import project_files

                assert block.body.strip("\n") in project_files(other)[path], (
                    f"{block.where}: the excerpt is not a verbatim part of {path} in docs/{other}"
                )


def test_the_index_lists_every_page() -> None:
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for page in pages():
        if page != "README.md":
            assert f"]({page})" in index, f"docs/README.md does not link {page}"
    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    assert "](docs/README.md)" in readme, "README.md does not link docs/README.md"


def test_every_page_but_the_index_has_an_example_project() -> None:
    for page in pages():
        if page not in NO_PROJECT:
            assert any(b.file == "pyproject.toml" for b in blocks(page)), f"docs/{page} has no example project"


def test_the_examples_are_lint_clean(tmp_path: Path) -> None:
    """ruff check and ruff format, as each example's own repository would run them."""
    import subprocess

    for page in pages():
        if page in NO_PROJECT:
            continue
        project = materialise(page, tmp_path / page.removesuffix(".md"))
        commands = ruff_commands(project.root)
        if commands is None:
            pytest.skip("ruff is not installed")
        for command in commands:
            result = subprocess.run(command, cwd=project.root, capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, f"docs/{page}: {' '.join(command[1:3])}:\n{result.stdout}{result.stderr}"


# --------------------------------------------------------------------------- algorithm.md


@pytest.mark.slow
def test_algorithm(install: Install) -> None:
    from telescope.api import Algorithm
    from telescope.config import load_config

    project = install("algorithm.md")
    registered = entry(project, PluginKind.ALGORITHM, "rank_advantage")
    assert registered.is_lazy and registered.metadata["supports_ppo_clip"] is True
    assert issubclass(get_plugins().algorithm("rank_advantage"), Algorithm)
    loaded = load_config(None, ["--environments", "[{name: countdown}]", "--algorithm", "rank_advantage"])
    assert loaded.config.advantage_norm == "group"  # the algorithm's default, from the registration
    algorithm = get_plugins().create_algorithm(loaded.config)
    assert algorithm.advantages([[0.0, 5.0, 1.0], [2.0, 2.0]]) == [[-1.0, 1.0, 0.0], [0.0, 0.0]]
    assert passed_count(run_project_tests(project)) >= 8


# --------------------------------------------------------------------------- environment pages


def check_environment(project: Project, name: str) -> None:
    """Registered lazily by the page's distribution, accepted by the config, built and loaded as a run does."""
    from telescope.api import EnvironmentBase
    from telescope.config import ConfigError, load_config

    assert entry(project, PluginKind.ENVIRONMENT, name).is_lazy
    assert issubclass(get_plugins().environment(name), EnvironmentBase)
    loaded = load_config(None, ["--environments", f"[{{name: {name}, kwargs: {{num_samples: 5}}}}]"])
    [slot] = build_slots(loaded.config, get_plugins())
    assert len(slot.samples) == 5 and all(s.environment == name for s in slot.samples)
    with pytest.raises(ConfigError, match="num_sample"):
        load_config(None, ["--environments", f"[{{name: {name}, kwargs: {{num_sample: 5}}}}]"])


def build_slots(config: Any, plugins: Plugins) -> list[Any]:
    from telescope.orchestrator.assembly import build_slots as build

    return build(config, plugins)


@pytest.mark.slow
def test_environment_single_turn(install: Install) -> None:
    from telescope.config import load_config

    project = install("environment-single-turn.md")
    check_environment(project, "reverse_word")
    [environment] = load_config(project.root / "run.yaml").config.environments
    assert environment.kwargs == {"num_samples": 500, "seed": 1}
    assert passed_count(run_project_tests(project)) >= 9


@pytest.mark.slow
def test_environment_multi_turn(install: Install) -> None:
    project = install("environment-multi-turn.md")
    check_environment(project, "guess_number")
    assert passed_count(run_project_tests(project)) >= 10


@pytest.mark.slow
def test_environment_tools(install: Install) -> None:
    project = install("environment-tools.md")
    check_environment(project, "unit_convert")
    assert passed_count(run_project_tests(project)) >= 11


# --------------------------------------------------------------------------- sandbox-provider.md


@pytest.mark.slow
def test_sandbox_provider(install: Install) -> None:
    from telescope.api import SandboxProvider
    from telescope_sandbox import get_provider

    project = install("sandbox-provider.md")
    assert entry(project, PluginKind.SANDBOX_PROVIDER, "tempdir").is_lazy
    assert issubclass(get_plugins().sandbox_provider("tempdir"), SandboxProvider)
    provider = get_provider("tempdir", parent=str(project.root))  # what SandboxPool does with provider_kwargs
    with provider.create() as sandbox:
        assert sandbox.execute(["python3", "-c", "import os; print(os.getcwd())"]).stdout.startswith(str(project.root))
    assert passed_count(run_project_tests(project)) >= 18


# --------------------------------------------------------------------------- browser-provider.md


@pytest.mark.slow
def test_browser_provider(install: Install) -> None:
    pytest.importorskip("playwright", reason="pip install 'telescope-sandbox[browser]'")
    if not Path(os.environ.get("TELESCOPE_CHROMIUM", "/usr/bin/chromium")).exists():
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    from telescope.api import BrowserProvider
    from telescope.config import load_config

    project = install("browser-provider.md")
    assert entry(project, PluginKind.BROWSER_PROVIDER, "cdp").is_lazy
    assert issubclass(get_plugins().browser_provider("cdp"), BrowserProvider)
    config = load_config(project.root / "configs" / "miniwob_cdp.yaml", []).config  # validates: the provider is found
    assert config.browser_provider == "cdp"
    assert passed_count(run_project_tests(project)) >= 8


# --------------------------------------------------------------------------- weight-transport.md


@pytest.mark.slow
def test_weight_transport(install: Install, tmp_path: Path) -> None:
    import torch

    from telescope.api.context import TransportContext
    from telescope.config import load_config
    from telescope.inference.weight_updates import WeightReceiver, init_payload, update_payload

    project = install("weight-transport.md")
    registered = entry(project, PluginKind.WEIGHT_TRANSPORT, "file")
    assert registered.is_lazy and registered.metadata["settings"].__name__ == "FileTransportSettings"
    folder = tmp_path / "weights"
    args = ["--environments", "[{name: countdown}]", "--weight_transport", "file", "--file_transport_dir", str(folder)]
    config = load_config(None, args).config
    plugins = get_plugins()
    settings = plugins.settings_for(PluginKind.WEIGHT_TRANSPORT, "file", config)
    assert settings is not None and settings.model_dump() == {"file_transport_dir": str(folder)}
    # the two ends as a run builds them: the sender in the trainer, the receiver in a server from JSON
    sender = plugins.create_weight_transport("file", config)
    info = sender.prepare_sender(1)
    receiver = WeightReceiver()
    context = TransportContext.from_config(config).to_dict()
    receiver.init(init_payload("file", info, 1, settings.model_dump(mode="json"), context))
    sender.send(iter([("w", torch.arange(3.0))]), 1)
    version, tensors = receiver.receive(update_payload(1))
    assert version == 1 and [(n, t.tolist()) for n, t in tensors] == [("w", [0.0, 1.0, 2.0])]
    assert [p.name for p in folder.iterdir()] == ["1.pt"]
    sender.close()
    assert passed_count(run_project_tests(project)) >= 4


# --------------------------------------------------------------------------- logger.md


@pytest.mark.slow
def test_logger(install: Install, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import csv
    import json

    from fake_run import run_with_fake_workers

    project = install("logger.md")
    assert entry(project, PluginKind.LOGGER, "csv").is_lazy
    run_dir = tmp_path / "run"
    args = ["--csv_log", "true", "--csv_log_keys", "[reward/mean, loss]"]
    assert run_with_fake_workers(monkeypatch, run_dir, {}, args) == 0  # create_loggers, two steps, close
    rows = list(csv.reader((run_dir / "metrics.csv").open(encoding="utf-8")))
    recorded = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows == [["step", "reward/mean", "loss"]] + [
        [str(m["step"]), str(m["reward/mean"]), str(m["loss"])] for m in recorded
    ]
    assert len(rows) == 3
    assert passed_count(run_project_tests(project)) >= 1


# --------------------------------------------------------------------------- cli-command.md


@pytest.mark.slow
def test_cli_command(
    install: Install, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from telescope.recording.run_store import RunStore

    project = install("cli-command.md")
    store = RunStore(tmp_path / "runs" / "demo")  # the run the page describes
    for step, (reward, loss) in enumerate([(0.1, 2.0), (0.5, 1.5), (0.3, 1.0)]):
        store.log_metrics(step, {"reward/mean": reward, "loss": loss})
    store.close()
    monkeypatch.chdir(tmp_path)
    assert run_console("cli-command.md", capsys) == 3
    assert passed_count(run_project_tests(project)) >= 1


# --------------------------------------------------------------------------- config-fields.md


@pytest.mark.slow
def test_config_fields(install: Install, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from telescope.cli.main import main
    from telescope.config import ConfigError, load_config
    from telescope.config.composition import composed_schema

    project = install("config-fields.md")
    assert entry(project, PluginKind.ALGORITHM, "trimmed_baseline").is_lazy
    model = get_plugins().settings_model(PluginKind.ALGORITHM, "trimmed_baseline")
    assert model is not None and composed_schema().owner_label("trimmed_baseline_trim") == project.name
    run_yaml = project.root / "run.yaml"
    assert load_config(run_yaml).config.settings(model).model_dump() == {"trimmed_baseline_trim": 2}
    config = load_config(run_yaml, ["--trimmed_baseline_trim", "3"]).config  # the command line wins
    assert config.settings(model).model_dump() == {"trimmed_baseline_trim": 3}
    assert getattr(get_plugins().create_algorithm(config), "trim", None) == 3  # the constructor got them
    with pytest.raises(ConfigError, match=r"trimmed_baseline_trim=2 drops .*\(.*run\.yaml:4"):
        load_config(run_yaml, ["--group_size", "4"])
    load_config(run_yaml, ["--group_size", "4", "--algorithm", "grpo"])  # the rule judges its own algorithm only
    monkeypatch.chdir(project.root)
    assert run_console("config-fields.md", capsys) == 3
    main(["config", "defaults"])
    out = capsys.readouterr().out
    documented = (
        "# trimmed_baseline: rewards dropped at each end of a group before the mean [telescope-trimmed-baseline]"
    )
    assert f"{documented}\ntrimmed_baseline_trim: 1\n" in out
    assert passed_count(run_project_tests(project)) >= 8


# --------------------------------------------------------------------------- inference-backend.md


@pytest.mark.slow
def test_inference_backend(install: Install) -> None:
    from telescope.config import load_config

    project = install("inference-backend.md")
    assert entry(project, PluginKind.INFERENCE_BACKEND, "embedded_long_start").is_lazy
    args = ["--environments", "[{name: countdown}]", "--inference_backend", "embedded_long_start"]
    config = load_config(None, [*args, "--long_start_timeout_s", "42"]).config
    backend = get_plugins().create_inference_backend("embedded_long_start", config)  # as each server's actor does
    assert getattr(backend, "timeout_s", None) == 42.0 and backend.context.model == config.model
    # the kit's quick part: one server through the backend, health, metrics and a completion
    result = run_project_tests(project, "-k", "health_and_metrics or completion_from_token_ids")
    assert passed_count(result) == 2


# --------------------------------------------------------------------------- compaction.md


@pytest.mark.slow
def test_compaction(install: Install) -> None:
    import asyncio

    from telescope.config import load_config
    from telescope.testing.compaction import ScriptedPolicy, long_episode

    project = install("compaction.md")
    assert entry(project, PluginKind.COMPACTION, "clip_tools").is_lazy
    args = ["--environments", "[{name: countdown}]", "--compaction", "clip_tools", "--max_tokens", "512"]
    config = load_config(None, [*args, "--clip_tools_chars", "12", "--compaction_keep_turns", "1"]).config
    compactor = get_plugins().create_compactor(config)  # as the run builds it
    assert compactor is not None and compactor.context.keep_turns == 1
    result = asyncio.run(compactor.compact(long_episode(turns=2), ScriptedPolicy()))
    assert next(m["content"] for m in result.history if m["role"] == "tool") == "result 1; de [...]"
    assert passed_count(run_project_tests(project)) >= 5


# --------------------------------------------------------------------------- agent-environment.md


@pytest.mark.slow
def test_agent_environment(install: Install) -> None:
    pytest.importorskip("agents", reason="the OpenAI Agents SDK: pip install 'telescope-core[agents]'")
    from telescope.api import AgentEnvironment

    project = install("agent-environment.md")
    check_environment(project, "unit_agent")
    assert issubclass(get_plugins().environment("unit_agent"), AgentEnvironment)
    assert passed_count(run_project_tests(project)) >= 6


# --------------------------------------------------------------------------- trainer-backends.md


@pytest.mark.slow
def test_trainer_backends(install: Install) -> None:
    from telescope.trainer.public import PackedTrainerBackend

    project = install("trainer-backends.md")
    assert entry(project, PluginKind.TRAINER_BACKEND, "replicated").is_lazy
    assert issubclass(get_plugins().trainer_backend("replicated"), PackedTrainerBackend)
    assert passed_count(run_project_tests(project)) >= 8


# --------------------------------------------------------------------------- hooks.md


@pytest.mark.slow
def test_hooks_tour(install: Install, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from fake_run import run_with_fake_workers

    from telescope.config import ConfigError, load_config

    project = install("hooks.md")
    plugins = get_plugins()
    # telescope_register_evals: an EvalSpec usable by name
    assert entry(project, PluginKind.EVAL, "countdown_small").is_lazy
    assert len(plugins.eval_spec("countdown_small").build().load_dataset()) == 50
    countdown = ["--environments", "[{name: countdown}]"]
    load_config(None, [*countdown, "--evals", "[{name: countdown_small, num_samples: 4}]"])
    # telescope_register_trainer_backends: the subclass shares the fsdp settings model
    assert entry(project, PluginKind.TRAINER_BACKEND, "fsdp_timed").is_lazy
    shared = plugins.settings_model(PluginKind.TRAINER_BACKEND, "fsdp")
    assert shared is not None and plugins.settings_model(PluginKind.TRAINER_BACKEND, "fsdp_timed") is shared
    # telescope_validate_config
    with pytest.raises(ConfigError, match=r"number_of_steps=2000 with checkpoint_every=0: .* \(cli\)"):
        load_config(None, [*countdown, "--number_of_steps", "2000"])
    load_config(None, [*countdown, "--number_of_steps", "2000", "--checkpoint_every", "100"])
    # telescope_run_start / step_end / run_end: a real run writes the summary
    run_dir = tmp_path / "run"
    assert run_with_fake_workers(monkeypatch, run_dir, {}) == 0
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    rewards = [json.loads(line)["reward/mean"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    best = max(range(len(rewards)), key=lambda i: (rewards[i], -i))
    assert summary["status"] == "completed" and summary["error"] is None
    assert (summary["steps"], summary["planned_steps"]) == (2, 2)
    assert (summary["best_step"], summary["best_reward"]) == (best, rewards[best])
    # the trainer backend through the kit's key test, and the example's own test
    result = run_project_tests(project, "-k", "train_step_returns_required_metrics or tokens_per_second")
    assert passed_count(result) == 2
