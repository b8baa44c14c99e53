"""Conformance kit for RL algorithms: inherit, name the class, run pytest.

Usage, in an algorithm plugin's tests::

    from telescope.testing.algorithm import AlgorithmConformance

    class TestMyAlgorithm(AlgorithmConformance):
        algorithm_class = MyAlgorithm
        registered_name = "my_algo"        # optional: checks the registration metadata

Every inherited ``test_*`` checks one part of the contract of
:mod:`telescope.api.algorithm`:

- ``capabilities`` is declared and self-consistent (default normalisation allowed),
  and equals the metadata the algorithm was registered with;
- group advantages have the group's shape and are finite, also for a group whose
  rewards are all equal (they must then be 0), under every allowed normalisation;
- the loss terms are finite, have a gradient, and ignore masked positions (value
  and gradient);
- on-policy (ratio 1) the gradient is the policy gradient ``-A`` per token (divided
  by the sample's loss-token count for sequence-level losses, ``sequence_level =
  True``), with and without PPO clipping where the algorithm supports it;
- the loss denominator is positive.

:func:`loss_inputs` builds :class:`~telescope.api.algorithm.LossInputs` from plain lists.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from telescope.api.algorithm import Algorithm, AlgorithmCapabilities, AlgorithmConfig, LossCounts, LossInputs


def loss_inputs(
    logprobs: Sequence[float],
    advantages: Sequence[float],
    mask: Sequence[bool] | None = None,
    *,
    ref_logprobs: Sequence[float] | None = None,
    inference_logprobs: Sequence[float] | None = None,
    sequence_ids: Sequence[int] | None = None,
) -> LossInputs:
    """LossInputs from lists; ``logprobs`` requires grad; refs default to the logprobs (ratio 1)."""
    import torch

    lp = torch.tensor(list(logprobs), dtype=torch.float64, requires_grad=True)
    n = lp.numel()
    mask_t = torch.tensor(list(mask) if mask is not None else [True] * n)
    ref = torch.tensor(list(ref_logprobs), dtype=torch.float64) if ref_logprobs is not None else lp.detach().clone()
    inf = torch.tensor(list(inference_logprobs), dtype=torch.float64) if inference_logprobs is not None else ref
    seq = torch.tensor(list(sequence_ids) if sequence_ids is not None else [0] * n, dtype=torch.long)
    num_sequences = int(seq.max()) + 1 if n else 1
    lengths = torch.zeros(num_sequences, dtype=torch.long).index_add(0, seq.clamp(min=0), mask_t.long())
    return LossInputs(
        logprobs=lp,
        ref_logprobs=ref,
        inference_logprobs=inf,
        advantages=torch.tensor(list(advantages), dtype=torch.float64),
        loss_mask=mask_t,
        sequence_ids=seq,
        sequence_lengths=lengths,
    )


#: Groups of equal rewards (no signal): their advantages must be 0. Some have a float mean
#: that is not exactly the reward, so their population std is ~1e-16 rather than 0.
EQUAL_REWARD_GROUPS: tuple[list[float], ...] = ([0.7] * 3, [0.1] * 3, [0.0] * 4, [5.0] * 2, [-3.3] * 5, [1.0] * 8)


class AlgorithmConformance:
    """Inherit in a test module (``class TestX(AlgorithmConformance)``) and set ``algorithm_class``."""

    algorithm_class: ClassVar[type[Algorithm]]
    #: Name it is registered under (None: registration is not checked).
    registered_name: ClassVar[str | None] = None
    #: Config used by the tests (the defaults of AlgorithmConfig otherwise).
    algorithm_config: ClassVar[AlgorithmConfig] = AlgorithmConfig()
    #: The loss averages over each sample's tokens (gspo): the ratio-1 gradient is -A / |y_i|.
    sequence_level: ClassVar[bool] = False

    def make(self, **changes: Any) -> Algorithm:
        caps = self.algorithm_class.capabilities
        config = dataclasses.replace(
            self.algorithm_config, **{"advantage_norm": caps.default_advantage_norm, **changes}
        )
        return self.algorithm_class(config)

    def configs(self) -> list[dict[str, Any]]:
        """Config variations every loss test runs under."""
        caps = self.algorithm_class.capabilities
        variants: list[dict[str, Any]] = [{}]
        if caps.supports_ppo_clip:
            variants.append({"use_ppo_clip": True})
        return variants

    # ------------------------------------------------------------------ tests

    def test_capabilities_declared(self) -> None:
        caps = self.algorithm_class.capabilities
        assert isinstance(caps, AlgorithmCapabilities)
        assert caps.advantage_norms, "an algorithm allows at least one advantage normalisation"
        assert caps.default_advantage_norm in caps.advantage_norms
        assert not (caps.ratio_based and caps.supports_ppo_clip), "a ratio-based loss does not take PPO clipping"
        if self.registered_name is not None:
            from telescope.config.rules import algorithm_capabilities
            from telescope.plugins.manager import get_plugin_manager

            registered = algorithm_capabilities(get_plugin_manager().registry, self.registered_name)
            assert registered == caps, f"registered metadata {registered} differs from the class's {caps}"

    @pytest.mark.parametrize("rewards", [[0.0, 1.0, 1.0, 0.0], [0.2, 0.5, 3.0], [1.0, -1.0]])
    def test_advantages_shape_and_finite(self, rewards: list[float]) -> None:
        import torch

        for norm in self.algorithm_class.capabilities.advantage_norms:
            adv = self.make(advantage_norm=norm).group_advantages(torch.tensor(rewards, dtype=torch.float64))
            assert adv.shape == (len(rewards),)
            assert bool(torch.isfinite(adv).all())

    def test_zero_variance_group_gives_zero_advantages(self) -> None:
        """``group_advantages`` itself gives (about) 0 for equal rewards, never NaN or a spurious ±1.

        Called directly, not through :meth:`~telescope.api.algorithm.Algorithm.advantages`
        (which zeroes such groups before the algorithm sees them). The groups include
        values whose float mean is not exact (``[0.7] * 3``: the std is ~1e-16, not 0), so
        an algorithm that only guards ``std == 0`` is caught too.
        """
        import torch

        for norm in self.algorithm_class.capabilities.advantage_norms:
            algorithm = self.make(advantage_norm=norm)
            for rewards in EQUAL_REWARD_GROUPS:
                adv = algorithm.group_advantages(torch.tensor(rewards, dtype=torch.float64))
                assert adv.shape == (len(rewards),), f"{rewards}: shape {tuple(adv.shape)}"
                assert bool(torch.isfinite(adv).all()), f"equal rewards {rewards} ({norm}) gave {adv.tolist()}"
                assert adv.abs().max().item() < 1e-6, f"equal rewards {rewards} ({norm}) gave {adv.tolist()}"

    def test_loss_finite_with_gradient(self) -> None:
        for changes in self.configs():
            inputs = loss_inputs(
                [-1.0, -2.0, -0.5, -1.5],
                [1.0, 1.0, -0.5, -0.5],
                ref_logprobs=[-1.2, -1.8, -0.4, -1.9],
                sequence_ids=[0, 0, 1, 1],
            )
            terms = self.make(**changes).loss_terms(inputs)
            assert terms.shape == inputs.logprobs.shape
            total = terms.sum()
            assert math.isfinite(float(total.detach()))
            total.backward()
            assert inputs.logprobs.grad is not None and float(inputs.logprobs.grad.abs().sum()) > 0

    def test_mask_respected(self) -> None:
        for changes in self.configs():
            algorithm = self.make(**changes)
            mask = [False, True, True, False, True]
            a = loss_inputs([-1.0, -2.0, -0.5, -1.5, -1.0], [1.0] * 5, mask, ref_logprobs=[-1.1] * 5)
            b = loss_inputs([-9.0, -2.0, -0.5, -7.5, -1.0], [1.0] * 5, mask, ref_logprobs=[-1.1] * 5)
            terms_a, terms_b = algorithm.loss_terms(a), algorithm.loss_terms(b)
            assert float(terms_a.sum().detach()) == pytest.approx(float(terms_b.sum().detach()))
            terms_a.sum().backward()
            assert a.logprobs.grad is not None
            assert a.logprobs.grad[0] == 0 and a.logprobs.grad[3] == 0

    def test_ratio_one_gradient_is_policy_gradient(self) -> None:
        import torch

        for changes in self.configs():
            advantages = [0.5, 0.5, 0.5, -1.5, -1.5]
            inputs = loss_inputs([-1.0, -2.0, -0.5, -1.5, -0.7], advantages, sequence_ids=[0, 0, 0, 1, 1])
            self.make(**changes).loss_terms(inputs).sum().backward()
            expected = -torch.tensor(advantages, dtype=torch.float64)
            if self.sequence_level:
                expected = expected / inputs.sequence_lengths[inputs.sequence_ids].to(torch.float64)
            assert inputs.logprobs.grad is not None
            torch.testing.assert_close(inputs.logprobs.grad, expected)

    def test_loss_denominator_positive(self) -> None:
        algorithm = self.make()
        for counts in (LossCounts(loss_tokens=10, samples=2), LossCounts(loss_tokens=0, samples=0)):
            assert algorithm.loss_denominator(counts) > 0
