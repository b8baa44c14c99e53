"""Wordle: a multi-turn guessing game; the environment answers each guess with feedback.

Each sample is a secret 5-letter word. The model guesses by writing a word in square
brackets (``[crane]``, the textarena convention); after every guess the environment
replies with one letter of feedback per position - ``G`` right letter, right place;
``Y`` in the word elsewhere; ``X`` not in the word (repeated letters are counted as
in the real game) - and how many guesses remain. The game ends when the word is
found or ``num_guesses`` are used. A malformed, wrong-length, repeated or (with a
dictionary) unknown word uses up a guess and is answered with the reason.

Reward (0..1): 1.0 when solved; otherwise half the best partial credit of a guess,
``0.5 * (greens + 0.5 * yellows) / length`` (textarena's completion measure), so
the signal is dense but never rivals a win. Sample metrics: ``solved``,
``guesses_used``, ``invalid_guesses``, ``best_partial``.

Game logic backends (``game_backend``): ``"textarena"`` validates guesses against
textarena's English dictionary (``pip install 'telescope-envs[wordle]'``; its NLTK
corpora must already be downloaded - nothing is fetched at run time); ``"builtin"``
accepts any alphabetic word of the right length; ``"auto"`` (default) uses
textarena when it and its corpora are available, else the builtin rules.

Demonstration (for the optional warm start): an opening guess in brackets, a list
word other than the secret.

Data: ``dataset_name="builtin"`` (default: the word list shipped here), or a
file/hub dataset with a ``word`` column. Everything about one game lives in its
``RolloutState``.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import Counter
from typing import Any, ClassVar

from telescope.api.environment import MultiTurnEnvironment, RolloutState
from telescope.api.records import Message, RewardResult, Sample
from telescope_envs._data import load_rows, stable_id, unique_ids
from telescope_envs._deps import require
from telescope_envs.wordle_words import WORDS

_GUESS_RE = re.compile(r"\[\s*([A-Za-z]+)\s*\]")
_dictionary_lock = threading.Lock()
_dictionary: Any = None


def feedback(guess: str, secret: str) -> str:
    """Per-letter feedback (``G``/``Y``/``X``), counting repeated letters like the real game."""
    guess, secret = guess.lower(), secret.lower()
    marks = ["X"] * len(guess)
    remaining: Counter[str] = Counter()
    for i, (g, s) in enumerate(zip(guess, secret, strict=True)):
        if g == s:
            marks[i] = "G"
        else:
            remaining[s] += 1
    for i, g in enumerate(guess):
        if marks[i] != "G" and remaining[g] > 0:
            marks[i] = "Y"
            remaining[g] -= 1
    return "".join(marks)


def partial_credit(marks: str) -> float:
    return (marks.count("G") + 0.5 * marks.count("Y")) / len(marks) if marks else 0.0


def textarena_available() -> bool:
    """Whether textarena and its NLTK corpora are installed (no download is attempted)."""
    try:
        import nltk  # textarena depends on it

        require("textarena", "wordle", "wordle")
        nltk.data.find("corpora/words")
        nltk.data.find("taggers/averaged_perceptron_tagger_eng")
        return True
    except Exception:
        return False


def _textarena_dictionary() -> Any:
    """textarena's English dictionary, built once per process (read-only afterwards)."""
    global _dictionary
    with _dictionary_lock:
        if _dictionary is None:
            require("textarena", "wordle", "wordle")
            from textarena.envs.utils.word_lists import EnglishDictionary

            _dictionary = EnglishDictionary(keep_proper_nouns=False, include_nltk=True)
        return _dictionary


class WordleEnvironment(MultiTurnEnvironment):
    """Guess the secret word in ``num_guesses`` tries, with G/Y/X feedback after each."""

    name: ClassVar[str] = "wordle"
    data_files: ClassVar[dict[str, tuple[str, ...]]] = {"dataset_name": ("word",)}
    max_turns: ClassVar[int] = 6
    metrics_ranges: ClassVar[dict[str, dict[str, float]]] = {
        "solved": {"min": 0.0, "max": 1.0},
        "guesses_used": {"min": 0.0, "max": 6.0},
        "invalid_guesses": {"min": 0.0, "max": 6.0},
        "best_partial": {"min": 0.0, "max": 1.0},
    }
    reward_min: ClassVar[float] = 0.0
    reward_max: ClassVar[float] = 1.0

    def __init__(
        self,
        dataset_name: str = "builtin",
        dataset_split: str = "train",
        num_guesses: int | None = None,
        game_backend: str = "auto",
        max_samples: int | None = None,
        max_turns: int | None = None,
    ) -> None:
        """``max_turns`` is the upstream's name of ``num_guesses`` (one guess per model turn); default 6."""
        if max_turns is not None and num_guesses is not None and max_turns != num_guesses:
            raise ValueError(f"wordle: max_turns ({max_turns}) and num_guesses ({num_guesses}) disagree; set one")
        num_guesses = num_guesses if num_guesses is not None else (max_turns if max_turns is not None else 6)
        if game_backend not in ("auto", "builtin", "textarena"):
            raise ValueError(f"wordle game_backend must be 'auto', 'builtin' or 'textarena', not {game_backend!r}")
        if not 1 <= num_guesses <= self.max_turns:
            raise ValueError(f"wordle num_guesses must be between 1 and {self.max_turns}, got {num_guesses}")
        if game_backend == "textarena" and not textarena_available():
            raise ImportError(
                "wordle game_backend='textarena' needs textarena and its NLTK corpora (words, "
                "averaged_perceptron_tagger_eng). Install with: pip install 'telescope-envs[wordle]' and "
                "python -m nltk.downloader words averaged_perceptron_tagger_eng"
            )
        self.dataset_name = dataset_name
        self.dataset_split = dataset_split
        self.num_guesses = num_guesses
        self.max_samples = max_samples
        self.backend = game_backend if game_backend != "auto" else ("textarena" if textarena_available() else "builtin")

    def load_dataset(self) -> list[Sample]:
        if self.dataset_name == "builtin":
            words = list(WORDS)
        else:
            rows = load_rows(self.dataset_name, self.dataset_split, fields=self.data_files["dataset_name"])
            words = [str(r["word"]).strip().lower() for r in rows]
        if self.max_samples is not None:
            words = words[: self.max_samples]
        ids = unique_ids([stable_id(self.name, w) for w in words])
        return [
            Sample(prompt=self.rules(len(w)), answer=w, sample_id=sid, environment=self.name)
            for sid, w in zip(ids, words, strict=True)
        ]

    def rules(self, length: int) -> str:
        return (
            f"You are playing Wordle. A secret {length}-letter English word has been chosen; "
            f"you have {self.num_guesses} guesses to find it. Write each guess in square brackets, "
            "for example [apple]. After each guess you get one letter of feedback per position: "
            "G = right letter in the right place, Y = the letter is in the word but elsewhere, "
            "X = the letter is not in the word. Make your first guess."
        )

    def demonstration(self, sample: Sample) -> str | None:
        """A well-formed opening guess for the warm start: a list word other than the secret, in brackets.

        It teaches the answer format, not the answer (the word is picked by a hash of the secret).
        """
        secret = str(sample.answer)
        candidates = [w for w in WORDS if len(w) == len(secret) and w != secret]
        if not candidates:
            return None
        digest = int(hashlib.sha256(secret.encode()).hexdigest()[:8], 16)
        return f"[{candidates[digest % len(candidates)]}]"

    # ------------------------------------------------------------------ game
    def _is_word(self, word: str) -> bool:
        if self.backend == "textarena":
            return bool(_textarena_dictionary().is_english_word(word))
        return word.isalpha()

    def _play_last(self, messages: list[Message], state: RolloutState) -> None:
        """Record the guess of the latest assistant message once (idempotent per turn)."""
        data = state.data
        if data.get("processed_turn") == state.turn:
            return
        data["processed_turn"] = state.turn
        history: list[tuple[str, str]] = data.setdefault("guesses", [])
        data.setdefault("invalid", 0)
        last = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
        secret = str(state.sample.answer)
        text = str(last.get("content", "")) if last else ""
        found = _GUESS_RE.findall(text)
        guess = found[-1].lower() if found else ""
        error = None
        if not guess:
            error = "No guess found: write your guess in square brackets, e.g. [apple]."
        elif len(guess) != len(secret):
            error = f"Your guess must have exactly {len(secret)} letters."
        elif guess in (g for g, _ in history):
            error = f"You already guessed [{guess}]; try another word."
        elif not self._is_word(guess):
            error = f"[{guess}] is not an English word."
        if error:
            data["invalid"] += 1
            data["last_message"] = error
            return
        marks = feedback(guess, secret)
        history.append((guess, marks))
        data["solved"] = marks == "G" * len(secret)
        data["last_message"] = f"[{guess}] -> {' '.join(marks)}"

    def is_done(self, messages: list[Message], state: RolloutState) -> bool:
        self._play_last(messages, state)
        return bool(state.data.get("solved")) or state.turn >= self.num_guesses

    def env_response(self, messages: list[Message], state: RolloutState) -> list[Message]:
        self._play_last(messages, state)
        left = self.num_guesses - state.turn
        return [{"role": "user", "content": f"{state.data['last_message']}\nYou have {left} guesses left."}]

    def compute_reward(self, messages: list[Message], sample: Sample, state: RolloutState) -> RewardResult:
        self._play_last(messages, state)
        history: list[tuple[str, str]] = state.data.get("guesses", [])
        solved = bool(state.data.get("solved"))
        best = max((partial_credit(m) for _, m in history), default=0.0)
        return RewardResult(
            total_reward=1.0 if solved else 0.5 * best,
            sample_metrics={
                "solved": float(solved),
                "guesses_used": float(min(state.turn, self.num_guesses)),
                "invalid_guesses": float(state.data.get("invalid", 0)),
                "best_partial": best,
            },
        )
