"""One forward and backward pass at set-up, so the first training step runs at the later steps' speed.

Why. A fresh trainer process pays, in its first step, for everything it does for
the first time: its activations and gradients land on memory the process has never
touched, so every page faults in (on a virtual machine the host backs each page too),
and the math libraries pick and prepare their kernels for each new shape (oneDNN and
MKL on the CPU; cuBLAS handles and autotuning on a GPU). Measured on this project's
2-core CPU machine (the ``tiny:small`` loop of ``bench/bench_vs_trl.py``, 2 runs
each): the first step's forward took 0.70-0.80 s against 0.08-0.12 s for the later
ones, and the first train step 1.05-1.11 s against about 0.35 s. The prewarm moves
that cost into set-up; with the allocator settings of
:func:`telescope.runtime.ray_cluster.runtime_env` (freed memory stays in the process,
so the prewarm's pages are the first step's) the first train step took 0.35-0.38 s.
How much it saves depends on how dear the machine makes a first touch: later the same
day, both settings off gave first train steps of 0.32-0.39 s on that machine, and the
prewarm made no difference beyond the spread. When it was written the trainer waited
for the inference server at set-up anyway; since a fresh run generates while the
trainer sets up, the trainer is the last worker ready and the prewarm is on the way
to the first step: four alternating pairs of the quick start's start (2026-11-27,
AVX2-only 2-core host) ended the first step 14.01 s after ``telescope run`` on
average with it and 14.01 s without (the first step 0.47-0.62 s with, 0.54-0.78 s
without), so it stays on.

What. :func:`prewarm` runs the backend's own forward (``logits_of``: the same path
as a training micro-batch, so packed attention, context parallelism and sharded
parameters all take part) on one synthetic packed row of ``seq_len`` tokens, the
largest micro-batch a step can pack, cut into documents of at most
:data:`DOCUMENT_TOKENS`; then a backward of the mean log-sum-exp of the logits, and
the gradients are dropped (``set_to_none``). The optimizer is not touched and no
weight changes; the token ids are a fixed pattern and the random number generators
are restored afterwards, so a run with the prewarm trains exactly as one without it
(test: ``tests/core/trainer/test_prewarm.py``). Every rank runs it in set-up, so the
collectives of a sharded or context-parallel forward and backward match.

Limits. The row's documents are all the same length, so a step whose documents fall
into other attention buckets still builds those plans (cheap); a step longer than
``seq_len`` does not exist. It costs one micro-batch's forward and backward (0.4 s
on the CPU quick start) and the memory a step needs anyway (a model that does not fit
now fails in set-up rather than in its first step). ``trainer_prewarm: false`` turns
it off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from telescope.trainer.microbatch import MicroBatch

#: The longest document of the synthetic row.
DOCUMENT_TOKENS = 256


def synthetic_row(tokens: int, vocab_size: int, device: torch.device) -> MicroBatch:
    """A packed row of ``tokens`` tokens in documents of at most :data:`DOCUMENT_TOKENS` (fixed ids, no RNG)."""
    tokens = max(int(tokens), 1)
    lengths = [DOCUMENT_TOKENS] * (tokens // DOCUMENT_TOKENS)
    if tokens % DOCUMENT_TOKENS:
        lengths.append(tokens % DOCUMENT_TOKENS)
    positions = torch.cat([torch.arange(n) for n in lengths]).to(device)
    ids = (torch.arange(tokens) * 7919 % max(vocab_size, 1)).to(device)  # a fixed spread of ids
    zeros = torch.zeros(tokens, device=device)
    return MicroBatch(
        input_ids=ids.unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        target_ids=ids,
        loss_mask=torch.ones(tokens, dtype=torch.bool, device=device),
        inference_logprobs=zeros,
        advantages=zeros,
        sequence_ids=torch.zeros(tokens, dtype=torch.long, device=device),
        sequence_lengths=torch.tensor([tokens], device=device),
        num_loss_tokens=tokens,
    )


def prewarm(
    model: torch.nn.Module,
    logits_of: Callable[[MicroBatch], torch.Tensor],
    tokens: int,
    vocab_size: int,
    device: torch.device,
) -> dict[str, Any]:
    """One forward and backward of a synthetic row through ``logits_of``; the gradients are dropped.

    Returns a timeline record (``trainer.prewarm``: its wall start, duration and token count).
    """
    start_wall, start = time.time(), time.perf_counter()
    row = synthetic_row(tokens, vocab_size, device)
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):  # dropout, if any, must not shift the run's random stream
        logits = logits_of(row)
        torch.logsumexp(logits.float(), dim=-1).mean().backward()
    del logits
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {
        "kind": "trainer.prewarm",
        "start": start_wall,
        "duration_s": time.perf_counter() - start,
        "clock": "wall",
        "tokens": int(row.input_ids.shape[1]),
    }
