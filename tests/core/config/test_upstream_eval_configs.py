"""The upstream's standalone eval configs validate unchanged, and its eval defaults are ours (issue 16).

``configs/defaults/default_eval.yaml`` and ``configs/evals/eval.yaml`` are the upstream's
files (eduardoslonski/telescope at f002cb2), byte for byte: their git blob hashes are
checked first. Then ``telescope config validate --eval`` accepts the eval config and
``--defaults`` the defaults layer, and every value of the defaults file is what
``telescope eval`` uses when a dedicated eval config leaves the key out
(:data:`telescope.config.eval_form.EVAL_DEFAULTS` over the declarations' defaults).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from telescope.cli.main import main
from telescope.config import ConfigError
from telescope.config.eval_form import EVAL_DEFAULTS
from telescope.config.loader import load_config

pytestmark = pytest.mark.requires_dist("telescope-envs")  # the eval config names countdown

REPO = Path(__file__).resolve().parents[3]
DEFAULT_EVAL = REPO / "configs" / "defaults" / "default_eval.yaml"
EVAL = REPO / "configs" / "evals" / "eval.yaml"
#: git blob hashes of the upstream's files at f002cb262314c5c697e4951a3005deeae643aa8a
UPSTREAM_BLOBS = {
    DEFAULT_EVAL: "17046d00d91683bc445159bd9e49869bd5287173",
    EVAL: "f69578a410e4a7551f096194700bec5d19a3d836",
}


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def validate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["config", "validate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_files_are_the_upstream_files_unchanged() -> None:
    for path, blob in UPSTREAM_BLOBS.items():
        assert git_blob(path.read_bytes()) == blob, f"{path.relative_to(REPO)} is not the upstream's file any more"


def test_the_eval_config_validates_for_telescope_eval(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = validate(capsys, "--eval", str(EVAL))
    assert code == 0, err
    assert out.startswith(f"ok: {EVAL} is valid for telescope eval")
    config = load_config(EVAL, purpose="eval").config
    assert config.checkpoint_dir == "checkpoints_converted" and config.checkpoints == []
    assert config.wandb_run_path == "your-entity/your-project/your-run-id"
    assert config.max_concurrent_samples_per_server == 256 and config.hf_weights is False
    assert (config.inference_num_workers, config.max_model_len) == (2, 4096)  # the file's own values
    [entry] = config.evals
    assert (entry.name, entry.num_samples, entry.max_tokens) == ("countdown", 100, 3700)
    # as a training run it is not valid: it has no environment
    code, _, err = validate(capsys, str(EVAL))
    assert code == 2 and "at least one environment" in err


def test_the_defaults_file_validates_as_a_layer(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--defaults", "--eval"], ["--defaults"]):
        code, out, err = validate(capsys, *args, str(DEFAULT_EVAL))
        assert code == 0, err
        assert "valid as a defaults layer" in out
    code, _, err = validate(capsys, "--eval", str(DEFAULT_EVAL))  # as an eval: no evals, no checkpoints
    assert code == 2
    assert "evals: telescope eval needs at least one eval" in err and "no checkpoint to evaluate" in err


#: key -> our default where it deliberately differs from the upstream file's, with the reason
DEVIATIONS = {
    # servers bind only where their clients reach them (loopback for telescope eval), never every interface
    "inference_host": "auto",
}


def test_every_value_of_the_defaults_file_is_telescope_evals_default() -> None:
    upstream = {**yaml.safe_load(DEFAULT_EVAL.read_text(encoding="utf-8")), **DEVIATIONS}
    bare = load_config(None, {"evals": [{"name": "countdown"}], "checkpoint_dir": "ckpts"}, purpose="eval").config
    assert {key: getattr(bare, key) for key in upstream} == upstream
    # and the eval defaults are exactly where the file differs from a run's defaults
    run = load_config(None, {"environments": [{"name": "countdown"}]}).config
    assert {key for key, value in upstream.items() if getattr(run, key) != value} == set(EVAL_DEFAULTS)


def test_a_training_config_keeps_its_run_defaults_when_evaluated(tmp_path: Path) -> None:
    data = {"environments": [{"name": "countdown"}], "evals": [{"name": "countdown"}]}
    config = load_config(None, data, purpose="eval", checkpoint_argument=True).config
    assert (config.inference_num_workers, config.max_model_len, config.ray_namespace) == (2, 4096, "telescope")


def test_an_eval_is_not_asked_a_training_runs_rules() -> None:
    data = {"evals": [{"name": "countdown"}], "checkpoint_dir": "ckpts", "max_model_len": 8192}
    assert load_config(None, data, purpose="eval").config.max_model_len == 8192  # seq_len (4096) is training's
    with pytest.raises(ConfigError, match=r"seq_len \(4096\) must be at least max_model_len \(8192\)"):
        load_config(None, {**data, "environments": [{"name": "countdown"}]})
    # the inference and eval rules still hold
    with pytest.raises(ConfigError, match=r"evals\[0\] \(countdown\): max_tokens \(9000\) must be smaller"):
        load_config(None, {**data, "evals": [{"name": "countdown", "max_tokens": 9000}]}, purpose="eval")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"wandb_run_path": "entity/project"}, r"wandb_run_path .*not a W&B run path: write \"entity/project/run_id\""),
        ({"wandb_run_path": "a//c"}, r"not a W&B run path"),
        ({"checkpoints": [{"path": "a", "step": 1}, {"path": "b", "step": 1}]}, r"step 1 is listed more than once"),
        ({"checkpoints": [{"path": "a", "step": -1}]}, r"checkpoints\[0\]\.step"),
        ({"checkpoints": [{"path": "a", "step": 1, "stp": 2}]}, r"unknown key 'checkpoints\[0\]\.stp'.*'step'"),
        ({"max_concurrent_samples_per_server": 0}, r"max_concurrent_samples_per_server = 0"),
    ],
)
def test_bad_eval_keys_are_config_errors(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, {"evals": [{"name": "countdown"}], "checkpoint_dir": "c", **values}, purpose="eval")
