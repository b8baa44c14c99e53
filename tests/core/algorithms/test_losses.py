"""Golden per-token loss values and gradients (hand-computed in the comments), and properties."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from telescope.algorithms.cispo import CISPO
from telescope.algorithms.common import ppo_clip_loss
from telescope.algorithms.dr_grpo import DrGRPO
from telescope.algorithms.grpo import GRPO
from telescope.algorithms.gspo import GSPO
from telescope.algorithms.plugin import DrGrpoSettings, SapoSettings
from telescope.algorithms.reinforce_pp import ReinforcePP
from telescope.algorithms.rloo import RLOO
from telescope.algorithms.sapo import SAPO
from telescope.api.algorithm import AlgorithmConfig, LossCounts
from telescope.testing.algorithm import loss_inputs

L15, L05 = math.log(1.5), math.log(0.5)
CLIP = AlgorithmConfig(clip_low=0.2, clip_high=0.2)


def grad_of(algorithm: object, inputs: object) -> tuple[list[float], list[float]]:
    terms = algorithm.loss_terms(inputs)  # type: ignore[attr-defined]
    terms.sum().backward()
    return terms.tolist(), inputs.logprobs.grad.tolist()  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", [GRPO, RLOO, DrGRPO, ReinforcePP])
def test_reinforce_loss(cls: type) -> None:
    # -A lp: lp [-1, -2], A [2, -1] -> [2, -2]; gradient -A = [-2, 1]; masked token -> 0
    inputs = loss_inputs([-1.0, -2.0, -3.0], [2.0, -1.0, 5.0], [True, True, False])
    values, grads = grad_of(cls(AlgorithmConfig()), inputs)
    assert values == pytest.approx([2.0, -2.0, 0.0])
    assert grads == pytest.approx([-2.0, 1.0, 0.0])


def test_ppo_clip_loss() -> None:
    # ratios [1.5, 1.5, 0.5, 0.5], A [1, -1, 1, -1], clip 0.8..1.2:
    # max(-1.5, -1.2) = -1.2 (clipped, grad 0); max(1.5, 1.2) = 1.5 (grad -rho A = 1.5);
    # max(-0.5, -0.8) = -0.5 (grad -0.5); max(0.5, 0.8) = 0.8 (clipped, grad 0)
    inputs = loss_inputs([L15, L15, L05, L05], [1.0, -1.0, 1.0, -1.0], ref_logprobs=[0.0] * 4)
    values, grads = grad_of(GRPO(AlgorithmConfig(clip_low=0.2, clip_high=0.2, use_ppo_clip=True)), inputs)
    assert values == pytest.approx([-1.2, 1.5, -0.5, 0.8])
    assert grads == pytest.approx([0.0, 1.5, -0.5, 0.0])


def test_cispo_keeps_gradient_of_clipped_tokens() -> None:
    # weights sg(clip(rho)) = [1.2, 1.2, 0.8, 0.8]; loss -w A lp with lp [ln1.5, ln1.5, ln0.5, ln0.5]:
    # [-1.2*0.405465, 1.2*0.405465, 0.8*0.693147, -0.8*0.693147]; gradient -w A = [-1.2, 1.2, -0.8, 0.8]
    inputs = loss_inputs([L15, L15, L05, L05], [1.0, -1.0, 1.0, -1.0], ref_logprobs=[0.0] * 4)
    values, grads = grad_of(CISPO(CLIP), inputs)
    assert values == pytest.approx([-0.486558, 0.486558, 0.554518, -0.554518], rel=1e-5)
    assert grads == pytest.approx([-1.2, 1.2, -0.8, 0.8])


def test_gspo_sequence_ratio() -> None:
    # seq 0: log ratios [0.2, 0.0] -> s = e^0.1 = 1.105171, A = 1, unclipped: seq loss -1.105171,
    #   per token -0.552585, gradient -s A / 2 = -0.552585 each
    # seq 1: [0.5, 0.3] -> s = e^0.4 = 1.491825, A = -1, unclipped (max(1.4918, 1.2)): per token 0.745912,
    #   gradient -s A / 2 = 0.745912
    # seq 2: [0.5, 0.3], A = 1 -> clipped at 1.2: per token -0.6, gradient 0
    inputs = loss_inputs(
        [0.2, 0.0, 0.5, 0.3, 0.5, 0.3],
        [1.0, 1.0, -1.0, -1.0, 1.0, 1.0],
        ref_logprobs=[0.0] * 6,
        sequence_ids=[0, 0, 1, 1, 2, 2],
    )
    algorithm = GSPO(CLIP)
    values, grads = grad_of(algorithm, inputs)
    assert values == pytest.approx([-0.552585, -0.552585, 0.745912, 0.745912, -0.6, -0.6], rel=1e-5)
    assert grads == pytest.approx([-0.552585, -0.552585, 0.745912, 0.745912, 0.0, 0.0], rel=1e-5)
    # every sequence weighs the same: divided by the number of samples
    assert algorithm.loss_denominator(LossCounts(loss_tokens=6, samples=3)) == 3.0


def test_sapo_soft_gate() -> None:
    # rho 1.5, A 1, tau 1: -(4/1) sigmoid(0.5) = -2.489837; grad -4 s'(0.5) rho A = -1.410022
    # rho 0.5, A -1, tau 1.05: (4/1.05) sigmoid(-0.525) = 1.415938; grad -4 s'(-0.525) rho A = 0.467070
    inputs = loss_inputs([L15, L05], [1.0, -1.0], ref_logprobs=[0.0, 0.0])
    values, grads = grad_of(SAPO(AlgorithmConfig(), SapoSettings(sapo_tau_pos=1.0, sapo_tau_neg=1.05)), inputs)
    assert values == pytest.approx([-2.489837, 1.415938], rel=1e-5)
    assert grads == pytest.approx([-1.410022, 0.467070], rel=1e-5)


def test_truncated_importance_sampling() -> None:
    # lp [-1, -1], lp_inf [-1 - ln3, -1 + ln2]: exp(lp - lp_inf) = [3, 0.5] -> capped at 2: w = [2, 0.5]
    # -A lp w with A = 1: [2, 0.5]; gradient -A w = [-2, -0.5] (w is detached)
    inputs = loss_inputs([-1.0, -1.0], [1.0, 1.0], inference_logprobs=[-1 - math.log(3), -1 + math.log(2)])
    values, grads = grad_of(GRPO(AlgorithmConfig(use_tis=True, tis_cap=2.0)), inputs)
    assert values == pytest.approx([2.0, 0.5])
    assert grads == pytest.approx([-2.0, -0.5])


def test_tis_clamps_log_ratio() -> None:
    # lp - lp_inf = 50 clamped to c = 1: w = min(e^1, 5) = 2.718282
    inputs = loss_inputs([0.0], [1.0], inference_logprobs=[-50.0])
    _, grads = grad_of(GRPO(AlgorithmConfig(use_tis=True, tis_cap=5.0, tis_logprob_clamp=1.0)), inputs)
    assert grads == pytest.approx([-math.e])


def test_tis_with_batch_reference_weights_old_policy_over_rollout() -> None:
    # A later minibatch: the policy has moved (lp != lp_old). PPO ratio rho = exp(lp - lp_old),
    # TIS weight w = min(exp(lp_old - lp_inf), 2), loss max(-rho A, -clip(rho) A) w (clip 0.8..1.2):
    # token 1: rho = e^0.1, A = 1, w = e^(-1.1 + 1.5) = e^0.4     -> -e^0.5; gradient -rho A w = -e^0.5
    # token 2: rho = e^-0.1, A = -1, w = e^(-0.9 + 0.8) = e^-0.1  ->  e^-0.2; gradient e^-0.2
    # token 3: rho = e^0.1, A = 1, w = min(e^ln3, 2) = 2 (capped) -> -2 e^0.1; gradient -2 e^0.1
    # (the current policy's weight exp(lp - lp_inf) would give -e^0.6 and e^-0.3 on tokens 1 and 2)
    inputs = loss_inputs(
        [-1.0, -1.0, -1.9],
        [1.0, -1.0, 1.0],
        ref_logprobs=[-1.1, -0.9, -2.0],
        inference_logprobs=[-1.5, -0.8, -2.0 - math.log(3)],
    )
    config = AlgorithmConfig(
        use_ppo_clip=True, ppo_clip_ref_logprobs="batch", use_tis=True, tis_cap=2.0, clip_low=0.2, clip_high=0.2
    )
    algorithm = GRPO(config)
    assert algorithm.uses_batch_reference
    values, grads = grad_of(algorithm, inputs)
    expected = [-math.exp(0.5), math.exp(-0.2), -2 * math.exp(0.1)]
    assert values == pytest.approx(expected, rel=1e-9)
    assert grads == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("cls", [CISPO, GSPO, SAPO])
def test_ratio_losses_with_batch_reference_take_tis_from_it(cls: type) -> None:
    # Same inputs, with and without TIS: the weight is exp(lp_old - lp_inf) = [e^0.5, e^-0.25] per token.
    lp, adv, ref, inf = [-1.0, -2.0], [1.0, -1.0], [-1.2, -1.9], [-1.7, -1.65]
    config = AlgorithmConfig(ppo_clip_ref_logprobs="batch", clip_low=0.2, clip_high=0.2)
    plain = cls(config).loss_terms(loss_inputs(lp, adv, ref_logprobs=ref, inference_logprobs=inf))
    weighted = cls(dataclasses.replace(config, use_tis=True, tis_cap=5.0)).loss_terms(
        loss_inputs(lp, adv, ref_logprobs=ref, inference_logprobs=inf)
    )
    assert weighted.tolist() == pytest.approx([plain[0].item() * math.exp(0.5), plain[1].item() * math.exp(-0.25)])


def test_tis_without_batch_reference_weights_current_policy() -> None:
    # No ratio in the loss (plain GRPO): no batch reference exists, even with ppo_clip_ref_logprobs: batch;
    # the weight is the current exp(lp - lp_inf) = e^0.5 (ref_logprobs is ignored): -A lp w = e^0.5
    inputs = loss_inputs([-1.0], [1.0], ref_logprobs=[-3.0], inference_logprobs=[-1.5])
    algorithm = GRPO(AlgorithmConfig(ppo_clip_ref_logprobs="batch", use_tis=True, tis_cap=2.0))
    assert not algorithm.uses_batch_reference
    values, grads = grad_of(algorithm, inputs)
    assert values == pytest.approx([math.exp(0.5)])
    assert grads == pytest.approx([-math.exp(0.5)])


def test_dr_grpo_denominators() -> None:
    counts = LossCounts(loss_tokens=10, samples=3)
    token_mean = DrGRPO(AlgorithmConfig(), DrGrpoSettings(dr_grpo_loss_agg_mode="token_mean"))
    assert token_mean.loss_denominator(counts) == 10.0
    # token_sum_norm: samples x max_tokens = 3 x 100
    token_sum_norm = DrGRPO(AlgorithmConfig(max_tokens=100), DrGrpoSettings(dr_grpo_loss_agg_mode="token_sum_norm"))
    assert token_sum_norm.loss_denominator(counts) == 300.0
    assert GRPO(AlgorithmConfig()).loss_denominator(counts) == 10.0


finite = st.floats(-3.0, 3.0, allow_nan=False)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=8))
def test_ppo_at_ratio_one_equals_plain_gradient(rows: list[tuple[float, float]]) -> None:
    lps, advs = [r[0] - 3.0 for r in rows], [r[1] for r in rows]
    plain = loss_inputs(lps, advs)
    clipped = loss_inputs(lps, advs)  # ref = lp: ratio exactly 1
    GRPO(AlgorithmConfig()).loss_terms(plain).sum().backward()
    ppo_terms = GRPO(AlgorithmConfig(use_ppo_clip=True)).loss_terms(clipped)
    ppo_terms.sum().backward()
    torch.testing.assert_close(clipped.logprobs.grad, plain.logprobs.grad)
    torch.testing.assert_close(ppo_terms, -torch.tensor(advs, dtype=torch.float64))  # value -rho A = -A


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=8))
def test_sapo_gradient_at_ratio_one_is_policy_gradient(rows: list[tuple[float, float]]) -> None:
    inputs = loss_inputs([r[0] for r in rows], [r[1] for r in rows])
    SAPO(AlgorithmConfig(), SapoSettings(sapo_tau_pos=0.7, sapo_tau_neg=2.0)).loss_terms(inputs).sum().backward()
    torch.testing.assert_close(inputs.logprobs.grad, -inputs.advantages)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(finite, finite, finite), min_size=1, max_size=8))
def test_gspo_one_token_per_sequence_is_token_clipping(rows: list[tuple[float, float, float]]) -> None:
    config = AlgorithmConfig(clip_low=0.2, clip_high=0.3)
    lps, refs, advs = [r[0] / 3 - 1 for r in rows], [r[1] / 3 - 1 for r in rows], [r[2] for r in rows]
    ids = list(range(len(rows)))
    gspo = loss_inputs(lps, advs, ref_logprobs=refs, sequence_ids=ids)
    token = loss_inputs(lps, advs, ref_logprobs=refs, sequence_ids=ids)
    gspo_terms = GSPO(config).loss_terms(gspo)
    token_terms = ppo_clip_loss(torch.exp(token.logprobs - token.ref_logprobs), token.advantages, config)
    torch.testing.assert_close(gspo_terms, token_terms)
    gspo_terms.sum().backward()
    token_terms.sum().backward()
    torch.testing.assert_close(gspo.logprobs.grad, token.logprobs.grad)
