"""Wordle: feedback rules, multi-turn play, rewards, conformance."""

from __future__ import annotations

from pathlib import Path

import pytest

from telescope.api.records import Sample
from telescope.testing.environment import EnvironmentConformance
from telescope_envs.wordle import WordleEnvironment, feedback, textarena_available
from telescope_envs.wordle_words import WORDS

DATA = Path(__file__).parent / "data"


class TestWordleConformance(EnvironmentConformance):
    def environment_factory(self) -> WordleEnvironment:
        return WordleEnvironment(dataset_name=str(DATA / "wordle.jsonl"), game_backend="builtin")

    def right_replies(self, sample: Sample) -> list[str] | None:
        return ["I'll start with [plumb]", f"Now [{sample.answer}]"]


class TestWordleBuiltinListConformance(EnvironmentConformance):
    def environment_factory(self) -> WordleEnvironment:
        return WordleEnvironment(game_backend="builtin", max_samples=10)


@pytest.mark.parametrize(
    ("guess", "secret", "marks"),
    [
        ("crane", "crane", "GGGGG"),
        ("trace", "crane", "XGGYG"),
        ("speed", "abide", "XXYXY"),  # one 'e' in the secret: only one of the guess's e's marked
        ("geese", "eerie", "XGYXG"),
        ("sassy", "sassy", "GGGGG"),
        ("xxxxx", "apple", "XXXXX"),
    ],
)
def test_feedback(guess: str, secret: str, marks: str) -> None:
    assert feedback(guess, secret) == marks


def _play(env: WordleEnvironment, secret: str, replies: list[str]) -> tuple[float, dict[str, float], list[str]]:
    sample = Sample(prompt=env.rules(5), answer=secret, sample_id="w")
    state = env.initial_state(sample)
    messages = env.format_prompt(sample)
    env_replies: list[str] = []
    for reply in replies:
        messages.append({"role": "assistant", "content": reply})
        state.turn += 1
        if env.is_done(messages, state):
            break
        new = env.env_response(messages, state)
        env_replies.append(new[0]["content"])
        messages.extend(new)
    result = env.compute_reward(messages, sample, state)
    return result.total_reward, result.sample_metrics, env_replies


def test_solving_in_three_guesses() -> None:
    env = WordleEnvironment(game_backend="builtin")
    reward, metrics, replies = _play(env, "crane", ["[slate]", "[trace]", "[crane]", "[extra]"])
    assert reward == 1.0
    assert metrics["solved"] == 1.0 and metrics["guesses_used"] == 3.0 and metrics["invalid_guesses"] == 0
    assert replies[0].startswith("[slate] -> X X G X G") and "5 guesses left" in replies[0]


def test_failing_gives_partial_credit_below_a_win() -> None:
    env = WordleEnvironment(game_backend="builtin", num_guesses=2)
    reward, metrics, _ = _play(env, "crane", ["[trace]", "[brick]", "[crane]"])
    assert metrics["solved"] == 0.0 and metrics["guesses_used"] == 2.0
    # best guess "trace": 3 greens + 1 yellow -> (3 + 0.5) / 5 = 0.7; reward is half of it
    assert reward == pytest.approx(0.35)


def test_invalid_guesses_use_turns_and_are_explained() -> None:
    env = WordleEnvironment(game_backend="builtin")
    reward, metrics, replies = _play(env, "apple", ["apple", "[app]", "[plumb]", "[plumb]", "[apple]"])
    assert reward == 1.0
    assert metrics["invalid_guesses"] == 3.0 and metrics["guesses_used"] == 5.0
    assert "square brackets" in replies[0] and "exactly 5 letters" in replies[1] and "already guessed" in replies[3]


def test_builtin_words_and_auto_backend() -> None:
    assert len(WORDS) > 100 and all(len(w) == 5 for w in WORDS)
    env = WordleEnvironment()
    assert env.backend == ("textarena" if textarena_available() else "builtin")
    with pytest.raises(ValueError):
        WordleEnvironment(game_backend="nope")


def test_textarena_backend_without_corpora_says_how_to_install() -> None:
    if textarena_available():
        pytest.skip("textarena and its corpora are installed here")
    with pytest.raises(ImportError, match="telescope-envs\\[wordle\\]"):
        WordleEnvironment(game_backend="textarena")


def test_the_demonstration_is_a_well_formed_opening_guess_not_the_answer() -> None:
    env = WordleEnvironment(game_backend="builtin", max_samples=20)
    for sample in env.load_dataset():
        demonstration = env.demonstration(sample)
        assert demonstration is not None and demonstration.startswith("[") and demonstration.endswith("]")
        guess = demonstration[1:-1]
        assert guess in WORDS and guess != sample.answer and len(guess) == len(sample.answer)
    assert env.demonstration(env.load_dataset()[0]) == env.demonstration(env.load_dataset()[0])  # deterministic
