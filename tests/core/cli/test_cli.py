"""The ``telescope`` command: output, exit codes, and what its light paths import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from telescope.cli.main import main

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "configs" / "examples" / "example_countdown.yaml"
#: Uses telescope-envs' countdown (the example config, or the plugin listing).
NEEDS_ENVS = pytest.mark.requires_dist("telescope-envs")


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for command in ("run", "config", "plugins"):
        assert command in out


@NEEDS_ENVS
def test_plugins_lists_name_kind_distribution_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "plugins")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "KIND", "DISTRIBUTION", "VERSION", "STATUS"]
    assert any(r.split()[:2] == ["grpo", "algorithm"] and "telescope-core" in r for r in rows)
    code, out, _ = run_cli(capsys, "plugins", "--json")
    data = json.loads(out)
    assert {"name": "countdown", "kind": "environment", "distribution": "telescope-envs"}.items() <= next(
        p for p in data["plugins"] if p["name"] == "countdown"
    ).items()
    assert data["load_errors"] == []


@NEEDS_ENVS
def test_config_validate_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "config", "validate", str(EXAMPLE), "--learning-rate=5e-7")
    assert code == 0 and out.startswith("ok:") and "1 from the command line" in out
    code, out, _ = run_cli(capsys, "config", "show", str(EXAMPLE), "--seed", "5")
    assert code == 0
    assert any(line.startswith("seed: 5") and line.endswith("# cli") for line in out.splitlines())


def test_config_defaults_prints_the_defaults_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "config", "defaults")
    assert code == 0
    assert out == (REPO / "configs" / "defaults" / "default_train.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("content", "args", "expected"),
    [
        ("environments: [{name: countdown}]\nlearnig_rate: 1\n", [], "unknown key 'learnig_rate'"),
        ("environments: [{name: countdown}]\n", ["--group_size", "x"], "group_size = 'x'"),
        ("environments: [{name: countdown}\n", [], "invalid YAML"),
        ("environments: [{name: nothing_like_this}]\n", [], "unknown environment 'nothing_like_this'"),
        (None, [], "config file not found"),
        ("environments: [{name: countdown}]\nseed: 1\nseed: 2\n", [], "duplicate key 'seed' at the top level"),
        ("environments: [{name: countdown, kwargs: {seed: 1, seed: 2}}]\n", [], "in environments[0].kwargs"),
        ("environments: [{name: countdown}]\n", ["--learning_rate"], "--learning_rate needs a value"),
        (
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
            ),
            [],
            "alias bomb",
        ),
        (b"environments: [{name: countdown}]\nwandb_run_name: caf\xe9\n", [], "c.yaml:2:20: not UTF-8"),
        ("", [], "c.yaml is empty"),
        ("# nothing yet\n", [], "needs at least `environments:`"),
        (
            "environments: [{name: countdown}]\nwandb_run_name: 2024-01-01\n",
            [],
            "c.yaml:2): YAML reads 2024-01-01 as a date, but wandb_run_name takes text; quote it",
        ),
        ("environments: [{name: countdown}]\nx: " + "[" * 30000 + "]" * 30000 + "\n", [], "nesting deeper than"),
        ("environments: [{name: countdown}]\nwandb_run_name: 2024-02-30\n", [], "c.yaml:2:17: '2024-02-30'"),
    ],
)
def test_user_errors_exit_2_with_one_message_and_no_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | bytes | None, args: list[str], expected: str
) -> None:
    path = tmp_path / "c.yaml"
    if content is not None:
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    for command in (["config", "validate"], ["config", "show"], ["run"]):
        code, out, err = run_cli(capsys, *command, str(path), *args)
        assert code == 2, (command, err)
        assert err.startswith("error: ") and err.count("error:") == 1 and expected in err
        assert "Traceback" not in err and out == ""


def test_run_validates_before_anything_else(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("environments: [{name: countdown}]\nalgorithm: reinforce_pp\nadvantage_norm: group\n")
    code, _, err = run_cli(capsys, "run", str(path))
    assert code == 2 and "advantage_norm='group' is not supported by algorithm='reinforce_pp'" in err


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "trian")
    assert code == 2 and "No such command 'trian'" in err


LIGHT_COMMANDS = [
    ["--help"],
    ["plugins"],
    pytest.param(["config", "validate", str(EXAMPLE)], marks=NEEDS_ENVS),
    pytest.param(["config", "show", str(EXAMPLE)], marks=NEEDS_ENVS),
]


@pytest.mark.parametrize("args", LIGHT_COMMANDS)
def test_light_commands_import_no_heavy_stack(args: list[str]) -> None:
    """`--help`, `plugins` and `config` must answer fast: no torch, ray, transformers or vllm."""
    probe = (
        "import sys; from telescope.cli.main import main; code = main(sys.argv[1:]); "
        "heavy = sorted(m for m in ('torch', 'ray', 'transformers', 'vllm', 'datasets') if m in sys.modules); "
        "print('HEAVY=' + ','.join(heavy), file=sys.stderr); sys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "HEAVY=\n" in result.stderr or result.stderr.rstrip().endswith("HEAVY=")


def test_console_script_exit_code(tmp_path: Path) -> None:
    telescope = Path(sys.executable).parent / "telescope"
    if not telescope.exists():
        pytest.skip("the telescope console script is not installed beside this interpreter")
    result = subprocess.run(
        [str(telescope), "config", "validate", str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr


@NEEDS_ENVS
def test_run_returns_the_loop_exit_code(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupted run's 130 (or a failed run's 1) reaches the shell, not 0."""
    import telescope.runtime.launch as launch

    monkeypatch.setattr(launch, "launch_run", lambda loaded: 130)
    code, _, _ = run_cli(capsys, "run", str(EXAMPLE))
    assert code == 130


@NEEDS_ENVS
def test_eval_without_a_checkpoint_is_a_user_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")  # a run directory's config is not a model
    code, _, err = run_cli(
        capsys, "eval", str(EXAMPLE), str(tmp_path), "--evals", "[{name: countdown}]", "--inference_num_workers", "2"
    )
    assert code == 2 and err.startswith("error: no checkpoint at") and "Traceback" not in err
