"""The conformance kits fail on implementations that break the contract (kit self-tests)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from telescope.algorithms.cispo import CISPO
from telescope.algorithms.dr_grpo import DrGRPO
from telescope.algorithms.grpo import GRPO
from telescope.algorithms.gspo import GSPO
from telescope.algorithms.reinforce_pp import ReinforcePP
from telescope.algorithms.rloo import RLOO
from telescope.algorithms.sapo import SAPO
from telescope.api.algorithm import Algorithm
from telescope.api.context import TransportContext
from telescope.api.environment import BaseEnvironment
from telescope.api.records import RewardResult, Sample
from telescope.api.sandbox import ExecResult, Sandbox, SandboxLimits, SandboxProvider
from telescope.testing.algorithm import AlgorithmConformance
from telescope.testing.environment import EnvironmentConformance, check_reward
from telescope.testing.sandbox import SandboxProviderConformance
from telescope.testing.transport import WeightTransportConformance
from telescope.transports.memory import MemoryTransport


class GoodEnv(BaseEnvironment):
    name = "good"

    def __init__(self, **unknown: Any) -> None:
        if unknown:
            raise TypeError(f"unknown {unknown}")

    def load_dataset(self) -> list[Sample]:
        return [Sample(prompt=f"say {i}", answer=str(i), sample_id=f"good-{i}") for i in range(3)]

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return RewardResult(
            total_reward=float(completion.strip() == sample.answer), sample_metrics={"len": len(completion)}
        )


class StatefulEnv(GoodEnv):
    def __init__(self, **unknown: Any) -> None:
        super().__init__(**unknown)
        self.history: list[str] = []

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        self.history.append(completion)  # per-rollout state on a shared object
        return super().compute_reward(completion, sample, eos_token)


class RandomIdsEnv(GoodEnv):
    def load_dataset(self) -> list[Sample]:
        import uuid

        return [Sample(prompt="p", answer="1", sample_id=uuid.uuid4().hex) for _ in range(3)]


class CrashingEnv(GoodEnv):
    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return RewardResult(total_reward=float(completion[0] == "1"))  # IndexError on ""


class NanEnv(GoodEnv):
    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return RewardResult(total_reward=float("nan"))


def _kit(env_cls: type[BaseEnvironment]) -> EnvironmentConformance:
    class Kit(EnvironmentConformance):
        def environment_factory(self) -> BaseEnvironment:
            return env_cls()

        def right_completion(self, sample: Sample) -> str | None:
            return str(sample.answer)

    return Kit()


def _run(kit: EnvironmentConformance, test: str) -> None:
    env = kit.environment_factory()
    samples = env.load_dataset()
    method = getattr(kit, test)
    params = method.__code__.co_varnames[1 : method.__code__.co_argcount]
    method(**{p: {"env": env, "samples": samples}[p] for p in params})


def test_good_env_passes_every_check() -> None:
    kit = _kit(GoodEnv)
    for name in dir(kit):
        if name.startswith("test_") and name not in {
            "test_multi_turn_rollouts_are_independent",
            "test_tool_schemas_and_metrics",
        }:
            _run(kit, name)


@pytest.mark.parametrize(
    ("env_cls", "test"),
    [
        (StatefulEnv, "test_no_per_rollout_state_on_environment"),
        (RandomIdsEnv, "test_sample_ids_unique_and_stable"),
        (CrashingEnv, "test_garbage_does_not_raise"),
        (NanEnv, "test_garbage_does_not_raise"),
    ],
)
def test_environment_kit_catches(env_cls: type[BaseEnvironment], test: str) -> None:
    with pytest.raises((AssertionError, IndexError)):
        _run(_kit(env_cls), test)


def test_check_reward_rejects_out_of_range_metric() -> None:
    with pytest.raises(AssertionError, match="outside its declared"):
        check_reward(RewardResult(1.0, {"acc": 2.0}), {"acc": {"min": 0.0, "max": 1.0}})


class NoTimeoutSandbox(Sandbox):
    """Ignores timeouts and claims success: the kit must notice."""

    sandbox_id = "broken"

    def execute(
        self,
        command: str | list[str],
        *,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        return ExecResult(0, "", "", 0.0)

    def upload(self, path: str, data: bytes) -> None:
        pass

    def download(self, path: str) -> bytes:
        return b""

    def destroy(self) -> None:
        pass


class BrokenProvider(SandboxProvider):
    name = "broken"

    def create(self, limits: SandboxLimits | None = None) -> Sandbox:
        return NoTimeoutSandbox()


@pytest.mark.parametrize(
    "test",
    [
        "test_timeout",
        "test_upload_download_roundtrip",
        "test_execute_failure_is_a_result_not_an_exception",
        "test_memory_limit",
        "test_download_missing_file_raises",
    ],
)
def test_sandbox_kit_catches(test: str) -> None:
    class Kit(SandboxProviderConformance):
        def provider_factory(self) -> SandboxProvider:
            return BrokenProvider()

    kit = Kit()
    sandbox = BrokenProvider().create()
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        getattr(kit, test)(sandbox)


# -------------------------------------------------------------- weight transports


class CorruptingTransport(MemoryTransport):
    """Flips the sign of every float tensor it receives: what a wrong dtype view would do."""

    def receive(self, version: int) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in super().receive(version):
            yield name, -tensor if tensor.is_floating_point() else tensor


def make_corrupting() -> CorruptingTransport:
    return CorruptingTransport(TransportContext(timeout_s=30))


def test_transport_kit_catches_corrupted_weights() -> None:
    class Kit(WeightTransportConformance):
        factory = staticmethod(make_corrupting)
        num_receivers = 1

    with pytest.raises(AssertionError, match="mismatch"):
        Kit().test_every_version_reaches_every_receiver_exactly()


class NanForEqualRewards(GRPO):
    """Divides by the std with no eps: 0 / 0 = NaN for a group of equal rewards."""

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return (rewards - rewards.mean()) / rewards.std(unbiased=False)


class GuardsOnlyExactZeroStd(GRPO):
    """Guards std == 0 only: a float std of ~1e-16 (rewards [0.7] * 3) still gives ±1."""

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        std = rewards.std(unbiased=False)
        return torch.zeros_like(rewards) if float(std) == 0.0 else (rewards - rewards.mean()) / std


class RawRewards(GRPO):
    """No baseline: equal non-zero rewards give non-zero advantages."""

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return rewards.clone()


def _algorithm_kit(cls: type[Algorithm]) -> AlgorithmConformance:
    class Kit(AlgorithmConformance):
        algorithm_class = cls

    return Kit()


@pytest.mark.parametrize("cls", [NanForEqualRewards, GuardsOnlyExactZeroStd, RawRewards])
def test_algorithm_kit_catches_bad_advantages_for_equal_rewards(cls: type[Algorithm]) -> None:
    kit = _algorithm_kit(cls)
    kit.test_advantages_shape_and_finite([0.0, 1.0, 1.0, 0.0])  # fine on rewards with a spread
    with pytest.raises(AssertionError, match="equal rewards"):
        kit.test_zero_variance_group_gives_zero_advantages()


@pytest.mark.parametrize("cls", [GRPO, RLOO, DrGRPO, ReinforcePP, CISPO, GSPO, SAPO])
def test_algorithm_kit_accepts_builtin_advantages_for_equal_rewards(cls: type[Algorithm]) -> None:
    _algorithm_kit(cls).test_zero_variance_group_gives_zero_advantages()
