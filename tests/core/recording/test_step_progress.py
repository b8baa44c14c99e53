"""The terminal progress display: bar on a TTY, plain lines otherwise, nothing when off."""

from __future__ import annotations

import io

import pytest

from telescope.recording.progress import StepProgress, choose_mode, format_duration, format_rate


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TELESCOPE_PROGRESS", raising=False)


def test_mode_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    assert choose_mode(io.StringIO()) == "lines"
    assert choose_mode(FakeTerminal()) == "bar"
    assert choose_mode(io.StringIO(), force_bar=True) == "bar"
    assert choose_mode(FakeTerminal(), enabled=False) == "off"
    monkeypatch.setenv("TELESCOPE_PROGRESS", "lines")
    assert choose_mode(FakeTerminal()) == "lines"
    monkeypatch.setenv("TELESCOPE_PROGRESS", "fancy")
    with pytest.raises(ValueError, match="TELESCOPE_PROGRESS"):
        choose_mode(FakeTerminal())


def test_formatting() -> None:
    assert format_rate(12.34) == "12.3"
    assert format_rate(950) == "950"
    assert format_rate(12_345) == "12.3k"
    assert format_rate(4_500_000) == "4.5M"
    assert format_duration(3725) == "1:02:05"


def test_plain_lines_for_logs() -> None:
    stream = io.StringIO()
    with StepProgress(300, stream=stream) as progress:
        assert progress.mode == "lines"
        # 32 samples and 12,800 tokens in 2 s: 16 samples/s, 6.4k tokens/s
        status = progress.update(3, num_samples=32, num_tokens=12_800, reward_mean=0.51234, step_time_s=2.0)
        progress.write("eval done")
    assert status == "reward 0.512 | 16.0 samples/s | 6.4k tokens/s"
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("train step 3/300 | reward 0.512 | 16.0 samples/s | 6.4k tokens/s | elapsed 0:00:")
    assert lines[1] == "eval done"


def test_bar_on_a_terminal() -> None:
    stream = FakeTerminal()
    progress = StepProgress(10, initial_step=2, stream=stream)
    assert progress.mode == "bar"
    progress.update(3, num_samples=8, num_tokens=1000, reward_mean=0.25, step_time_s=0.5)
    progress.update(4, num_samples=8, num_tokens=1000, step_time_s=0.5)
    progress.close()
    output = stream.getvalue()
    assert "4/10" in output
    assert "16.0 samples/s" in output and "2.0k tokens/s" in output


def test_off_writes_nothing() -> None:
    stream = FakeTerminal()
    progress = StepProgress(10, stream=stream, enabled=False)
    progress.update(1, num_samples=1, num_tokens=1, step_time_s=1.0)
    progress.write("x")
    progress.close()
    assert stream.getvalue() == ""
