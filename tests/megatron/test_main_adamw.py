"""MainAdamW: torch's AdamW over main parameters, with gradients and Adam's moments in dtypes of their own.

In float32 it is torch AdamW bit for bit (the FSDP comparisons of test_training rely on
it). With bfloat16 moments (or bfloat16 parameters) each update is computed in float32
from the stored values and rounded back for storage: equal to a float32 reference
written out here with torch's formula and that rounding. A ``main_grad`` attribute
wins over ``grad``; a state dict saved and loaded keeps the moments' dtypes and
resumes bit for bit.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from telescope_megatron.optimizer import MainAdamW, set_main_grad

LR, WD, BETAS, EPS = 1e-2, 0.1, (0.9, 0.999), 1e-8


def gradients(step: int, shape: tuple[int, ...] = (7, 5)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(100 + step)) * 10.0 ** (-step)


def start() -> torch.Tensor:
    return torch.randn(7, 5, generator=torch.Generator().manual_seed(0))


def test_float32_is_torch_adamw_bit_for_bit() -> None:
    ours, theirs = torch.nn.Parameter(start()), torch.nn.Parameter(start())
    mine = MainAdamW([ours], lr=LR, weight_decay=WD)
    reference = torch.optim.AdamW([theirs], lr=LR, weight_decay=WD, foreach=True)
    for step in range(3):
        ours.grad, theirs.grad = gradients(step), gradients(step)
        mine.step()
        reference.step()
        assert torch.equal(ours, theirs), step
    assert torch.equal(mine.state[ours]["exp_avg_sq"], reference.state[theirs]["exp_avg_sq"])


def reference_update(
    param: torch.Tensor, grads: list[torch.Tensor], moment_dtype: torch.dtype, param_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch's single-tensor AdamW in float32, the stored parameter and moments rounded to their dtypes each step."""
    p = param.to(param_dtype)
    m = torch.zeros_like(param, dtype=moment_dtype)
    v = torch.zeros_like(param, dtype=moment_dtype)
    for step, grad in enumerate(grads, start=1):
        p32, m32, v32, g = p.float(), m.float(), v.float(), grad.float()
        p32.mul_(1 - LR * WD)
        m32.lerp_(g, 1 - BETAS[0])
        v32.mul_(BETAS[1]).addcmul_(g, g, value=1 - BETAS[1])
        step_size = LR / (1 - BETAS[0] ** step)
        denom = (v32.sqrt() / math.sqrt(1 - BETAS[1] ** step)).add_(EPS)
        p32.addcdiv_(m32, denom, value=-step_size)
        p, m, v = p32.to(param_dtype), m32.to(moment_dtype), v32.to(moment_dtype)
    return p, m, v


@pytest.mark.parametrize(
    ("param_dtype", "moment_dtype"),
    [(torch.float32, torch.bfloat16), (torch.float32, torch.float16), (torch.bfloat16, torch.float32)],
)
def test_moments_and_parameters_in_their_own_dtypes(param_dtype: torch.dtype, moment_dtype: torch.dtype) -> None:
    param = torch.nn.Parameter(start().to(param_dtype))
    optimizer = MainAdamW([param], lr=LR, weight_decay=WD, exp_avg_dtype=moment_dtype, exp_avg_sq_dtype=moment_dtype)
    grads = [gradients(step) for step in range(3)]
    for grad in grads:
        set_main_grad(param, grad)  # float32 gradients of a parameter of another dtype
        optimizer.step()
    state = optimizer.state[param]
    assert (param.dtype, state["exp_avg"].dtype, state["exp_avg_sq"].dtype) == (param_dtype, moment_dtype, moment_dtype)
    want_p, want_m, want_v = reference_update(start(), grads, moment_dtype, param_dtype)
    torch.testing.assert_close(state["exp_avg"], want_m, atol=0, rtol=0)
    torch.testing.assert_close(state["exp_avg_sq"], want_v, atol=0, rtol=0)
    torch.testing.assert_close(param.detach(), want_p, atol=0, rtol=0)
    # the 16-bit storage matters: float32 moments give another result
    float32 = reference_update(start(), grads, torch.float32, torch.float32)[0]
    assert not torch.equal(param.detach().float(), float32)


def test_main_grad_wins_over_grad() -> None:
    param = torch.nn.Parameter(start())
    param.grad = torch.zeros_like(param)
    optimizer = MainAdamW([param], lr=LR, weight_decay=0.0)
    set_main_grad(param, torch.ones(7, 5, dtype=torch.bfloat16))
    optimizer.step()
    torch.testing.assert_close(param.detach(), start() - LR, atol=1e-6, rtol=0)  # Adam's first step: lr * sign


def test_a_state_dict_resumes_bit_for_bit_in_its_dtypes() -> None:
    def optimizer_of(param: torch.Tensor) -> MainAdamW:
        return MainAdamW([param], lr=LR, weight_decay=WD, exp_avg_dtype=torch.bfloat16, exp_avg_sq_dtype=torch.float16)

    param = torch.nn.Parameter(start())
    optimizer = optimizer_of(param)
    param.grad = gradients(0)
    optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())  # as a checkpoint holds it (the optimizer steps in place)
    weights = param.detach().clone()
    param.grad = gradients(1)
    optimizer.step()

    resumed = torch.nn.Parameter(weights)
    again = optimizer_of(resumed)
    again.load_state_dict(saved)
    state = again.state[resumed]
    assert (state["exp_avg"].dtype, state["exp_avg_sq"].dtype) == (torch.bfloat16, torch.float16)
    resumed.grad = gradients(1)
    again.step()
    assert torch.equal(resumed, param)


def test_a_moment_dtype_that_is_not_floating_point_is_refused() -> None:
    with pytest.raises(ValueError, match="exp_avg_dtype must be a floating-point dtype"):
        MainAdamW([torch.nn.Parameter(start())], exp_avg_dtype=torch.uint8)
