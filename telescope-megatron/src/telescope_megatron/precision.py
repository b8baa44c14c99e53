"""Mixed precision in the megatron backend: the model computes in 16 bits, the optimizer steps main parameters.

Design (megatron-core's: its DDP gradient buffers and ``Float16OptimizerWithFloat16Params``):

- **compute dtype**: ``mixed_precision_dtype``, or ``model_dtype`` without it. The
  megatron-core model's parameters are in it (``TransformerConfig.params_dtype``, with
  ``bf16``/``fp16`` set), so are its activations; attention's softmax and the loss
  (:func:`~telescope.trainer.public.token_logprobs`) run in float32.
- **main parameters** (the master weights, :class:`MainParameters`): one per model
  parameter, in ``megatron_main_params_dtype`` (float32 by default). The optimizer
  (:class:`~telescope_megatron.optimizer.MainAdamW`) steps them; after each step they are
  copied (rounded) into the model parameters. Where the two dtypes are equal the main
  parameter *is* the model parameter: float32 training has no copy and is unchanged.
  They are set from the Hugging Face weights as read (in ``model_dtype``), not from
  their rounding to the compute dtype, so float32 weights stay exact.
- **gradient buffers**: over a minibatch's micro-batches each parameter's gradient
  accumulates in float32 with ``megatron_grad_reduce_in_fp32``, else in the compute
  dtype (megatron-core's DDP ``grad_dtype``): a hook after autograd accumulates a
  parameter's gradient adds it into its buffer and frees it (megatron-core's
  ``main_grad``); where the buffer's dtype is the compute dtype the parameter's own
  ``grad`` is the buffer. The backend reduces the buffers over ranks.
- **main gradients**: then each buffer is converted to ``megatron_main_grads_dtype``
  (the buffer itself where the dtypes are equal) and, under float16, divided by the loss
  scale (:mod:`telescope_megatron.loss_scaling`). The gradient norm, clipping and the
  optimizer read the main gradients, which sit on the main parameters as ``main_grad``.
- **Adam's moments** in ``megatron_exp_avg_dtype`` / ``megatron_exp_avg_sq_dtype``
  (the update itself is computed in float32, see :mod:`telescope_megatron.optimizer`).

The four dtype fields are float32 unless ``megatron_use_precision_aware_optimizer``
is set, as megatron-core's ``OptimizerConfig`` asserts (a validation error here, see
:func:`telescope_megatron.plugin.precision_problems`), so that an upstream config means
what it means there; with it each takes float32, bfloat16 or float16. What that flag
selects in megatron-core is Transformer Engine's ``FusedAdam`` with these dtypes;
here it is :class:`~telescope_megatron.optimizer.MainAdamW`, which computes the same
update. Its memory layout is not built: megatron-core keeps a float32 main parameter
as the bfloat16 model parameter plus 16 remainder bits; here it is a tensor of its own.

Weights out (``named_weights``, the checkpoint's Hugging Face file): the main
parameters cast to ``model_dtype``. That is what the FSDP backend sends (its
parameters stay in ``model_dtype`` and are only cast for compute), so an inference
engine started in ``model_dtype`` receives the same names, dtypes and values from
either backend; with a 16-bit ``model_dtype`` equal to the compute dtype it is exactly
the model's parameters. A checkpoint's training state adds this rank's main
parameters where ``model_dtype`` cannot hold them exactly (:meth:`MainParameters.exact_in`),
so a resume restores them bit for bit.

Limits: the main parameters are not sharded over data-parallel ranks (the distributed
optimizer shards Adam's moments only); the buffers and main gradients of a parameter
both exist when their dtypes differ; no Transformer Engine, no FP8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from telescope.trainer.public import DTYPES
from telescope_megatron.optimizer import set_main_grad
from telescope_megatron.plugin import MegatronSettings, precision_problems

if TYPE_CHECKING:
    from telescope.api.context import TrainerContext


@dataclass(frozen=True)
class Precision:
    """The dtypes of one run: compute, main parameters and gradients, gradient buffers, Adam's moments."""

    compute: torch.dtype = torch.float32
    main_params: torch.dtype = torch.float32
    main_grads: torch.dtype = torch.float32
    grad_buffer: torch.dtype = torch.float32
    exp_avg: torch.dtype = torch.float32
    exp_avg_sq: torch.dtype = torch.float32

    @classmethod
    def of(cls, context: TrainerContext, settings: MegatronSettings) -> Precision:
        """The run's precision; ``ValueError`` for dtype settings this backend does not take."""
        problems = precision_problems(settings)
        if problems:
            raise ValueError("; ".join(problems))
        compute = DTYPES[context.mixed_precision_dtype or context.model_dtype]
        return cls(
            compute=compute,
            main_params=DTYPES[settings.megatron_main_params_dtype],
            main_grads=DTYPES[settings.megatron_main_grads_dtype],
            grad_buffer=torch.float32 if settings.megatron_grad_reduce_in_fp32 else compute,
            exp_avg=DTYPES[settings.megatron_exp_avg_dtype],
            exp_avg_sq=DTYPES[settings.megatron_exp_avg_sq_dtype],
        )

    @property
    def scales_loss(self) -> bool:
        """Whether the loss is scaled: float16 compute (bfloat16 has float32's range)."""
        return self.compute == torch.float16


class MainParameters:
    """The model's parameters with their main parameters, gradient buffers and main gradients, by name."""

    def __init__(self, params: dict[str, torch.nn.Parameter], precision: Precision) -> None:
        self.precision = precision
        self.model = params
        self.params: dict[str, torch.nn.Parameter] = {}
        for name, param in params.items():
            if param.dtype == precision.main_params:
                self.params[name] = param
            else:
                self.params[name] = torch.nn.Parameter(param.detach().to(precision.main_params), requires_grad=True)
        self._buffers: dict[str, torch.Tensor] = {}
        self._main_grads: dict[str, torch.Tensor] = {}
        self._hooks: list[Any] = []
        if precision.grad_buffer != precision.compute:
            for name, param in params.items():
                self._hooks.append(param.register_post_accumulate_grad_hook(self._accumulate_hook(name)))

    def _accumulate_hook(self, name: str) -> Any:
        def accumulate(param: torch.Tensor) -> None:
            assert param.grad is not None
            buffer = self._buffers.get(name)
            if buffer is None:
                self._buffers[name] = param.grad.to(self.precision.grad_buffer)
            else:
                buffer.add_(param.grad)
            param.grad = None

        return accumulate

    def parameters(self) -> list[torch.nn.Parameter]:
        """The main parameters, in the model's order (what the optimizer steps)."""
        return list(self.params.values())

    # ------------------------------------------------------------ gradients

    def accumulated(self, name: str) -> torch.Tensor | None:
        """The gradient accumulated for ``name`` since the last step (its buffer), scaled by the loss scale."""
        if self.precision.grad_buffer == self.precision.compute:
            return self.model[name].grad
        return self._buffers.get(name)

    def zero_accumulated(self, name: str) -> torch.Tensor:
        """``name``'s buffer, created as zeros if nothing accumulated."""
        buffer = self.accumulated(name)
        if buffer is not None:
            return buffer
        param = self.model[name]
        buffer = torch.zeros_like(param, dtype=self.precision.grad_buffer)
        if self.precision.grad_buffer == self.precision.compute:
            param.grad = buffer
        else:
            self._buffers[name] = buffer
        return buffer

    def main_grads(self, loss_scale: float = 1.0) -> dict[str, torch.Tensor]:
        """Every accumulated buffer as a main gradient (divided by ``loss_scale``), set on its main parameter."""
        out: dict[str, torch.Tensor] = {}
        for name, main in self.params.items():
            buffer = self.accumulated(name)
            if buffer is None:
                continue
            grad = buffer if buffer.dtype == self.precision.main_grads else buffer.to(self.precision.main_grads)
            if loss_scale != 1.0:
                grad.mul_(1.0 / loss_scale)
            out[name] = self._main_grads[name] = grad
            set_main_grad(main, grad)
        return out

    def main_grad(self, name: str) -> torch.Tensor | None:
        """``name``'s main gradient of the current step (after :meth:`main_grads`), else None."""
        return self._main_grads.get(name)

    def zero_grad(self) -> None:
        """Free every gradient: the model's, the buffers, the main gradients."""
        for name, param in self.model.items():
            param.grad = None
            self.params[name].grad = None
            set_main_grad(self.params[name], None)
        self._buffers.clear()
        self._main_grads.clear()

    # -------------------------------------------------------------- weights

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Round the main parameters into the model's (after a step, a load)."""
        for name, main in self.params.items():
            model = self.model[name]
            if main is not model:
                model.copy_(main)

    def exact_in(self, dtype: torch.dtype) -> bool:
        """Whether ``dtype`` holds every main parameter's value exactly (float32 holds the 16-bit ones)."""
        return self.precision.main_params == dtype or dtype == torch.float32

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The main parameters (copies on the host), by name."""
        return {name: main.detach().to("cpu", copy=True) for name, main in self.params.items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`state_dict`'s main parameters (same layout), then the model's from them."""
        if set(state) != set(self.params):
            missing, unknown = sorted(set(self.params) - set(state)), sorted(set(state) - set(self.params))
            raise ValueError(f"main parameters do not match this model shard: missing {missing}, unknown {unknown}")
        for name, main in self.params.items():
            main.copy_(state[name])
        self.copy_to_model()

    def close(self) -> None:
        """Remove the gradient hooks."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
