"""Conformance kit for trainer backends, and helpers to drive one in tests.

Usage, in a backend package's tests::

    from telescope.testing.trainer import TrainerBackendConformance

    class TestMyBackend(TrainerBackendConformance):
        backend_name = "megatron"                 # a registered train_backend
        config_overrides = {"megatron_tensor_parallel_size": 1}

Every inherited ``test_*`` checks one part of the contract of
:mod:`telescope.api.trainer` on a tiny model built locally (nothing is downloaded),
at world size 1:

- ``train_step`` returns every key of :data:`~telescope.trainer.metrics.REQUIRED_METRICS`
  (plus ``optimizer/skipped_steps``) as finite floats, and changes the weights;
- the learning rate follows the schedule;
- a non-finite gradient skips the optimizer step and is counted;
- ``named_weights`` yields Hugging Face names and shapes that load into
  ``AutoModelForCausalLM`` with identical logits;
- a checkpoint round trip restores weights and step; a weights-only checkpoint
  holds no optimizer state.

Helpers: :func:`tiny_trainer_config`, :func:`synthetic_batch` and
:func:`spawn_ranks` (run a function on N CPU ranks with gloo).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import math
import os
import random
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from telescope.api.records import TrainingBatch, TrainingSample
from telescope.api.trainer import TrainerBackend
from telescope.schema.config import TelescopeConfig

#: Settings that make a tiny model train quickly and exactly (float32, no recomputation).
TINY_TRAINER_SETTINGS: dict[str, Any] = {
    "environments": [{"name": "test"}],
    "model_dtype": "float32",
    "mixed_precision_dtype": None,
    "gradient_checkpointing": False,
    "learning_rate": 1e-3,
    "lr_scheduler": "none",
    "seq_len": 64,
    "pad_to_multiple_of": 8,
    "max_model_len": 64,
    "max_tokens": 32,
    "group_size": 2,
    "prompts_batch_size_for_trainer": 4,
    "number_of_steps": 10,
    "entropy_chunk_size": 16,
    "use_wandb": False,
}


def tiny_trainer_config(model: str | Path, **overrides: Any) -> TelescopeConfig:
    """A validated run config for a tiny local model (plugin names are not checked)."""
    from telescope.config.composition import config_from_dict

    values = {**TINY_TRAINER_SETTINGS, "model": str(model), **overrides}
    return config_from_dict(values)


def synthetic_batch(
    *,
    num_groups: int = 2,
    group_size: int = 2,
    vocab_size: int = 300,
    prompt_length: int = 5,
    completion_lengths: tuple[int, int] = (3, 12),
    step: int = 0,
    seed: int = 0,
) -> TrainingBatch:
    """Random tokens with prompt/completion masks, plausible log-probabilities and ±1 advantages."""
    rng = random.Random(seed)
    samples: list[TrainingSample] = []
    for g in range(num_groups):
        for k in range(group_size):
            n = rng.randint(*completion_lengths)
            tokens = [rng.randrange(vocab_size) for _ in range(prompt_length + n)]
            mask = [False] * prompt_length + [True] * n
            logprobs = [0.0] * prompt_length + [-rng.uniform(3.0, 8.0) for _ in range(n)]
            advantage = 1.0 if k % 2 == 0 else -1.0
            samples.append(TrainingSample(tokens, mask, logprobs, advantage, policy_version=step, group_index=g))
    return TrainingBatch(samples=samples, step=step, policy_version=step)


#: Imported once by the process that forks the ranks (see :func:`spawn_ranks`); a module that is
#: not installed is skipped. Each costs seconds of CPU to import (megatron-core with torch and
#: transformers about 9 s), which every rank paid again when it started as a fresh interpreter.
RANK_PRELOAD = (
    "torch",
    "torch.distributed",
    "transformers",
    "telescope.trainer.fsdp",
    "megatron.core",
    "telescope_megatron.backend",
)


def spawn_ranks(fn: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes (gloo, CPU).

    ``fn`` must be importable by module name (a module-level function). Each rank
    should call ``backend.close()`` (barrier, then destroy the group) before returning.

    The ranks are forked from a fork server (``multiprocessing``'s ``forkserver``: one
    per calling process, started at the first call) that has imported
    :data:`RANK_PRELOAD`, so a rank starts in milliseconds instead of importing torch,
    transformers and megatron-core again; the server only imports (no process group,
    no CUDA context: what would make forking it unsafe). A rank
    gets the caller's environment as it is at the call (a forked rank would otherwise
    have the server's, from its start), plus ``MASTER_ADDR``/``MASTER_PORT``; a module
    that reads a variable at import time read it in the server. The port stays reserved
    (:func:`~telescope.trainer.distributed.reserve_port`) until the ranks have returned,
    so no other test's process takes it before rank 0 listens on it.

    Each rank's standard error (file descriptor 2: Python's, C++'s and glibc's
    messages) goes to a file of its own, which the call copies to its caller's
    ``sys.stderr`` when the ranks have returned: a forked rank would otherwise write
    to the descriptor the fork server inherited when it started, under pytest the
    capture file of whichever test started it. Python's ``faulthandler`` writes there
    too, so a rank killed by a signal (glibc aborting on a corrupted heap, a
    segmentation fault) leaves the Python stack of every thread it had; when the
    call fails, the tail of each rank's file is added to the error as a note.
    """
    import multiprocessing

    import torch.multiprocessing as mp

    from telescope.trainer.distributed import reserve_port

    multiprocessing.get_context("forkserver").set_forkserver_preload(list(RANK_PRELOAD))
    with reserve_port("127.0.0.1") as reservation, tempfile.TemporaryDirectory(prefix="telescope-ranks-") as logs:
        port = reservation.getsockname()[1]
        environment = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        try:
            rank_args = (fn, world_size, environment, logs, args)
            mp.start_processes(_rank_entry, args=rank_args, nprocs=world_size, join=True, start_method="forkserver")
        except BaseException as error:
            for rank, text in _rank_outputs(logs, world_size):
                error.add_note(f"rank {rank}'s standard error (last lines):\n" + "\n".join(text.splitlines()[-60:]))
            raise
        finally:
            for rank, text in _rank_outputs(logs, world_size):
                sys.stderr.write(f"--- rank {rank}'s standard error ---\n{text}")


def _rank_outputs(logs: str, world_size: int) -> Iterator[tuple[int, str]]:
    """Each rank's non-empty standard error file, in rank order."""
    for rank in range(world_size):
        path = Path(logs, f"rank{rank}.stderr")
        text = path.read_text(errors="replace") if path.exists() else ""
        if text.strip():
            yield rank, text


def _rank_entry(
    rank: int,
    fn: Callable[..., None],
    world_size: int,
    environment: dict[str, str],
    logs: str,
    args: tuple[Any, ...],
) -> None:
    with open(Path(logs, f"rank{rank}.stderr"), "w", buffering=1) as log:
        os.dup2(log.fileno(), 2)  # sys.stderr writes to descriptor 2, and so do C++ and glibc
        faulthandler.enable(all_threads=True)
        os.environ.clear()
        os.environ.update(environment)
        import torch

        torch.set_num_threads(1)
        fn(rank, world_size, *args)


def tiny_model_for_session(tmp_path_factory: pytest.TempPathFactory, preset: str = "test") -> Path:
    """The tiny model preset, built once per test session under pytest's base temp folder."""
    from telescope.models.tiny import PRESETS, build_tiny_model

    path = tmp_path_factory.getbasetemp() / f"telescope-tiny-{preset}"
    if not (path / "config.json").exists():
        build_tiny_model(path, PRESETS[preset])
    return path


def weights_snapshot(backend: TrainerBackend) -> dict[str, Any]:
    return {name: tensor.detach().float().cpu().clone() for name, tensor in backend.named_weights()}


def max_weight_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


class TrainerBackendConformance:
    """Inherit in a test module (``class TestX(TrainerBackendConformance)``) and set ``backend_name``."""

    backend_name: ClassVar[str] = "fsdp"
    algorithm_name: ClassVar[str] = "grpo"
    config_overrides: ClassVar[dict[str, Any]] = {}

    # ---------------------------------------------------------------- fixtures

    @pytest.fixture
    def tiny_model_path(self, tmp_path_factory: pytest.TempPathFactory) -> Path:
        return tiny_model_for_session(tmp_path_factory)

    def make_config(self, model_path: Path, **overrides: Any) -> TelescopeConfig:
        return tiny_trainer_config(
            model_path,
            train_backend=self.backend_name,
            algorithm=self.algorithm_name,
            **{**self.config_overrides, **overrides},
        )

    def make_backend(self, config: TelescopeConfig) -> TrainerBackend:
        """Instantiate (not set up) the backend; override for a backend that is not registered."""
        from telescope.plugins.facade import get_plugins

        plugins = get_plugins()
        return plugins.create_trainer_backend(config, plugins.create_algorithm(config))

    def started(self, model_path: Path, **overrides: Any) -> TrainerBackend:
        backend = self.make_backend(self.make_config(model_path, **overrides))
        backend.setup(rank=0, world_size=1)
        return backend

    @pytest.fixture
    def backend(self, tiny_model_path: Path) -> Iterator[TrainerBackend]:
        backend = self.started(tiny_model_path)
        yield backend
        backend.close()

    # ------------------------------------------------------------------- tests

    def test_train_step_returns_required_metrics(self, backend: TrainerBackend) -> None:
        from telescope.trainer.metrics import REQUIRED_METRICS

        metrics = backend.train_step(synthetic_batch())
        missing = [k for k in (*REQUIRED_METRICS, "optimizer/skipped_steps") if k not in metrics]
        assert not missing, f"train_step did not return {missing}"
        for key, value in metrics.items():
            assert isinstance(value, float), f"metric {key} is {type(value).__name__}, not float"
            assert math.isfinite(value), f"metric {key} is {value}"
        assert metrics["entropy"] > 0
        assert metrics["grad_norm"] > 0

    def test_train_step_changes_weights(self, backend: TrainerBackend) -> None:
        before = weights_snapshot(backend)
        backend.train_step(synthetic_batch())
        assert max_weight_diff(before, weights_snapshot(backend)) > 0

    def test_learning_rate_follows_warmup(self, tiny_model_path: Path) -> None:
        backend = self.started(tiny_model_path, lr_scheduler="constant", warmup_steps=4, learning_rate=1e-3)
        try:
            rates = [backend.train_step(synthetic_batch(step=i))["learning_rate"] for i in range(2)]
        finally:
            backend.close()
        assert rates == pytest.approx([2.5e-4, 5e-4])

    def test_supervised_step_fits_a_demonstration(self, backend: TrainerBackend) -> None:
        from telescope.api.records import SupervisedExample

        examples = [SupervisedExample([1, 2, 3], [4, 5, 6, 7]), SupervisedExample([2, 3], [9, 8])]
        losses = [backend.supervised_step(examples, learning_rate=1e-2)["loss"] for _ in range(8)]
        assert all(math.isfinite(v) for v in losses)
        assert losses[-1] < losses[0] * 0.8, f"supervised steps did not fit the demonstrations: {losses}"

    def test_nonfinite_gradient_skips_step(self, backend: TrainerBackend) -> None:
        batch = synthetic_batch()
        poisoned = dataclasses.replace(batch.samples[0], advantage=float("nan"))
        batch = dataclasses.replace(batch, samples=[poisoned, *batch.samples[1:]])
        before = weights_snapshot(backend)
        metrics = backend.train_step(batch)
        assert metrics["optimizer/skipped_steps"] == 1.0
        assert max_weight_diff(before, weights_snapshot(backend)) == 0.0

    def test_named_weights_load_into_hf_model(self, backend: TrainerBackend, tiny_model_path: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        backend.train_step(synthetic_batch())
        weights = weights_snapshot(backend)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        result = model.load_state_dict(weights, strict=False)
        assert not result.unexpected_keys, f"names unknown to the HF model: {result.unexpected_keys}"
        tied = set(getattr(model, "_tied_weights_keys", None) or [])
        assert set(result.missing_keys) <= tied, f"HF weights not provided: {set(result.missing_keys) - tied}"
        reference = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        ids = torch.tensor([[1, 5, 9, 30, 2]])
        with torch.no_grad():
            assert not torch.equal(model(ids).logits, reference(ids).logits), "trained weights did not load"

    def test_checkpoint_round_trip(self, backend: TrainerBackend, tmp_path: Path) -> None:
        backend.train_step(synthetic_batch())
        saved = weights_snapshot(backend)
        backend.save_checkpoint(tmp_path / "ckpt", training_state=True)
        backend.train_step(synthetic_batch(step=1, seed=1))
        assert max_weight_diff(saved, weights_snapshot(backend)) > 0
        meta = backend.load_checkpoint(tmp_path / "ckpt")
        assert meta["step"] == 1
        assert max_weight_diff(saved, weights_snapshot(backend)) == 0.0

    def test_weights_only_checkpoint(self, backend: TrainerBackend, tmp_path: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        backend.train_step(synthetic_batch())
        saved = weights_snapshot(backend)
        backend.save_checkpoint(tmp_path / "ckpt", training_state=False)
        assert not (tmp_path / "ckpt" / "optimizer.pt").exists()
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
        state = model.state_dict()
        assert max(float((state[k] - v).abs().max()) for k, v in saved.items()) == 0.0
