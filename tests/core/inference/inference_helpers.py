"""Helpers of the inference tests: the trainer-side recomputation (plain transformers), an idle server's
metrics, a request held in the engine."""

from __future__ import annotations

import asyncio
from typing import Any

import torch


def with_forward(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` if it is a transformers model, else (the engine's light tree, which has no
    forward) a transformers model of its config holding its current weights."""
    from transformers import AutoModelForCausalLM

    from telescope.inference.embedded.light_model import LightCausalLM

    if not isinstance(model, LightCausalLM):
        return model
    first = next(model.parameters())
    hf = AutoModelForCausalLM.from_config(model.config).to(dtype=first.dtype)
    hf.load_state_dict(model.state_dict(), strict=True)
    return hf.to(first.device).eval()


def trainer_logprobs(
    model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:
    """log_softmax(logits / T) of each completion token, recomputed from the full sequence."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = with_forward(model)(input_ids=ids).logits[0].float()
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / t, dim=-1)
    return logp[len(prompt) - 1 : -1].gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)


def mean_k3(inference: list[float], trainer: torch.Tensor) -> float:
    d = torch.tensor(inference) - trainer
    return float((torch.exp(d) - 1 - d).mean())


async def idle_metrics(client: Any) -> dict[str, float]:
    """The server's metrics once nothing runs (an earlier test's aborts land when the server sees them).

    Idle: no request running or waiting, and no engine step taken over 20 ms (the step
    that drops an aborted request ends after the request stops counting as running).
    """
    previous: dict[str, float] | None = None
    for _ in range(250):
        metrics: dict[str, float] = await client.metrics()
        idle = metrics["vllm:num_requests_running"] == 0 and metrics["vllm:num_requests_waiting"] == 0
        steps = metrics["telescope:engine_steps_total"]
        if idle and previous is not None and steps == previous["telescope:engine_steps_total"]:
            return metrics
        previous = metrics if idle else None
        await asyncio.sleep(0.02)
    raise AssertionError("the server kept running requests")


async def until_queued(engine: Any, requests: int = 1) -> None:
    """Wait until the engine holds ``requests`` waiting requests (a bound on "they arrive", not on how fast).

    With the engine held between two steps (``with engine.paused():``), a request that has
    arrived cannot finish before the test acts on it (an abort): a request of 450 tokens
    aborted 0.2 s after it started had already finished on a fast CPU.
    """
    for _ in range(3000):
        if engine.counts()["waiting"] >= requests:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"fewer than {requests} request(s) reached the engine in 30 s")


def advance(engine: Any, steps: int) -> None:
    """Take ``steps`` engine steps in the caller's thread, the engine held with ``engine.paused()``.

    The held requests then run (prefilled, decoding) and still cannot go further than
    ``steps`` tokens before the test acts on them, however fast the machine is.
    """
    with torch.inference_mode():
        for _ in range(steps):
            engine._step()
