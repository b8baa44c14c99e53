"""Registers the built-in algorithms through the public hook, lazily (no torch import).

The fields that one algorithm alone reads are declared here, next to its
registration (``sapo_tau_*`` for SAPO, ``dr_grpo_loss_agg_mode`` for Dr. GRPO);
the fields every algorithm shares are the core's (:class:`~telescope.api.algorithm.AlgorithmConfig`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from telescope.algorithms import CAPABILITIES, TARGETS
from telescope.api.settings import PluginSettings
from telescope.plugins.hookspecs import hookimpl
from telescope.plugins.registry import Registrar


class SapoSettings(PluginSettings):
    section = "algorithm"

    sapo_tau_pos: float = Field(1.0, gt=0, description="SAPO sigmoid sharpness for positive advantages")
    sapo_tau_neg: float = Field(1.05, gt=0, description="SAPO sigmoid sharpness for negative advantages")


class DrGrpoSettings(PluginSettings):
    section = "algorithm"

    dr_grpo_loss_agg_mode: Literal["token_mean", "token_sum_norm"] = Field(
        "token_mean", description='DR-GRPO loss aggregation. "token_sum_norm" removes response-level length bias'
    )


SETTINGS: dict[str, type[PluginSettings]] = {"sapo": SapoSettings, "dr_grpo": DrGrpoSettings}


@hookimpl
def telescope_register_algorithms(register: Registrar) -> None:
    for name, target in TARGETS.items():
        register(name, target, settings=SETTINGS.get(name), **CAPABILITIES[name].as_metadata())
