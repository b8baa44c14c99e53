"""Training progress in the terminal: a tqdm bar, or one plain line per step for log files.

:class:`StepProgress` shows ``step/number_of_steps``, the step's mean reward, samples/s
and tokens/s. It picks its form from the output stream:

- ``bar``: a tqdm bar, when the stream is a terminal (or ``force_bar=True``);
- ``lines``: one line per step (``step 3/300 | reward 0.512 | 12.3 samples/s | ...``), when
  the stream is not a terminal (a log file, CI), so logs get a readable record rather than
  carriage-return noise;
- ``off``: nothing (``enabled=False``).

Rates are per step: ``samples / step time`` and ``tokens / step time``, where the step time
is what the caller passes or, by default, the wall time since the previous update (the
first update measures from the creation of the progress object). ``TELESCOPE_PROGRESS``
(``bar``, ``lines`` or ``off``) overrides the choice, e.g. to force lines under a terminal
multiplexer that reports a TTY.

Limits: one progress display per process; other output written to the same stream while
the bar is shown goes through :meth:`StepProgress.write` to keep the bar intact.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Literal, TextIO

from tqdm import tqdm

ProgressMode = Literal["bar", "lines", "off"]
_MODES: tuple[str, ...] = ("bar", "lines", "off")


def choose_mode(stream: TextIO, *, enabled: bool = True, force_bar: bool = False) -> ProgressMode:
    """``off`` if disabled, else ``TELESCOPE_PROGRESS`` if set, else ``bar`` on a terminal and ``lines`` otherwise."""
    if not enabled:
        return "off"
    override = os.environ.get("TELESCOPE_PROGRESS", "").strip().lower()
    if override:
        if override not in _MODES:
            raise ValueError(f"TELESCOPE_PROGRESS={override!r} is not one of {', '.join(_MODES)}")
        return override  # type: ignore[return-value]
    if force_bar:
        return "bar"
    isatty = getattr(stream, "isatty", None)
    return "bar" if callable(isatty) and isatty() else "lines"


def format_rate(value: float) -> str:
    """A rate with a k/M suffix: ``950``, ``12.3k``, ``4.5M``."""
    if value >= 1e6:
        return f"{value / 1e6:.1f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def format_duration(seconds: float) -> str:
    """``H:MM:SS``."""
    whole = int(max(seconds, 0.0))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class StepProgress:
    """Per-step progress of a training run (see the module docstring).

    ``initial_step`` is the number of steps already done (a resumed run). Use it as a
    context manager or call :meth:`close`.
    """

    def __init__(
        self,
        number_of_steps: int,
        *,
        initial_step: int = 0,
        stream: TextIO | None = None,
        enabled: bool = True,
        force_bar: bool = False,
        description: str = "train",
    ) -> None:
        self.number_of_steps = number_of_steps
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.mode: ProgressMode = choose_mode(self.stream, enabled=enabled, force_bar=force_bar)
        self.description = description
        self.last_step = initial_step
        self._started = time.monotonic()
        self._last_update = self._started
        self._bar: tqdm[Any] | None = None
        if self.mode == "bar":
            self._bar = tqdm(
                total=number_of_steps,
                initial=initial_step,
                desc=description,
                unit="step",
                file=self.stream,
                dynamic_ncols=True,
                leave=True,
            )

    def update(
        self,
        step: int,
        *,
        num_samples: int = 0,
        num_tokens: int = 0,
        reward_mean: float | None = None,
        step_time_s: float | None = None,
    ) -> str:
        """Report that ``step`` (1-based count of finished steps) is done; returns the status text.

        ``num_samples`` and ``num_tokens`` are the rollouts and tokens of this step;
        ``step_time_s`` its duration (default: wall time since the previous update).
        """
        now = time.monotonic()
        elapsed = step_time_s if step_time_s is not None else now - self._last_update
        self._last_update = now
        samples_per_s = num_samples / elapsed if elapsed > 0 else 0.0
        tokens_per_s = num_tokens / elapsed if elapsed > 0 else 0.0
        parts = []
        if reward_mean is not None:
            parts.append(f"reward {reward_mean:.3f}")
        parts.append(f"{format_rate(samples_per_s)} samples/s")
        parts.append(f"{format_rate(tokens_per_s)} tokens/s")
        status = " | ".join(parts)
        if self._bar is not None:
            self._bar.set_postfix_str(status, refresh=False)
            self._bar.update(max(step - self.last_step, 0))
        elif self.mode == "lines":
            total_elapsed = format_duration(now - self._started)
            line = f"{self.description} step {step}/{self.number_of_steps} | {status} | elapsed {total_elapsed}"
            self.stream.write(line + "\n")
            self.stream.flush()
        self.last_step = max(self.last_step, step)
        return status

    def write(self, message: str) -> None:
        """Print a message without breaking the bar (plain write in the other modes)."""
        if self._bar is not None:
            self._bar.write(message, file=self.stream)
        elif self.mode == "lines":
            self.stream.write(message + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> StepProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
