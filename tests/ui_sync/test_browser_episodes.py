"""Browser episodes in the dashboard, in a real headless Chromium (the fixtures of test_browser.py).

A miniwob-like rollout (tests/ui_sync/conftest.py's ``write_browser_run``) shows as its
steps: the page the model saw first with its screenshot, each reply's actions, the page it
saw after them with theirs (the images loaded from the run's media/ folder); the timeline
has a browser lane, after the sandboxes, with a row per session.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.ui_sync.conftest import SESSIONS, write_browser_run
from tests.ui_sync.test_browser import browser, page, pytestmark, select, shot  # noqa: F401  (fixtures, marks)

from telescope_ui_sync.sync.syncer import run_id_for


def test_a_browser_episode_shows_its_steps_and_the_pages_it_saw(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    run = write_browser_run(tmp_path / "runs" / "web")
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    page.goto(f"{served.url}/#/rollouts?step=0")
    steps = page.get_by_test_id("episode-steps")
    steps.filter(has_text="Steps: 2 replies, 2 actions, 2 screenshots").wait_for()
    turns = steps.locator(".episode-turn")
    assert turns.count() == 3
    first, second, last = turns.nth(0), turns.nth(1), turns.nth(2)
    # turn 0: the prompt's page (not the system message), no reply before it
    assert "FIRST-PAGE" in first.locator(".observation-text").inner_text()
    assert first.locator(".episode-reply").count() == 0 and "Tools:" not in first.inner_text()
    # turn 1: the reply's text and action, then the page it led to
    assert "OK-REPLY" in second.locator(".episode-reply").inner_text()
    assert second.locator(".action").inner_text() == "click(ref=1)"
    assert "SECOND-PAGE" in second.locator(".observation-text").inner_text()
    assert last.locator(".action").inner_text() == 'type_text(ref=3, text="ada")'
    assert last.locator(".observation-text").inner_text() == "The task is over."
    assert last.locator(".shot").count() == 0
    # the screenshots, each with the observation of its turn, loaded from the media route
    for turn, width in ((first, 32), (second, 48)):
        image = turn.locator(".episode-observation .shot img")
        assert image.get_attribute("loading") == "lazy"
        assert image.get_attribute("src").startswith("/api/rollouts/media?")
        image.scroll_into_view_if_needed()
        image.evaluate("img => img.decode()")  # rejects when the image cannot be loaded
        assert image.evaluate("img => img.complete && img.naturalWidth") == width
        turn.locator(".observation-text").first.wait_for(state="visible")
    kv = page.locator(".sample-kv").inner_text()  # the environment's sample metrics, as for any rollout
    assert all(name in kv for name in ("success", "actions", "blocked_requests", "screenshot_failures"))
    shot(page, "browser-episode")
    page.locator(".sample-dot").nth(1).click()  # a rollout without tool calls: no steps view
    page.locator(".pane .sample-head").filter(has_text="Group 1").wait_for()
    assert steps.count() == 0
    assert page.errors == []


def test_the_timeline_has_a_browser_lane_with_a_row_per_session(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    run = write_browser_run(tmp_path / "runs" / "web")
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    page.goto(f"{served.url}/#/timeline")
    canvas = page.get_by_test_id("timeline-canvas")
    page.wait_for_function(
        "() => (document.querySelector(\"[data-testid='timeline-canvas']\")?.dataset.lanes || '').includes('browser')"
    )
    lanes = {lane["id"]: lane for lane in json.loads(canvas.get_attribute("data-lanes"))}
    assert list(lanes) == ["trainer|steps", "sandbox|sandbox_id sb-1", "browser|main", "weights|main"]
    # session b runs inside a's span: a row each (a row per overlapping action would be one row)
    assert lanes["browser|main"]["rows"] == 2
    swatch = page.locator(".legend-item[data-kind='browser.click'] .swatch")
    assert swatch.evaluate("e => e.style.background") == "rgb(5, 150, 105)"  # the browser's fixed colours
    # a click on session a's click (row 0): its detail names the session and its actions in order
    box = canvas.bounding_box()
    session, actions = SESSIONS[0]
    _, at, duration = next(action for action in actions if action[0] == "click")
    x = 170 + (at + duration / 2) / 7.0 * (box["width"] - 170)  # the window: the run's 7 s
    canvas.click(position={"x": x, "y": lanes["browser|main"]["top"] + 4})
    page.locator(".event-detail h3").filter(has_text="browser.click").wait_for()
    names = " → ".join(kind for kind, _, _ in actions)
    assert page.locator(".event-session").inner_text() == f"{session}: 4 events in view ({names})"
    shot(page, "browser-timeline")
    assert page.errors == []
