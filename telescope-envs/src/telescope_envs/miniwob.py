"""MiniWoB++: web tasks in a real Chromium, acted on through tools, scored by each task's own reward.

The tasks are the HTML pages of the ``miniwob`` package (``pip install
'telescope-envs[browser]'``), served on loopback by a small HTTP server of this
environment's (one per process); each episode opens a fresh browser session
(:class:`telescope.api.browser.BrowserSession`, the ``local`` provider of
telescope-sandbox: headless Chromium through Playwright) allowed to load that server
only. An episode: the task page is loaded, seeded (``Math.seedrandom``) and started;
the prompt is the task's instruction (``core.getUtterance()``) and the page's snapshot
(visible text, and controls numbered ``[3] button "Submit"``); the model acts with the
tools ``click(ref)``, ``type(ref, text)``, ``press(key)`` and ``scroll(dy)`` in the
tool-call format of :class:`~telescope.api.tools.ToolEnvironment`, and each tool result is
the page's new snapshot. The episode ends when the task says it is done
(``WOB_DONE_GLOBAL``), when a reply calls no tool, or after ``max_actions``.

Browsers: the run's ``browser_provider`` (``local`` by default), or this environment's own
``browser_provider`` keyword argument, built with ``browser_provider_kwargs`` (for the local
provider ``num_browsers``, ``executable_path``). Each session gets ``action_timeout_s`` per
action and a JavaScript heap of ``js_heap_mb``. With ``screenshots`` the page's task area is
kept with the rollout as a PNG at the start and after every action
(:class:`~telescope.api.records.Attachment`; the run store writes them under ``media/``).

Reward (``reward``): ``raw``, the task's own raw reward (``WOB_RAW_REWARD_GLOBAL``: 1
solved, -1 failed, some tasks partial), 0 when the episode ended before the task did; or
``success``, 1 when the task's reward is positive, else 0. With ``raw`` a failed attempt
scores below no attempt, so a policy that fails more often than it succeeds learns to stop
acting (the tiny CPU example collapsed to 0 that way); ``success`` never prefers doing
nothing. Sample metrics: ``success``, ``raw_reward``, ``actions``, ``blocked_requests`` and,
with screenshots, ``screenshot_failures``.

Tasks: ``tasks`` (default: click-button, click-link, click-checkboxes, enter-text);
``episode_time_s`` replaces the task's own 10-second limit (a model thinks slower than a
person clicks); the samples are ``(task, seed)`` pairs, ``samples_per_task`` of each.

Failures: a browser that crashes ends the episode with its error (the rollout is errored
and counted, the run goes on); an action that fails in the page (no such element, a
timeout) is answered with the error, and the model may go on.

The prompt: a system message describing the tools (``tool_prompt``: ``schemas``, their
JSON schemas, for a model that reads them; ``brief``, one line of signatures; ``none``, for a
tiny model that learns the calls from the warm start's demonstrations), then the task and
the page. The prompt is rendered before the episode's state exists (the loop's order), so
:meth:`format_prompt` loads the seeded page in a session of its own, once per sample (the
seed fixes the page, so the text is kept), and every episode loads it again.

Warm start: :meth:`demonstration` is the scripted solution of the sample's task
(:mod:`telescope_envs.miniwob_scripts`), one reply with every call.
"""

from __future__ import annotations

import functools
import http.server
import json
import sys
import threading
import weakref
from pathlib import Path
from typing import Any, ClassVar, Literal

from telescope.api.browser import BrowserError, BrowserLimits, BrowserProvider, BrowserSession
from telescope.api.environment import RolloutState
from telescope.api.records import Attachment, Message, RewardResult, Sample
from telescope.api.tools import MALFORMED, ToolCall, ToolEnvironment
from telescope_envs._deps import require
from telescope_envs.miniwob_scripts import scripted_reply

DEFAULT_TASKS = ("click-button", "click-link", "click-checkboxes", "enter-text")

#: What the system message says of the tools (see the module docstring).
TOOL_PROMPTS = ("schemas", "brief", "none")

#: Keys ``press`` accepts (Playwright's names).
KEYS = ("Enter", "Tab", "Escape", "Backspace", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "Space")


def click(ref: int) -> str:
    """Click the element numbered ref in the page.

    Args:
        ref: the element's number, as the page listing shows it in brackets
    """
    raise NotImplementedError  # a schema only: the environment runs it on the episode's browser


def type_text(ref: int, text: str) -> str:
    """Click the element numbered ref and type text into it.

    Args:
        ref: the element's number, as the page listing shows it in brackets
        text: what to type
    """
    raise NotImplementedError


def press(key: str) -> str:
    """Press a key: Enter, Tab, Escape, Backspace, ArrowUp, ArrowDown, ArrowLeft, ArrowRight or Space.

    Args:
        key: the key's name
    """
    raise NotImplementedError


def scroll(dy: int) -> str:
    """Scroll the page by dy pixels (negative: up).

    Args:
        dy: pixels to scroll
    """
    raise NotImplementedError


def miniwob_folder() -> Path:
    """The installed ``miniwob`` package's folder (its ``html/`` holds the tasks)."""
    miniwob = require("miniwob", "telescope-envs[browser]", "the miniwob environment")
    return Path(str(miniwob.__file__)).parent


class _TaskServer:
    """The ``miniwob`` package's HTML folder on a loopback HTTP server (one per process, started on first use)."""

    _lock = threading.Lock()
    _instance: _TaskServer | None = None

    def __init__(self, root: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.httpd = _QuietServer(("127.0.0.1", 0), handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, name="miniwob-tasks", daemon=True).start()

    @classmethod
    def shared(cls) -> _TaskServer:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls(miniwob_folder() / "html")
            return cls._instance


class _QuietServer(http.server.ThreadingHTTPServer):
    """Counts the requests a browser dropped mid-answer instead of printing their tracebacks.

    An episode's context is closed as soon as it ends, often while its page is still
    loading a file: the connection is reset under the server's feet, which is expected.
    """

    daemon_threads = True
    dropped = 0

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            type(self).dropped += 1
            return
        super().handle_error(request, client_address)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class MiniWoBEnvironment(ToolEnvironment):
    """MiniWoB++ tasks in Chromium, one fresh browser session per episode (see the module docstring)."""

    name: ClassVar[str] = "miniwob"
    max_turns: ClassVar[int] = 16
    reward_min: ClassVar[float] = -1.0
    reward_max: ClassVar[float] = 1.0
    metrics_ranges: ClassVar[dict[str, dict[str, float]]] = {
        "success": {"min": 0.0, "max": 1.0},
        "raw_reward": {"min": -1.0, "max": 1.0},
        "actions": {"min": 0.0, "max": 16.0},
        "blocked_requests": {"min": 0.0, "max": 1000.0},
    }
    tools: ClassVar[list[Any]] = [click, type_text, press, scroll]
    uses_browser: ClassVar[bool] = True
    requires: ClassVar[dict[str, str]] = {"miniwob": "pip install 'telescope-envs[browser]'"}

    def __init__(
        self,
        tasks: list[str] | None = None,
        samples_per_task: int = 200,
        max_actions: int = 8,
        episode_time_s: float = 600.0,
        action_timeout_s: float = 10.0,
        js_heap_mb: int = 256,
        screenshots: bool = False,
        browser_provider: str | None = None,
        browser_provider_kwargs: dict[str, Any] | None = None,
        tool_prompt: Literal["schemas", "brief", "none"] = "schemas",
        reward: Literal["raw", "success"] = "raw",
    ) -> None:
        super().__init__()
        if reward not in ("raw", "success"):
            raise ValueError(f"miniwob reward must be 'raw' or 'success', got {reward!r}")
        if tool_prompt not in TOOL_PROMPTS:
            raise ValueError(f"miniwob tool_prompt must be one of {', '.join(TOOL_PROMPTS)}, got {tool_prompt!r}")
        chosen = list(tasks) if tasks is not None else list(DEFAULT_TASKS)
        if not chosen:
            raise ValueError("miniwob tasks is empty; name at least one task (e.g. click-button)")
        if not 1 <= max_actions <= self.max_turns:
            raise ValueError(f"miniwob max_actions must be between 1 and {self.max_turns}, got {max_actions}")
        self.tasks = chosen
        self.samples_per_task = samples_per_task
        self.max_actions = max_actions
        self.episode_time_s = episode_time_s
        self.action_timeout_s = action_timeout_s
        self.js_heap_mb = js_heap_mb
        self.screenshots = screenshots
        self.browser_provider = browser_provider
        self.browser_provider_kwargs = dict(browser_provider_kwargs or {})
        self.tool_prompt = tool_prompt
        self.reward = reward
        self._provider: BrowserProvider | None = None
        self._provider_lock = threading.Lock()
        self._pages: dict[str, str] = {}  # sample id -> the prompt's observation (seeded: always the same)

    # ------------------------------------------------------------ the data

    def load_dataset(self) -> list[Sample]:
        folder = miniwob_folder()
        unknown = [t for t in self.tasks if not (folder / "html" / "miniwob" / f"{t}.html").exists()]
        if unknown:
            raise ValueError(f"miniwob tasks {unknown} are not in the installed miniwob package ({folder / 'html'})")
        return [
            Sample(prompt=task, answer=seed, sample_id=f"miniwob-{task}-{seed}", environment=self.name)
            for task in self.tasks
            for seed in range(self.samples_per_task)
        ]

    def format_prompt(self, sample: Sample) -> list[Message]:
        """The tools (``tool_prompt``), then the task's instruction and the page of this sample's episode."""
        page = self._pages.get(sample.sample_id)
        if page is None:
            page = self._pages.setdefault(sample.sample_id, self._start(sample))
        system = self._tool_description()
        return [*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": page}]

    def _tool_description(self) -> str:
        if self.tool_prompt == "none":
            return ""
        how = 'Call a tool with <tool_call>{"name": NAME, "arguments": {...}}</tool_call>; a reply may hold several.'
        if self.tool_prompt == "brief":
            return f"Tools: click(ref), type_text(ref, text), press(key), scroll(dy). {how}"
        schemas = "\n".join(json.dumps(schema) for schema in self.tool_schemas)
        return f"You act on a web page with these tools:\n{schemas}\n{how}"

    # --------------------------------------------------------- the episode

    @property
    def provider_name(self) -> str:
        """The browser provider used: the ``browser_provider`` keyword, else the run's (its context)."""
        return self.browser_provider or self.context.browser_provider

    def _browser(self) -> BrowserProvider:
        with self._provider_lock:
            if self._provider is None:
                from telescope.plugins.facade import get_plugins

                provider_class = get_plugins().browser_provider(self.provider_name)
                self._provider = provider_class(**self.browser_provider_kwargs)
            return self._provider

    def _open(self, sample: Sample) -> tuple[BrowserSession, str]:
        server = _TaskServer.shared()
        limits = BrowserLimits(
            action_timeout_s=self.action_timeout_s, js_heap_mb=self.js_heap_mb, allowed_origins=(server.origin,)
        )
        session = self._browser().open(limits)
        try:
            session.goto(f"{server.origin}/miniwob/{sample.prompt}.html")
            session.evaluate(
                f"(() => {{ Math.seedrandom({int(sample.answer)}); core.EPISODE_MAX_TIME = "
                f"{int(self.episode_time_s * 1000)}; core.startEpisodeReal(); return WOB_TASK_READY; }})()"
            )
            utterance = str(session.evaluate("core.getUtterance()"))
        except BrowserError:
            session.close()
            raise
        return session, utterance

    def _start(self, sample: Sample) -> str:
        session, utterance = self._open(sample)
        try:
            return self._observation(utterance, session.snapshot("#wrap"))
        finally:
            session.close()

    @staticmethod
    def _observation(utterance: str, page: str) -> str:
        return f"Task: {utterance}\nPage:\n{page}"

    def observe(self, state: RolloutState) -> str:
        """The episode's task and its page as it is now (a new snapshot: the numbers the next actions take)."""
        return self._observation(state.data["utterance"], state.data["session"].snapshot("#wrap"))

    def demonstration(self, sample: Sample) -> str | None:
        """The scripted solution of the sample's task (:mod:`telescope_envs.miniwob_scripts`), for the warm start."""
        return scripted_reply(str(self.format_prompt(sample)[-1]["content"]))

    def initial_state(self, sample: Sample) -> RolloutState:
        state = super().initial_state(sample)
        session, utterance = self._open(sample)
        session.snapshot("#wrap")  # numbers the controls as the prompt (the same seeded page) shows them
        state.data.update(
            session=session, utterance=utterance, actions=0, done=False, raw_reward=0.0, screenshot_failures=0
        )
        weakref.finalize(state, session.close)  # an episode that errors or is cancelled still closes its browser
        self._keep_screenshot(state)
        return state

    def _keep_screenshot(self, state: RolloutState) -> None:
        """The task area as a PNG attachment of the rollout (when ``screenshots``); a failure is counted."""
        if not self.screenshots:
            return
        try:
            image = state.data["session"].screenshot("#wrap")
        except BrowserError:
            state.data["screenshot_failures"] += 1
            return
        state.attachments.append(Attachment(name="page", media_type="image/png", data=image, turn=state.turn))

    def call_action(self, call: ToolCall, state: RolloutState) -> tuple[bool, str]:
        """Run one tool call on the episode's page; returns (succeeded, the page's new snapshot or the error)."""
        session: BrowserSession = state.data["session"]
        if call.error:
            return False, f"Error: {call.error}"
        arguments = call.arguments
        try:
            if call.name == "click":
                session.click(int(arguments["ref"]))
            elif call.name == "type_text":
                session.type(int(arguments["ref"]), str(arguments["text"]))
            elif call.name == "press":
                if arguments.get("key") not in KEYS:
                    return False, f"Error: press takes one of {', '.join(KEYS)}"
                session.press(str(arguments["key"]))
            elif call.name == "scroll":
                session.scroll(int(arguments["dy"]))
            else:
                return False, f"Error: unknown tool {call.name!r}; available: click, type_text, press, scroll"
        except (KeyError, TypeError, ValueError) as exc:
            return False, f"Error: bad arguments for {call.name}: {exc}"
        except BrowserError as exc:
            if "crashed" in str(exc):
                raise  # the episode cannot go on: errored and counted
            return False, f"Error: {exc}"
        finally:
            state.data["actions"] += 1
        status = session.evaluate("({done: WOB_DONE_GLOBAL, raw: WOB_RAW_REWARD_GLOBAL})")
        self._keep_screenshot(state)
        if status["done"]:
            state.data.update(done=True, raw_reward=float(status["raw"]))
            return True, "The task is over."
        return True, self.observe(state)

    def env_response(self, messages: list[Message], state: RolloutState) -> list[Message]:
        replies: list[Message] = []
        log: list[tuple[str, bool]] = state.data.setdefault("tool_calls", [])
        for call in self._last_calls(messages):
            if state.data["done"]:
                break
            ok, text = self.call_action(call, state)
            log.append((call.name or MALFORMED, ok))
            replies.append({"role": self.tool_message_role, "content": text})
        return replies

    def is_done(self, messages: list[Message], state: RolloutState) -> bool:
        return (
            bool(state.data.get("done"))
            or state.data.get("actions", 0) >= self.max_actions
            or state.turn >= self.max_turns
            or not self._last_calls(messages)
        )

    def compute_reward(self, messages: list[Message], sample: Sample, state: RolloutState) -> RewardResult:
        session: BrowserSession | None = state.data.get("session")
        if session is not None and not state.data["done"]:  # the last reply's actions, not yet run
            for call in self._last_calls(messages)[: max(0, self.max_actions - state.data["actions"])]:
                self.call_action(call, state)
                if state.data["done"]:
                    break
        blocked = session.blocked_requests if session is not None else 0
        if session is not None:
            session.close()
        raw = float(state.data.get("raw_reward", 0.0)) if state.data.get("done") else 0.0
        return RewardResult(
            total_reward=raw if self.reward == "raw" else float(raw > 0),
            sample_metrics={
                "success": float(raw > 0),
                "raw_reward": raw,
                "actions": float(state.data.get("actions", 0)),
                "blocked_requests": float(blocked),
                **({"screenshot_failures": float(state.data["screenshot_failures"])} if self.screenshots else {}),
            },
        )

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its browsers (a copy in another process starts its own)."""
        state = dict(self.__dict__)
        state.update(_provider=None, _provider_lock=None, _pages={})
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._provider_lock = threading.Lock()

    def close(self) -> None:
        with self._provider_lock:
            if self._provider is not None:
                self._provider.close()
                self._provider = None
