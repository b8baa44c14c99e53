"""Validation of the shared loss controls: dual clip, TIS modes, KL penalty, entropy bonus, seq IS masking."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from telescope.api.algorithm import AlgorithmConfig
from telescope.config import ConfigError, load_config
from telescope.schema.config import TelescopeConfig

MINIMAL = "environments:\n  - name: countdown\n"
NEEDS_ENVS = pytest.mark.requires_dist("telescope-envs")


def load(tmp_path: Path, overrides: list[str]):  # type: ignore[no-untyped-def]
    path = tmp_path / "run.yaml"
    path.write_text(MINIMAL, encoding="utf-8")
    return load_config(path, overrides)


def problems(tmp_path: Path, overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, overrides)
    return info.value.problems


@NEEDS_ENVS
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["--use_ppo_clip", "--clip_ratio_c", "1.0"], "clip_ratio_c (1.0) must be > 1"),
        (["--clip_ratio_c", "3"], "clip_ratio_c (dual clip) bounds a PPO-clipped ratio loss"),
        (["--algorithm", "cispo", "--clip_ratio_c", "3"], "algorithm='cispo'"),
        (["--algorithm", "sapo", "--clip_ratio_c", "3"], "algorithm='sapo'"),
        (["--use_tis", "--tis_floor", "2.0", "--tis_cap", "2.0"], "tis_floor (2.0) must be below tis_cap (2.0)"),
        (["--tis_mode", "icepop"], "tis_mode='icepop' needs use_tis=true"),
        (["--tis_floor", "0.5"], "tis_floor (0.5) bounds the TIS weight and needs use_tis=true"),
        (["--tis_mode", "clip"], "tis_mode"),
        (["--kl_estimator", "k1"], "kl_estimator"),
        (["--kl_penalty_tau", "-0.1"], "kl_penalty_tau"),
        (["--entropy_coef", "-0.1"], "entropy_coef"),
        (["--seq_is_mask_low", "1.0"], "seq_is_mask_low"),
        (["--seq_is_mask_high", "1.0"], "seq_is_mask_high"),
    ],
)
def test_invalid_loss_controls_are_rejected(tmp_path: Path, overrides: list[str], expected: str) -> None:
    found = problems(tmp_path, overrides)
    assert any(expected in p for p in found), found


@NEEDS_ENVS
def test_valid_loss_controls_reach_the_algorithm_config(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        [
            "--use_ppo_clip",
            "--ppo_clip_ref_logprobs",
            "batch",
            "--clip_ratio_c",
            "3",
            "--use_tis",
            "--tis_mode",
            "icepop",
            "--tis_floor",
            "0.5",
            "--kl_penalty_tau",
            "0.01",
            "--kl_estimator",
            "k3",
            "--entropy_coef",
            "0.001",
            "--seq_is_masking",
            "--seq_is_mask_low",
            "0.5",
            "--seq_is_mask_high",
            "2",
        ],
    ).config
    algo = AlgorithmConfig.from_config(config)
    assert (algo.clip_ratio_c, algo.tis_mode, algo.tis_floor) == (3.0, "icepop", 0.5)
    assert (algo.kl_penalty_tau, algo.kl_estimator, algo.entropy_coef) == (0.01, "k3", 0.001)
    assert (algo.seq_is_masking, algo.seq_is_mask_low, algo.seq_is_mask_high) == (True, 0.5, 2.0)
    # gspo's loss is a clipped ratio: dual clip needs no use_ppo_clip there
    assert load(tmp_path, ["--algorithm", "gspo", "--clip_ratio_c", "3"]).config.clip_ratio_c == 3.0


@NEEDS_ENVS
def test_null_kl_penalty_means_off(tmp_path: Path) -> None:
    assert load(tmp_path, ["--kl_penalty_tau", "null"]).config.kl_penalty_tau == 0.0


def test_defaults_are_the_reference_defaults() -> None:
    config = AlgorithmConfig()
    assert config.clip_ratio_c is None and config.tis_mode == "truncate" and config.tis_floor == 0.0
    assert config.kl_penalty_tau == 0.0 and config.kl_estimator == "k2" and config.entropy_coef == 0.0
    assert (config.seq_is_masking, config.seq_is_mask_low, config.seq_is_mask_high) == (False, 0.8, 1.2)


def test_algorithm_config_defaults_equal_the_schema_defaults() -> None:
    schema = TelescopeConfig.model_fields
    for field in dataclasses.fields(AlgorithmConfig):
        if field.name in schema and field.name != "advantage_norm":  # null in the schema: the algorithm's default
            assert field.default == schema[field.name].default, field.name
