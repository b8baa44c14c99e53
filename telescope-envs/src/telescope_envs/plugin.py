"""Registers this package's environments and evals through the public hooks (lazily)."""

from __future__ import annotations

from telescope.plugins.hookspecs import hookimpl
from telescope.plugins.registry import Registrar

ENVIRONMENTS: dict[str, str] = {
    "countdown": "telescope_envs.countdown:CountdownEnvironment",
    "countdown_agent": "telescope_envs.countdown_agent:CountdownAgentEnvironment",
    "hendrycks_math": "telescope_envs.hendrycks_math:HendrycksMathEnvironment",
    "dapo_math": "telescope_envs.math_sets:DapoMathEnvironment",
    "deepscaler": "telescope_envs.math_sets:DeepScalerEnvironment",
    "wordle": "telescope_envs.wordle:WordleEnvironment",
    "code_tracker": "telescope_envs.code_tracker:CodeTrackerEnvironment",
    "miniwob": "telescope_envs.miniwob:MiniWoBEnvironment",
    "miniwob_agent": "telescope_envs.miniwob_agent:MiniWoBAgentEnvironment",
    "i3_code": "telescope_envs.i3_code:I3CodeEnvironment",
    "calculator": "telescope_envs.calculator:CalculatorEnvironment",
    "deepdive": "telescope_envs.deepdive:DeepDiveEnvironment",
}

EVALS: dict[str, str] = {
    "math500": "telescope_envs.evals:MATH500",
    "aime_2024": "telescope_envs.evals:AIME_2024",
    "aime_2025": "telescope_envs.evals:AIME_2025",
    "gpqa_diamond": "telescope_envs.evals:GPQA_DIAMOND",
}


@hookimpl
def telescope_register_environments(register: Registrar) -> None:
    for name, target in ENVIRONMENTS.items():
        register(name, target)


@hookimpl
def telescope_register_evals(register: Registrar) -> None:
    for name, target in EVALS.items():
        register(name, target)
