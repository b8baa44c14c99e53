"""MiniWoB++ in a real Chromium: the tasks' pages, the tools, and each task's own reward.

A scripted policy reads the prompt (the task's instruction and the numbered page) and
answers with tool calls, as a model would; the reward comes from the task's JavaScript.
Skips without Chromium, Playwright or the miniwob package.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from telescope.api.records import Message, RewardResult, Sample
from telescope.testing.environment import GARBAGE_COMPLETIONS, EnvironmentConformance

pytest.importorskip("playwright", reason="pip install playwright")
pytest.importorskip("miniwob", reason="pip install 'telescope-envs[browser]'")
CHROMIUM = os.environ.get("TELESCOPE_CHROMIUM", "/usr/bin/chromium")
pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium is not installed (apt-get install chromium)"),
    pytest.mark.timeout(300),
]

from telescope_envs.miniwob import MiniWoBEnvironment  # noqa: E402 (after the skips)
from telescope_envs.miniwob_scripts import call, scripted_reply  # noqa: E402


@pytest.fixture(scope="module")
def env() -> Iterator[MiniWoBEnvironment]:
    instance = MiniWoBEnvironment(samples_per_task=4)
    yield instance
    instance.close()


def solve(prompt: str) -> str:
    """The scripted solution (the warm start's demonstration), which must exist for the default tasks."""
    reply = scripted_reply(prompt)
    assert reply is not None, f"no script for {prompt}"
    return reply


def play(env: MiniWoBEnvironment, sample: Sample, replies: list[str]) -> RewardResult:
    messages, state, _ = env.play_replies(sample, replies)
    return env.compute_reward(messages, sample, state)


def test_the_samples_are_tasks_with_seeds_and_an_unknown_task_is_refused() -> None:
    env = MiniWoBEnvironment(tasks=["click-button"], samples_per_task=3)
    assert [(s.prompt, s.answer) for s in env.load_dataset()] == [("click-button", i) for i in range(3)]
    with pytest.raises(ValueError, match="not in the installed miniwob package"):
        MiniWoBEnvironment(tasks=["click-nothing-at-all"]).load_dataset()


def test_the_prompt_is_the_instruction_and_the_numbered_page(env: MiniWoBEnvironment) -> None:
    sample = next(s for s in env.load_dataset() if s.prompt == "click-checkboxes")
    prompt = str(env.format_prompt(sample)[-1]["content"])
    assert prompt.startswith("Task: Select") and "\nPage:\n" in prompt
    assert re.search(r'^\[\d+\] checkbox "', prompt, re.M) and '] button "Submit"' in prompt
    assert "Last reward" not in prompt  # the task area only, not MiniWoB's score display
    assert env.format_prompt(sample) == env.format_prompt(sample)  # seeded: the same page every time
    fresh = MiniWoBEnvironment(tasks=["click-checkboxes"], samples_per_task=4, tool_prompt="none")
    try:
        (user,) = fresh.format_prompt(sample)  # no tool description: the user message alone, the same page
        assert user == env.format_prompt(sample)[-1] and user["role"] == "user"
    finally:
        fresh.close()


def test_the_tools_are_described_as_schemas_a_line_or_not_at_all() -> None:
    sample = Sample(prompt="click-button", answer=0, sample_id="miniwob-click-button-0")
    described = {}
    for mode in ("schemas", "brief"):
        env = MiniWoBEnvironment(tasks=["click-button"], samples_per_task=1, tool_prompt=mode)
        env._pages[sample.sample_id] = 'Task: t\nPage:\n[0] button "ok"'  # no browser needed for the system part
        system, user = env.format_prompt(sample)
        assert system["role"] == "system" and "<tool_call>" in system["content"] and user["role"] == "user"
        described[mode] = system["content"]
    assert all(f'"name": "{tool}"' in described["schemas"] for tool in ("click", "type_text", "press", "scroll"))
    assert described["brief"].startswith("Tools: click(ref), type_text(ref, text)")
    with pytest.raises(ValueError, match="tool_prompt must be one of schemas, brief, none"):
        MiniWoBEnvironment(tool_prompt="json")


@pytest.mark.parametrize("task", ["click-button", "click-link", "click-checkboxes", "enter-text"])
def test_the_right_actions_solve_each_task_and_the_reward_is_the_tasks_own(env: MiniWoBEnvironment, task: str) -> None:
    for sample in [s for s in env.load_dataset() if s.prompt == task][:1]:
        prompt = str(env.format_prompt(sample)[-1]["content"])
        result = play(env, sample, [solve(prompt)])
        assert result.total_reward > 0.5 and result.sample_metrics["success"] == 1.0, (prompt, result)
        assert result.sample_metrics["blocked_requests"] == 0


def test_a_wrong_action_fails_the_task_and_no_action_scores_zero(env: MiniWoBEnvironment) -> None:
    sample = next(s for s in env.load_dataset() if s.prompt == "click-button")
    task, page = str(env.format_prompt(sample)[-1]["content"]).split("\nPage:\n")
    asked = re.search(r'Click on the "(.+?)" button', task)
    assert asked is not None
    other = next(line for line in page.splitlines() if "] button " in line and f'"{asked.group(1)}"' not in line)
    wrong = play(env, sample, [call("click", ref=int(other[1 : other.index("]")]))])
    assert wrong.total_reward == -1.0 and wrong.sample_metrics["success"] == 0.0
    idle = play(env, sample, ["I am not sure what to do."])
    assert idle.total_reward == 0.0 and idle.sample_metrics["actions"] == 0.0
    # reward "success": a failed attempt scores as no attempt (0), never below it; the raw reward stays a metric
    scored = MiniWoBEnvironment(tasks=["click-button"], samples_per_task=4, reward="success")
    try:
        wrong_click = [call("click", ref=int(other[1 : other.index("]")]))]
        messages, state, _ = scored.play_replies(sample, wrong_click)
        failed = scored.compute_reward(messages, sample, state)
    finally:
        scored.close()
    assert failed.total_reward == 0.0 and failed.sample_metrics["raw_reward"] == -1.0


def test_bad_tool_calls_are_answered_with_errors_not_raised(env: MiniWoBEnvironment) -> None:
    sample = next(s for s in env.load_dataset() if s.prompt == "click-button")
    messages: list[Message] = env.format_prompt(sample)
    state = env.initial_state(sample)
    messages.append({"role": "assistant", "content": call("click", ref=999) + call("press", key="F13") + call("fly")})
    state.turn += 1
    assert not env.is_done(messages, state)
    replies = [str(m["content"]) for m in env.env_response(messages, state)]
    assert replies[0] == "Error: no element numbered 999 in the last snapshot" and "press takes one of" in replies[1]
    assert "unknown tool 'fly'" in replies[2]
    assert env.compute_reward(messages, sample, state).total_reward == 0.0


class TestMiniWoBConformance(EnvironmentConformance):
    samples_checked = 1
    garbage = GARBAGE_COMPLETIONS[:4]

    def environment_factory(self) -> MiniWoBEnvironment:
        return MiniWoBEnvironment(tasks=["enter-text"], samples_per_task=2)

    def right_replies(self, sample: Sample) -> list[str] | None:
        environment = MiniWoBEnvironment(tasks=[str(sample.prompt)], samples_per_task=1)
        try:
            return [solve(str(environment.format_prompt(sample)[-1]["content"]))]
        finally:
            environment.close()


def test_with_screenshots_the_page_is_kept_with_the_rollout_at_the_start_and_after_each_action() -> None:
    env = MiniWoBEnvironment(tasks=["click-checkboxes"], samples_per_task=1, screenshots=True)
    try:
        (sample,) = env.load_dataset()
        reply = solve(str(env.format_prompt(sample)[-1]["content"]))
        messages, state, _ = env.play_replies(sample, [reply])
        result = env.compute_reward(messages, sample, state)
    finally:
        env.close()
    assert result.sample_metrics["success"] == 1.0 and result.sample_metrics["screenshot_failures"] == 0.0
    actions = int(result.sample_metrics["actions"])
    assert [a.turn for a in state.attachments] == [0] + [1] * actions  # the start, then one per action of reply 1
    assert all(a.media_type == "image/png" and a.data.startswith(b"\x89PNG") for a in state.attachments)
    assert len({a.data for a in state.attachments}) > 1  # the page changed as the boxes were ticked


def test_the_browser_provider_is_the_runs_unless_the_environment_names_its_own() -> None:
    from telescope.api.context import EnvironmentContext
    from telescope.api.environment import bind_context
    from telescope.plugins.registry import UnknownPluginError

    env = MiniWoBEnvironment(tasks=["click-button"], samples_per_task=1)
    assert env.provider_name == "local"
    bind_context(env, EnvironmentContext(browser_provider="cloud"))
    assert env.provider_name == "cloud"
    with pytest.raises(UnknownPluginError, match="unknown browser provider 'cloud'"):
        env.format_prompt(env.load_dataset()[0])
    own = MiniWoBEnvironment(tasks=["click-button"], samples_per_task=1, browser_provider="local")
    assert bind_context(own, EnvironmentContext(browser_provider="cloud")).provider_name == "local"
    # the provider is built with the environment's browser_provider_kwargs
    bad = MiniWoBEnvironment(tasks=["click-button"], samples_per_task=1, browser_provider_kwargs={"num_browsers": 0})
    with pytest.raises(ValueError, match="num_browsers must be at least 1"):
        bad.format_prompt(bad.load_dataset()[0])


def test_a_request_the_browser_drops_is_counted_not_printed(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    import functools
    import socket
    import struct
    import threading
    import time

    from telescope_envs.miniwob import _QuietHandler, _QuietServer

    server = _QuietServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    before = _QuietServer.dropped
    try:
        with socket.create_connection(server.server_address[:2]) as sock:
            sock.sendall(b"GET /x.html HTTP/1.1\r\nHost: a")  # half a request, then a reset (as a closed context)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        deadline = time.monotonic() + 10
        while _QuietServer.dropped == before and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.shutdown()
        server.server_close()
    assert _QuietServer.dropped == before + 1
    assert "Traceback" not in capfd.readouterr().err
