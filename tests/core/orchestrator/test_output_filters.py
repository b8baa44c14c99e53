"""Overlong handling and the output filters (``telescope.orchestrator.filters``).

Golden tests check each check against its formula, computed by hand or independently
(zlib, math.log); the loop tests run the orchestrator over fake services, where a
scripted server produces truncated, repetitive and gibberish completions, and check
what reaches the trainer, the step metrics and the rollout records.
"""

from __future__ import annotations

import math
import random
import zlib
from pathlib import Path
from typing import Any

import pytest

from telescope.algorithms.grpo import GRPO
from telescope.api.algorithm import AlgorithmConfig
from telescope.api.records import Group, RewardResult, Rollout, Sample, TrainingSample, Turn
from telescope.inference.generation import Generation, SamplingSettings
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.batching import build_training_batch, training_rewards
from telescope.orchestrator.filters import (
    OutputChecks,
    compression_ratio,
    gibberish_logprob_floor,
    is_gibberish,
    is_repetitive,
    overlong_penalty,
)
from telescope.recording.rollout_metrics import discard_metrics, rollout_step_metrics
from telescope.recording.run_store import rollout_record

from .fakes import FakeServices
from .test_orchestrator import run_loop

pytestmark = pytest.mark.timeout(120)

GROUP = AlgorithmConfig(advantage_norm="group")


def rollout(
    tokens: list[int],
    *,
    finish: str = "stop",
    logprobs: list[float] | None = None,
    text: str = "",
    reward: float = 0.0,
    turns: int = 1,
) -> Rollout:
    made = [
        Turn(
            [1, 2],
            list(tokens),
            logprobs if logprobs is not None else [-1.0] * len(tokens),
            0,
            finish if i == turns - 1 else "stop",
            text if i == 0 else "",
        )  # type: ignore[arg-type]
        for i in range(turns)
    ]
    return Rollout(Sample("p", sample_id="s", environment="e"), made, reward=RewardResult(reward))


# ----------------------------------------------------------------- golden: formulas


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (0, 0.0),
        (744, 0.0),  # 1000 - 256: the ramp starts after it
        (745, -0.5 * 1 / 256),
        (872, -0.5 * 128 / 256),  # half way through the buffer: half the factor
        (1000, -0.5),  # at max_tokens: the whole factor
        (1500, -0.5),  # beyond (multi-turn sums): capped at the factor, as DAPO
    ],
)
def test_overlong_penalty_is_dapos_linear_ramp(length: int, expected: float) -> None:
    assert overlong_penalty(length, max_tokens=1000, buffer_tokens=256, factor=0.5) == pytest.approx(expected)


def test_overlong_penalty_off_at_factor_zero() -> None:
    assert overlong_penalty(1000, max_tokens=1000, buffer_tokens=256, factor=0.0) == 0.0


def test_compression_ratio_is_bytes_over_zlib_level_1_of_the_last_10000_characters() -> None:
    rng = random.Random(0)
    text = "".join(rng.choice("abcdefghij ") for _ in range(30_000))
    tail = text[-10_000:].encode()
    assert compression_ratio(text) == len(tail) / len(zlib.compress(tail, 1))
    multibyte = "é" * 200
    assert compression_ratio(multibyte) == 400 / len(zlib.compress(multibyte.encode(), 1))


def test_repetition_flags_loops_not_prose_nor_short_texts() -> None:
    loop = "the answer is 4. " * 40
    assert compression_ratio(loop) > 10
    assert is_repetitive(loop, 10.0)
    rng = random.Random(1)
    prose = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz .,") for _ in range(600))
    assert compression_ratio(prose) < 2
    assert not is_repetitive(prose, 10.0)
    short = "a" * 99  # under 100 characters: never judged
    assert compression_ratio(short) > 5 and not is_repetitive(short, 5.0)
    assert is_repetitive("a" * 100, 5.0)
    ratio = compression_ratio(loop)
    assert is_repetitive(loop, ratio - 1e-9) and not is_repetitive(loop, ratio)  # strictly above


def test_gibberish_needs_a_rare_token_below_the_uniform_logprob_minus_offset() -> None:
    vocab, offset = 151_936, 2.0
    floor = gibberish_logprob_floor(vocab, offset)
    assert floor == pytest.approx(-math.log(151_936) - 2.0)  # -13.93...
    kwargs = {"threshold": 100_000, "vocab_size": vocab, "offset": offset}
    assert is_gibberish([5, 120_000], [-0.1, floor - 0.01], **kwargs)
    assert not is_gibberish([5, 120_000], [-0.1, floor + 0.01], **kwargs)  # likely enough
    assert not is_gibberish([5, 100_000], [-0.1, -40.0], **kwargs)  # not above the threshold
    assert not is_gibberish([99_999], [-40.0], **kwargs)
    assert not is_gibberish([], [], **kwargs)


def checks(**overrides: Any) -> OutputChecks:
    values: dict[str, Any] = {"vocab_size": 1000, "max_tokens": 8}
    values.update(overrides)
    return OutputChecks(**values)


def test_output_checks_reasons_in_order_and_only_when_enabled() -> None:
    truncated_loop = rollout([500] * 8, finish="length", logprobs=[-30.0] * 8, text="ab" * 100)
    assert checks().reasons(truncated_loop) == ()
    everything = checks(
        filter_overlong=True, filter_gibberish=True, gibberish_token_threshold=400, filter_repetition=True
    )
    assert everything.reasons(truncated_loop) == ("overlong", "gibberish", "repetition")
    assert checks(filter_overlong=True).reasons(rollout([5] * 3)) == ()
    # multi-turn: the last turn's finish reason decides; every turn's tokens are checked
    two_turns = rollout([500], finish="length", logprobs=[-30.0], turns=2)
    assert everything.reasons(two_turns) == ("overlong", "gibberish")


def test_apply_sets_the_penalty_and_leaves_clean_rollouts_alone() -> None:
    c = checks(overlong_penalty_factor=1.0, overlong_buffer_tokens=4, filter_overlong=True)
    clean = rollout([5] * 4)
    assert c.apply(clean) is clean
    long = c.apply(rollout([5] * 6))  # 6 - (8 - 4) = 2 into a buffer of 4
    assert long.overlong_penalty == pytest.approx(-0.5) and long.filtered == ()
    truncated = c.apply(rollout([5] * 8, finish="length"))
    assert truncated.overlong_penalty == pytest.approx(-1.0) and truncated.filtered == ("overlong",)


def test_a_filtered_rollout_trains_with_an_all_false_mask() -> None:
    r = Rollout(rollout([5, 6]).sample, rollout([5, 6]).turns, filtered=("overlong",))
    sample = TrainingSample.from_rollout(r, 1.5)
    assert sample.loss_mask == [False] * 4 and sample.advantage == 1.5 and sample.token_ids == [1, 2, 5, 6]
    assert TrainingSample.from_rollout(rollout([5, 6]), 1.5).loss_mask == [False, False, True, True]


def test_the_penalty_is_added_after_the_reward_range_scaling() -> None:
    group = Group(
        Sample("p", environment="e"),
        [
            Rollout(rollout([5]).sample, rollout([5]).turns, reward=RewardResult(0.0), overlong_penalty=-0.25),
            Rollout(rollout([5]).sample, rollout([5]).turns, reward=RewardResult(2.0)),
        ],
    )
    assert training_rewards(group, {"e": (0.0, 2.0)}) == [-0.25, 1.0]  # not clamped away at 0
    assert training_rewards(group, {}) == [-0.25, 2.0]
    batch = build_training_batch(0, [group], GRPO(GROUP), {"e": (0.0, 2.0)})
    expected = GRPO(GROUP).advantages([[-0.25, 1.0]])[0]
    assert [s.advantage for s in batch.samples] == pytest.approx(expected)


def test_discard_metrics_count_filtered_rollouts_by_reason() -> None:
    over = Rollout(rollout([5] * 3).sample, rollout([5] * 3).turns, filtered=("overlong",))
    both = Rollout(rollout([5]).sample, rollout([5]).turns, filtered=("overlong", "repetition"))
    m = discard_metrics(filtered_rollouts=[over, both], trained_rollouts=6, canceled=2)
    # 6 trained + 2 filtered + 2 canceled = 10 accounted for
    assert m["discarded/filtered/count"] == 2 and m["discarded/filtered/pct"] == 20.0
    assert m["discarded/overlong/count"] == 2 and m["discarded/overlong/pct"] == 20.0
    assert m["discarded/repetition/count"] == 1 and m["discarded/repetition/pct"] == 10.0
    assert m["discarded/gibberish/count"] == 0
    assert m["discarded/count"] == 2 and m["discarded/pct"] == 20.0
    assert m["discarded/tokens/completion/mean"] == 2.0
    assert discard_metrics()["discarded/overlong/count"] == 0.0  # always reported


def test_records_show_the_filters_and_the_penalty() -> None:
    r = Rollout(
        rollout([5]).sample,
        rollout([5]).turns,
        reward=RewardResult(1.0),
        filtered=("gibberish",),
        overlong_penalty=-0.2,
    )
    record = rollout_record(r, step=3, group_index=0)
    assert record["filtered"] == ["gibberish"] and record["overlong_penalty"] == -0.2 and record["reward"] == 1.0
    assert rollout_record(rollout([5]), step=0, group_index=0)["filtered"] == []
    metrics = rollout_step_metrics([Group(r.sample, [r, rollout([5], reward=1.0)])])
    assert metrics["reward/overlong_penalty/mean"] == pytest.approx(-0.1)
    assert metrics["reward/overlong_penalty/count"] == 1.0
    assert metrics["reward/mean"] == 1.0  # the environment's rewards, without the penalty
    assert "reward/overlong_penalty/mean" not in rollout_step_metrics([Group(r.sample, [rollout([5])])])


# ----------------------------------------------------------------- loop: fake services

#: Seeds decide what the scripted server produces (a request's seed is a hash).
KINDS = ("normal", "truncated", "repetitive", "gibberish")


class ScriptedServices(FakeServices):
    """A fake server whose completions are normal, truncated, repetitive or gibberish by seed."""

    def kind(self, seed: int) -> str:
        return KINDS[seed % len(KINDS)]

    async def generate(
        self,
        server: int,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        seed: int,
        priority: int,
        sampling: SamplingSettings,
    ) -> Generation:
        self.requests.append({"server": server, "seed": seed, "version": self.version, "priority": priority})
        rng = random.Random(seed)
        kind = self.kind(seed)
        if kind == "truncated":
            tokens = [rng.choice(self.vocab) for _ in range(max_tokens)]
            return Generation(tokens, [-1.0] * len(tokens), "length", self.version, self.version)
        if kind == "repetitive":  # one character over and over: "FFFF..."
            tokens = [40] * (max_tokens - 1) + [self.eos_token_id]
            return Generation(tokens, [-0.1] * len(tokens), "stop", self.version, self.version)
        length = rng.randint(1, 6)
        tokens = [rng.choice(self.vocab) for _ in range(length)] + [self.eos_token_id]
        logprobs = [-1.0] * len(tokens)
        if kind == "gibberish":  # a rare id (> 100) sampled at a log-probability far below -log(384)
            tokens[0], logprobs[0] = 110, -30.0
        return Generation(tokens, logprobs, "stop", self.version, self.version)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(PRESETS["test"])


FILTERS_ON = {
    "filter_overlong": True,
    "filter_gibberish": True,
    "gibberish_token_threshold": 100,
    "filter_repetition": True,
    "repetition_compression_threshold": 5.0,  # 119 x "F" compresses about 10x
    "max_tokens": 120,
    "discard_group_zero_advantage": False,
}


def test_filters_mask_what_they_flag_count_it_and_record_it(tmp_path: Path, tokenizer: Any) -> None:
    services = ScriptedServices()
    services, reader = run_loop(tmp_path, tokenizer, services, number_of_steps=3, **FILTERS_ON)
    records = reader.rollouts()
    assert len(records) == 3 * 3 * 4
    by_kind = {"truncated": "overlong", "repetitive": "repetition", "gibberish": "gibberish"}
    seen: set[str] = set()
    for batch in services.batches:
        for sample in batch.samples:
            record = next(
                r
                for r in records
                if r["step"] == batch.step
                and r["group_index"] == sample.group_index
                and r["rollout_index"] == sample.rollout_index
            )
            if record["filtered"]:
                seen.update(record["filtered"])
                assert not any(sample.loss_mask), record
            else:
                assert any(sample.loss_mask), record
    assert seen == set(by_kind.values()), "the scripted kinds should have triggered every filter"
    metrics = reader.metrics()
    for m in metrics:
        step_records = [r for r in records if r["step"] == m["step"]]
        for reason in by_kind.values():
            assert m[f"discarded/{reason}/count"] == sum(reason in r["filtered"] for r in step_records)
        assert m["discarded/filtered/count"] == sum(bool(r["filtered"]) for r in step_records)


def test_without_the_filters_the_same_completions_train(tmp_path: Path, tokenizer: Any) -> None:
    off = {k: v for k, v in FILTERS_ON.items() if not k.startswith("filter_")}
    services, reader = run_loop(tmp_path, tokenizer, ScriptedServices(), number_of_steps=2, **off)
    assert all(any(s.loss_mask) for b in services.batches for s in b.samples)
    assert all(r["filtered"] == [] for r in reader.rollouts())
    assert all(m["discarded/filtered/count"] == 0 for m in reader.metrics())


class LengthServices(FakeServices):
    """Completions of an even number of characters (parity reward 1 for all) and varied token counts."""

    async def generate(
        self,
        server: int,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        seed: int,
        priority: int,
        sampling: SamplingSettings,
    ) -> Generation:
        self.requests.append({"server": server, "seed": seed, "version": self.version, "priority": priority})
        characters = 2 * (seed % (max_tokens // 2))  # 0, 2, ..., max_tokens - 2: then EOS
        tokens = [40] * characters + [self.eos_token_id]
        return Generation(tokens, [-1.0] * len(tokens), "stop", self.version, self.version)


def test_the_overlong_penalty_makes_equal_reward_groups_trainable(tmp_path: Path, tokenizer: Any) -> None:
    """Every completion earns reward 1, so without the penalty every group is zero-advantage
    (the run could not fill a batch); with it, longer completions in a group get lower
    advantages: GRPO's on reward + penalty."""
    services, reader = run_loop(
        tmp_path,
        tokenizer,
        LengthServices(),
        max_tokens=16,
        number_of_steps=2,
        discard_group_zero_advantage=True,
        overlong_penalty_factor=1.0,
        overlong_buffer_tokens=8,
    )
    records = reader.rollouts()
    assert records and all(r["reward"] == 1.0 for r in records)
    for r in records:
        excess = r["completion_tokens"] - (16 - 8)
        assert r["overlong_penalty"] == pytest.approx(-min(max(excess, 0) / 8, 1.0))
    for batch in services.batches:
        step_records = [r for r in records if r["step"] == batch.step]
        for g in {s.group_index for s in batch.samples}:
            group = sorted((r for r in step_records if r["group_index"] == g), key=lambda r: r["rollout_index"])
            expected = GRPO(GROUP).advantages([[r["reward"] + r["overlong_penalty"] for r in group]])[0]
            assert [s.advantage for s in batch.samples if s.group_index == g] == pytest.approx(expected)
            assert [r["advantage"] for r in group] == pytest.approx(expected)
            assert any(a != 0 for a in expected)
            longest = max(group, key=lambda r: r["completion_tokens"])
            assert longest["advantage"] == min(r["advantage"] for r in group)
    metrics = reader.metrics()
    assert all(m["reward/overlong_penalty/count"] > 0 for m in metrics)
