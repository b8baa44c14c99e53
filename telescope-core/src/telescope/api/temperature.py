"""The temperature convention the inference engines and the trainer share.

A rollout's reported log-probabilities and the trainer's must describe the same
distribution, or every importance ratio is off. The rule: log-probabilities are
those of ``softmax(logits / T)`` with ``T`` the sampling temperature, except below
:data:`GREEDY_EPS` (``temperature == 0`` included), where decoding is greedy and
``T = 1`` (the unscaled distribution), as vLLM does (its ``_SAMPLING_EPS`` is the
same 1e-5). The embedded engine (:mod:`telescope.inference.embedded.sampling`), the
``vllm`` backend's settings and the trainer (:mod:`telescope.trainer.logprobs`) all
read it from here; an inference backend plugin reports log-probabilities by it.
"""

from __future__ import annotations

#: Below this temperature decoding is greedy (argmax) and log-probabilities are taken at temperature 1.
GREEDY_EPS = 1e-5


def is_greedy(temperature: float) -> bool:
    """A temperature below :data:`GREEDY_EPS` decodes greedily (vLLM's rule)."""
    return temperature < GREEDY_EPS


def logprob_temperature(temperature: float) -> float:
    """The temperature log-probabilities are computed at: ``temperature``, or 1 when greedy."""
    return 1.0 if is_greedy(temperature) else temperature
