"""Every built-in algorithm through the conformance kit of telescope.testing.algorithm."""

from __future__ import annotations

from telescope.algorithms.cispo import CISPO
from telescope.algorithms.dr_grpo import DrGRPO
from telescope.algorithms.grpo import GRPO
from telescope.algorithms.gspo import GSPO
from telescope.algorithms.reinforce_pp import ReinforcePP
from telescope.algorithms.rloo import RLOO
from telescope.algorithms.sapo import SAPO
from telescope.testing.algorithm import AlgorithmConformance


class TestGRPO(AlgorithmConformance):
    algorithm_class = GRPO
    registered_name = "grpo"


class TestRLOO(AlgorithmConformance):
    algorithm_class = RLOO
    registered_name = "rloo"


class TestDrGRPO(AlgorithmConformance):
    algorithm_class = DrGRPO
    registered_name = "dr_grpo"


class TestReinforcePP(AlgorithmConformance):
    algorithm_class = ReinforcePP
    registered_name = "reinforce_pp"


class TestCISPO(AlgorithmConformance):
    algorithm_class = CISPO
    registered_name = "cispo"


class TestGSPO(AlgorithmConformance):
    algorithm_class = GSPO
    registered_name = "gspo"
    sequence_level = True


class TestSAPO(AlgorithmConformance):
    algorithm_class = SAPO
    registered_name = "sapo"


def test_factory_builds_registered_algorithms() -> None:
    from telescope.algorithms import TARGETS
    from telescope.config.composition import config_from_dict
    from telescope.plugins.facade import get_plugins

    for name in TARGETS:
        config = config_from_dict({"environments": [{"name": "x"}], "algorithm": name})
        algorithm = get_plugins().create_algorithm(config)
        assert algorithm.name == name
        assert algorithm.config.advantage_norm == algorithm.capabilities.default_advantage_norm
