"""Golden values of the shared loss controls, each computed by hand from its formula in the test.

dual clip (``clip_ratio_c``), ``tis_mode`` (truncate / icepop with ``tis_floor``), the KL
penalty (``kl_penalty_tau``, ``kl_estimator`` k2 / k3), the entropy bonus
(``entropy_coef``) and sequence-level importance masking (``seq_is_masking``).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from telescope.algorithms.cispo import CISPO
from telescope.algorithms.dr_grpo import DrGRPO
from telescope.algorithms.grpo import GRPO
from telescope.algorithms.gspo import GSPO
from telescope.algorithms.reinforce_pp import ReinforcePP
from telescope.algorithms.rloo import RLOO
from telescope.algorithms.sapo import SAPO
from telescope.api.algorithm import Algorithm, AlgorithmConfig, LossInputs
from telescope.testing.algorithm import loss_inputs

LN = math.log
PPO = AlgorithmConfig(use_ppo_clip=True, clip_low=0.2, clip_high=0.2)
ALL = (GRPO, RLOO, DrGRPO, ReinforcePP, CISPO, GSPO, SAPO)


def grad_of(algorithm: Algorithm, inputs: LossInputs) -> tuple[list[float], list[float]]:
    terms = algorithm.loss_terms(inputs)
    terms.sum().backward()
    assert inputs.logprobs.grad is not None
    return terms.tolist(), inputs.logprobs.grad.tolist()


def with_entropy(inputs: LossInputs, entropy: list[float]) -> torch.Tensor:
    inputs.entropy = torch.tensor(entropy, dtype=torch.float64, requires_grad=True)
    return inputs.entropy


# ------------------------------------------------------------------ dual clip


def test_dual_clip_bounds_negative_advantages() -> None:
    # ratio r = exp(lp - 0), clip 0.8..1.2, c = 3; PPO term max(-rA, -clip(r)A), then min(., -cA) when A < 0
    rows = [(4.0, -1.0), (2.0, -1.0), (4.0, 1.0), (0.5, -1.0), (4.0, -2.0)]
    ratios, advs = [r for r, _ in rows], [a for _, a in rows]
    ppo = [max(-r * a, -min(max(r, 0.8), 1.2) * a) for r, a in rows]  # [4, 2, -1.2, 0.8, 8]
    dual = [min(v, -3.0 * a) if a < 0 else v for v, (_, a) in zip(ppo, rows, strict=True)]  # [3, 2, -1.2, 0.8, 6]
    assert ppo == pytest.approx([4.0, 2.0, -1.2, 0.8, 8.0]) and dual == pytest.approx([3.0, 2.0, -1.2, 0.8, 6.0])
    # gradient in lp: -rA where the unclipped -rA term is active, 0 where either clip binds
    expected_grads = [0.0, 2.0, 0.0, 0.0, 0.0]
    lps = [LN(r) for r in ratios]
    values, grads = grad_of(
        GRPO(dataclasses.replace(PPO, clip_ratio_c=3.0)), loss_inputs(lps, advs, ref_logprobs=[0.0] * 5)
    )
    assert values == pytest.approx(dual)
    assert grads == pytest.approx(expected_grads)
    off, _ = grad_of(GRPO(PPO), loss_inputs(lps, advs, ref_logprobs=[0.0] * 5))
    assert off == pytest.approx(ppo)


def test_dual_clip_on_gspo_sequence_ratio() -> None:
    # seq 0: log ratios [ln4 + 0.1, ln4 - 0.1] -> s = 4, A = -1: max(4, 1.2) = 4 -> min(4, 3) = 3, per token 1.5, grad 0
    # seq 1: [ln2 + 0.1, ln2 - 0.1] -> s = 2, A = -1: 2 < 3 unchanged, per token 1.0, grad -sA/2 = 1.0
    lps = [LN(4) + 0.1, LN(4) - 0.1, LN(2) + 0.1, LN(2) - 0.1]
    inputs = loss_inputs(lps, [-1.0] * 4, ref_logprobs=[0.0] * 4, sequence_ids=[0, 0, 1, 1])
    values, grads = grad_of(GSPO(AlgorithmConfig(clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0)), inputs)
    assert values == pytest.approx([1.5, 1.5, 1.0, 1.0])
    assert grads == pytest.approx([0.0, 0.0, 1.0, 1.0])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-3, 3), st.floats(-3, 3)), min_size=1, max_size=8), st.floats(1.01, 5.0))
def test_dual_clip_never_exceeds_c_times_abs_advantage(rows: list[tuple[float, float]], c: float) -> None:
    inputs = loss_inputs([r[0] for r in rows], [r[1] for r in rows], ref_logprobs=[0.0] * len(rows))
    terms = GRPO(dataclasses.replace(PPO, clip_ratio_c=c)).loss_terms(inputs).detach()
    assert bool((terms <= c * inputs.advantages.abs() + 1e-12).all())


# ------------------------------------------------------------------ TIS modes


def tis_inputs(weights: list[float]) -> LossInputs:
    """lp = -1, A = 1 and lp_inf chosen so that exp(lp - lp_inf) is each weight; -A lp w = w."""
    return loss_inputs([-1.0] * len(weights), [1.0] * len(weights), inference_logprobs=[-1.0 - LN(w) for w in weights])


RAW = [3.0, 0.5, 1.5, 0.2, 2.0, 0.25]  # floor 0.25, cap 2 (both bounds inclusive)


def test_tis_truncate_with_floor() -> None:
    # truncate: clamp(w, floor, cap) = [2, 0.5, 1.5, 0.25, 2, 0.25]; gradient -A w
    expected = [min(max(w, 0.25), 2.0) for w in RAW]
    values, grads = grad_of(GRPO(AlgorithmConfig(use_tis=True, tis_cap=2.0, tis_floor=0.25)), tis_inputs(RAW))
    assert values == pytest.approx(expected)
    assert grads == pytest.approx([-w for w in expected])


def test_tis_truncate_default_floor_is_plain_truncation() -> None:
    values, _ = grad_of(GRPO(AlgorithmConfig(use_tis=True, tis_cap=2.0)), tis_inputs(RAW))
    assert values == pytest.approx([min(w, 2.0) for w in RAW])


def test_tis_icepop_zeroes_tokens_outside_the_bounds() -> None:
    # icepop: w inside [0.25, 2], else 0: [0, 0.5, 1.5, 0, 2, 0.25]
    expected = [w if 0.25 <= w <= 2.0 else 0.0 for w in RAW]
    config = AlgorithmConfig(use_tis=True, tis_mode="icepop", tis_cap=2.0, tis_floor=0.25)
    values, grads = grad_of(GRPO(config), tis_inputs(RAW))
    assert values == pytest.approx(expected)
    assert grads == pytest.approx([-w for w in expected])


def test_icepop_with_batch_reference_reads_old_policy() -> None:
    # weights exp(lp_old - lp_inf) = [3, 1.5]; icepop with cap 2 keeps [0, 1.5]. The current policy has moved
    # (exp(lp - lp_inf) = [1, 1] would keep both): the old policy decides.
    inputs = loss_inputs(
        [-1.0, -1.0], [1.0, 1.0], ref_logprobs=[-1.0 + LN(3), -1.0 + LN(1.5)], inference_logprobs=[-1.0, -1.0]
    )
    config = AlgorithmConfig(
        use_ppo_clip=True, ppo_clip_ref_logprobs="batch", use_tis=True, tis_mode="icepop", tis_cap=2.0
    )
    values, _ = grad_of(GRPO(config), inputs)
    rho = [1 / 3, 2 / 3]  # exp(lp - lp_old); clip range [0.6, 1.5] (defaults clip_low 0.4, clip_high 0.5)
    ppo = [max(-r, -min(max(r, 0.6), 1.5)) for r in rho]  # A = 1: [-1/3, -2/3]
    assert values == pytest.approx([0.0, ppo[1] * 1.5])


# ---------------------------------------------------------------- KL penalty

D = [0.5, -1.0, 0.0]  # d = lp - lp_inf


def kl_inputs(mask: list[bool] | None = None) -> LossInputs:
    lp = [-1.0, -2.0, -0.5]
    return loss_inputs(lp, [1.0, 0.0, -2.0], mask, inference_logprobs=[x - d for x, d in zip(lp, D, strict=True)])


def test_kl_penalty_k2() -> None:
    # loss -A lp + tau d^2 = [1 + 0.5*0.25, 0 + 0.5*1, -1 + 0]; gradient -A + 2 tau d = [-0.5, -1, 2]
    values, grads = grad_of(GRPO(AlgorithmConfig(kl_penalty_tau=0.5, kl_estimator="k2")), kl_inputs())
    assert values == pytest.approx([1.125, 0.5, -1.0])
    assert grads == pytest.approx([-0.5, -1.0, 2.0])


def test_kl_penalty_k3() -> None:
    # k3 = exp(d) - 1 - d, its gradient (exp(d) - 1); tau 0.5
    k3 = [math.exp(d) - 1 - d for d in D]
    base, base_grad = [1.0, 0.0, -1.0], [-1.0, 0.0, 2.0]
    values, grads = grad_of(GRPO(AlgorithmConfig(kl_penalty_tau=0.5, kl_estimator="k3")), kl_inputs())
    assert values == pytest.approx([b + 0.5 * k for b, k in zip(base, k3, strict=True)])
    assert grads == pytest.approx([g + 0.5 * (math.exp(d) - 1) for g, d in zip(base_grad, D, strict=True)])
    assert k3[0] == pytest.approx(0.148721, rel=1e-5) and k3[1] == pytest.approx(0.367879, rel=1e-5)


def test_kl_k3_is_capped_and_log_ratio_clamped() -> None:
    # d = 5: e^5 - 6 = 142.4 -> 10; d = -15: 14 -> 10; d = 30 -> clamped to 20 -> 10; all without gradient
    d = [5.0, -15.0, 30.0]
    inputs = loss_inputs([-1.0] * 3, [0.0] * 3, inference_logprobs=[-1.0 - x for x in d])
    values, grads = grad_of(GRPO(AlgorithmConfig(kl_penalty_tau=1.0, kl_estimator="k3")), inputs)
    assert values == pytest.approx([10.0] * 3)
    assert grads == pytest.approx([0.0] * 3)


def test_kl_penalty_is_masked_and_not_importance_weighted() -> None:
    # use_tis with w = exp(lp - lp_inf) capped at 2: [e^0.5 = 1.6487, e^-1, 1]; masked third token -> 0
    # loss -A lp w + tau d^2: [1.6487 + 0.125, 0 + 0.5, 0]
    config = AlgorithmConfig(use_tis=True, tis_cap=2.0, kl_penalty_tau=0.5)
    values, grads = grad_of(GRPO(config), kl_inputs([True, True, False]))
    assert values == pytest.approx([math.exp(0.5) + 0.125, 0.5, 0.0])
    assert grads == pytest.approx([-math.exp(0.5) + 0.5, -1.0, 0.0])


def test_kl_penalty_in_gspo_is_a_sequence_mean() -> None:
    # ratio 1 (ref = lp): policy part -A/|y| per token; KL tau d^2 / |y|: seq 0 has 2 tokens, seq 1 one
    lp = [-1.0, -2.0, -0.5]
    inputs = loss_inputs(
        lp, [1.0, 1.0, -1.0], inference_logprobs=[x - d for x, d in zip(lp, D, strict=True)], sequence_ids=[0, 0, 1]
    )
    values, _ = grad_of(GSPO(AlgorithmConfig(kl_penalty_tau=0.5)), inputs)
    assert values == pytest.approx([(-1 + 0.5 * 0.25) / 2, (-1 + 0.5 * 1.0) / 2, 1.0 + 0.0])


@pytest.mark.parametrize("cls", ALL)
def test_kl_penalty_reaches_every_algorithm(cls: type[Algorithm]) -> None:
    # on-policy wrt the ratio reference, d = lp - lp_inf = 0.5 on every token: the penalty adds tau d^2 * g_t
    plain = cls(AlgorithmConfig()).loss_terms(loss_inputs([-1.0, -2.0], [1.0, -1.0], inference_logprobs=[-1.5, -2.5]))
    inputs = loss_inputs([-1.0, -2.0], [1.0, -1.0], inference_logprobs=[-1.5, -2.5])
    penalised = cls(AlgorithmConfig(kl_penalty_tau=2.0)).loss_terms(inputs)
    weight = 0.5 if cls is GSPO else 1.0  # one sequence of two tokens
    torch.testing.assert_close(penalised - plain, torch.full((2,), 2.0 * 0.25 * weight, dtype=torch.float64))


# ------------------------------------------------------------- entropy bonus


def test_entropy_bonus() -> None:
    # loss -A lp - coef H with lp [-1, -2], A [1, 0.5], H [0.5, 2.0], coef 0.1: [1 - 0.05, 1 - 0.2];
    # gradient in lp -A = [-1, -0.5]; the masked third token gives 0
    inputs = loss_inputs([-1.0, -2.0, -3.0], [1.0, 0.5, 1.0], [True, True, False])
    entropy = with_entropy(inputs, [0.5, 2.0, 9.0])
    values, grads = grad_of(GRPO(AlgorithmConfig(entropy_coef=0.1)), inputs)
    assert values == pytest.approx([1.0 - 0.05, 1.0 - 0.2, 0.0])
    assert grads == pytest.approx([-1.0, -0.5, 0.0])
    assert entropy.grad is not None
    assert entropy.grad.tolist() == pytest.approx([-0.1, -0.1, 0.0])  # d loss / d H = -coef on kept tokens


def test_entropy_bonus_in_gspo_is_a_sequence_mean() -> None:
    inputs = loss_inputs([-1.0, -2.0, -0.5], [0.0, 0.0, 0.0], sequence_ids=[0, 0, 1])
    entropy = with_entropy(inputs, [1.0, 3.0, 2.0])
    GSPO(AlgorithmConfig(entropy_coef=0.2)).loss_terms(inputs).sum().backward()
    assert entropy.grad is not None
    assert entropy.grad.tolist() == pytest.approx([-0.1, -0.1, -0.2])


def test_entropy_bonus_needs_the_entropy_tensor() -> None:
    algorithm = GRPO(AlgorithmConfig(entropy_coef=0.1))
    assert algorithm.needs_entropy and not GRPO(AlgorithmConfig()).needs_entropy
    with pytest.raises(ValueError, match=r"LossInputs\.entropy"):
        algorithm.loss_terms(loss_inputs([-1.0], [1.0]))


# ---------------------------------------------------- sequence IS masking


def seq_inputs(**kwargs: object) -> LossInputs:
    # log(pi / pi_inf) per token: seq 0 [0.1, 0.1, (masked) 5.0], seq 1 [0.3, 0.1], seq 2 [-0.3, -0.1], seq 3 [-0.5]
    log_ratio = [0.1, 0.1, 5.0, 0.3, 0.1, -0.3, -0.1, -0.5]
    lp = [-1.0 - 0.1 * i for i in range(8)]
    return loss_inputs(
        lp,
        [1.0] * 8,
        [True, True, False, True, True, True, True, True],
        inference_logprobs=[x - r for x, r in zip(lp, log_ratio, strict=True)],
        sequence_ids=[0, 0, 0, 1, 1, 2, 2, 3],
        **kwargs,  # type: ignore[arg-type]
    )


def test_sequence_is_masking_drops_whole_sequences() -> None:
    # geometric means exp(mean over loss tokens): e^0.1 = 1.105 (in), e^0.2 = 1.221 (> 1.2: out),
    # e^-0.2 = 0.819 (in), e^-0.5 = 0.607 (< 0.8: out); the masked token of seq 0 does not count
    means = [math.exp(0.1), math.exp(0.2), math.exp(-0.2), math.exp(-0.5)]
    kept = [0.8 <= g <= 1.2 for g in means]
    assert kept == [True, False, True, False]
    inputs = seq_inputs()
    algorithm = GRPO(AlgorithmConfig(seq_is_masking=True, seq_is_mask_low=0.8, seq_is_mask_high=1.2))
    values, grads = grad_of(algorithm, inputs)
    lp = inputs.logprobs.detach().tolist()
    keep_token = [True, True, False, False, False, True, True, False]
    assert values == pytest.approx([-x if k else 0.0 for x, k in zip(lp, keep_token, strict=True)])
    assert grads == pytest.approx([-1.0 if k else 0.0 for k in keep_token])
    assert int(algorithm.loss_metrics(seq_inputs()).masked_sequences) == 2  # type: ignore[arg-type]


def test_sequence_is_masking_reads_the_batch_reference() -> None:
    # with a batch reference lp_old = ref: ref - lp_inf = 0 on every token -> all kept, although lp moved
    base = seq_inputs()
    inputs = seq_inputs(ref_logprobs=base.inference_logprobs.tolist())
    algorithm = GRPO(AlgorithmConfig(use_ppo_clip=True, ppo_clip_ref_logprobs="batch", seq_is_masking=True))
    assert int(algorithm.loss_metrics(inputs).masked_sequences) == 0  # type: ignore[arg-type]


def test_sequence_is_masking_off_by_default() -> None:
    algorithm = GRPO(AlgorithmConfig())
    metrics = algorithm.loss_metrics(seq_inputs())
    assert metrics.masked_sequences is None and metrics.kl_penalty is None and metrics.entropy_bonus is None


# ---------------------------------------------------------------- metrics


def test_loss_metrics_are_the_parts_of_the_loss() -> None:
    # sum(loss_terms) = sum(policy) + kl_penalty - entropy_bonus over the kept tokens
    inputs = seq_inputs()
    with_entropy(inputs, [0.5] * 8)
    config = AlgorithmConfig(kl_penalty_tau=0.3, entropy_coef=0.2, seq_is_masking=True)
    algorithm = GRPO(config)
    total = float(algorithm.loss_terms(inputs).sum().detach())
    metrics = algorithm.loss_metrics(inputs)
    keep = [True, True, False, False, False, True, True, False]
    lp = inputs.logprobs.detach().tolist()
    d = (inputs.logprobs.detach() - inputs.inference_logprobs).tolist()
    kl = sum(0.3 * x * x for x, k in zip(d, keep, strict=True) if k)
    bonus = 0.2 * 0.5 * sum(keep)
    policy = sum(-x for x, k in zip(lp, keep, strict=True) if k)
    assert float(metrics.kl_penalty) == pytest.approx(kl)  # type: ignore[arg-type]
    assert float(metrics.entropy_bonus) == pytest.approx(bonus)  # type: ignore[arg-type]
    assert total == pytest.approx(policy + kl - bonus)
