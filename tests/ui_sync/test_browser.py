"""The dashboard in a real headless Chromium (Debian's, driven by Playwright), on a real run.

Every page shows the real run's data; a step appended while a page is open shows (how soon
is not asserted: these tests share the machine); two runs are compared on one chart; a
completion holding ``<script>`` is shown as text and never runs; a run deleted while open is
reported and the server stays up.
Screenshots are taken on every run; they replace docs/images/ (shown in the package README, the
overview also in the root README) only with ``TELESCOPE_UPDATE_SCREENSHOTS=1``, so that a test run
leaves the checkout as it was. Otherwise they go to a folder under the system's temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from tests.ui_sync.conftest import REPO, write_run

from telescope.recording.run_store import RunStore
from telescope_ui_sync.sync.syncer import run_id_for

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("TELESCOPE_CHROMIUM", "/usr/bin/chromium")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Chromium (./dev setup --all installs Debian's)"),
]
#: How long a test waits for an element before it fails naming it (tests/ui_sync/conftest.py's
#: report hook adds the page's state): generous for a busy machine, far below pytest's timeout.
ELEMENT_TIMEOUT_MS = 60_000
IMAGES = (
    REPO / "docs" / "images"
    if os.environ.get("TELESCOPE_UPDATE_SCREENSHOTS") == "1"
    else Path(tempfile.gettempdir()) / "telescope-ui-screenshots"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with playwright.sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield instance
        instance.close()


@pytest.fixture
def page(browser):  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(ELEMENT_TIMEOUT_MS)
    tab.errors = []  # type: ignore[attr-defined]
    tab.on("pageerror", lambda error: tab.errors.append(str(error)))  # type: ignore[attr-defined]
    yield tab
    context.close()


def shot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMAGES / f"ui-{name}.png"))


def select(page, url: str, run_ids: list[str]) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{url}/")
    page.evaluate(f"localStorage.setItem('telescope-ui:selected', {json.dumps(json.dumps(run_ids))})")
    page.reload()  # the app reads the selection when it starts


def test_every_page_shows_the_real_run(page, serve, real_runs: Path) -> None:  # type: ignore[no-untyped-def]
    served = serve([real_runs])
    rid = run_id_for(real_runs / "countdown-tiny")
    select(page, served.url, [rid])

    page.goto(f"{served.url}/#/overview")
    page.get_by_test_id("step-count").filter(has_text="step 3 / 3").wait_for()
    page.locator(".chart canvas").first.wait_for()
    page.locator(".config-yaml").wait_for(state="attached")
    shot(page, "overview")
    page.locator(".code-file[data-path='README.md']").click()  # the run's code snapshot
    page.get_by_test_id("code-view").filter(has_text="# Telescope").wait_for()
    shot(page, "code")

    page.goto(f"{served.url}/#/metrics")
    for section in (
        "General",
        "Reward",
        "Sample Metrics",
        "Advantage",
        "Evals",
        "Rollouts",
        "Discarded Rollouts",
        "Timeline",
    ):
        page.locator(f"details[data-section='{section}']").wait_for()
    page.locator("[data-metric='reward/mean'] canvas").wait_for()
    shot(page, "metrics")

    page.goto(f"{served.url}/#/rollouts")
    page.locator(".sample-dot").first.wait_for()
    # one step's groups: the quick start's prompts per step, as the real run used them
    shipped = yaml.safe_load((REPO / "configs/examples/countdown_tiny.yaml").read_text())
    assert page.locator(".group").count() == shipped["prompts_batch_size_for_trainer"]
    page.locator(".sample-dot").nth(3).click()
    page.locator(".pane .sample-head").filter(has_text="Sample 3").wait_for()
    page.locator(".search-input").fill("answer")
    page.locator(".search-hit").first.wait_for()
    shot(page, "rollouts")
    page.get_by_role("button", name="Side by side").click()
    page.locator(".sample-dot").nth(1).click()
    page.locator(".sample-dot").nth(2).click()
    page.locator(".panes.two .pane .sample-head").filter(has_text="Sample 1").wait_for()
    page.locator(".panes.two .pane .sample-head").filter(has_text="Sample 2").wait_for()
    shot(page, "side-by-side")

    page.goto(f"{served.url}/#/discarded")
    page.locator(".rollouts.discarded [data-metric='discarded/count'] canvas").wait_for()

    page.goto(f"{served.url}/#/timeline")
    page.locator(".timeline .muted").filter(has_text="3 steps").wait_for()
    canvas = page.get_by_test_id("timeline-canvas")
    box = canvas.bounding_box()
    # a step somewhere in the steps lane (the first row): the run's events may start well
    # before the first step (warm start, evals), so sweep the lane rather than guess an x
    step_detail = page.locator(".event-detail h3").filter(has_text="trainer step")
    for x in range(60, int(box["width"]) - 10, 15):
        canvas.click(position={"x": x, "y": 36})
        if step_detail.count():
            break
    step_detail.wait_for()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 36)
    page.mouse.wheel(0, -600)  # zoom in
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2 + 150, box["y"] + 36)
    page.mouse.up()
    shot(page, "timeline")

    page.goto(f"{served.url}/#/evals")
    page.locator(".eval-table tbody tr").nth(1).wait_for()
    shot(page, "evals")

    page.goto(f"{served.url}/#/logs")
    page.locator(".log-line").first.wait_for()
    page.locator("input[data-level='INFO']").uncheck()
    page.locator(".log-search").fill("no such line anywhere")
    page.get_by_text("No log lines match.").wait_for()
    shot(page, "logs")

    page.goto(f"{served.url}/#/infra")
    page.locator(".page.infra").wait_for()
    page.goto(f"{served.url}/#/sandboxes")
    page.locator(".page.sandboxes").wait_for()
    assert page.errors == []


def test_a_new_step_shows_while_the_page_is_open(page, serve, real_runs: Path) -> None:  # type: ignore[no-untyped-def]
    served = serve([real_runs])
    run = real_runs / "countdown-tiny"
    rid = run_id_for(run)
    select(page, served.url, [rid])
    page.goto(f"{served.url}/#/overview")
    page.get_by_test_id("step-count").filter(has_text="step 3 / 3").wait_for()
    store = RunStore(run)
    store.log_metrics(3, {"reward/mean": 0.9})
    store.set_status("running", step=4)
    page.get_by_test_id("step-count").filter(has_text="step 4 / 3").wait_for()
    store.close()


def test_two_runs_on_one_chart(page, serve, real_runs: Path) -> None:  # type: ignore[no-untyped-def]
    shutil.copytree(real_runs / "countdown-tiny", real_runs / "countdown-tiny-2")
    served = serve([real_runs])
    ids = [run_id_for(real_runs / "countdown-tiny"), run_id_for(real_runs / "countdown-tiny-2")]
    select(page, served.url, ids)
    page.goto(f"{served.url}/#/metrics")
    page.locator(".metric-filter").fill("reward/mean")
    chart = page.locator("[data-metric='reward/mean']")
    chart.locator("canvas").wait_for()
    legend = chart.locator(".u-legend .u-series")
    legend.nth(2).wait_for()
    assert legend.count() == 3  # x, and one series per run
    assert "countdown-tiny-2" in chart.locator(".u-legend").inner_text()
    shot(page, "compare")
    page.locator(".metric-filter").fill("")
    page.goto(f"{served.url}/#/overview")
    page.locator(".diff-table").wait_for()
    page.locator(".code-diff-toggle").check()  # the two snapshots are copies: nothing differs
    page.locator(".code-diff-summary").filter(has_text="0 files differ").wait_for()


def test_a_selection_stored_while_the_run_list_loads_is_kept(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """What made the two-run chart show one run: the app saved its default selection (the
    newest run) when its first run list arrived, over a selection stored meanwhile (by the
    test, or another tab). Here the run list is held until the selection is stored."""
    ids = [run_id_for(write_run(tmp_path / "runs" / name, steps=2)) for name in ("a", "b")]
    served = serve([tmp_path / "runs"])
    held: list[object] = []

    def hold(route: object) -> None:  # the first run list waits; later ones go through
        if held:
            route.continue_()  # type: ignore[attr-defined]
        else:
            held.append(route)

    page.route("**/api/runs", hold)
    page.goto(f"{served.url}/")
    page.evaluate(f"localStorage.setItem('telescope-ui:selected', {json.dumps(json.dumps(ids))})")
    while not held:
        page.wait_for_timeout(20)
    held[0].continue_()  # type: ignore[attr-defined]
    page.locator(".run-item.selected").wait_for()  # the app got the run list (and shows the newest run)...
    assert json.loads(page.evaluate("localStorage.getItem('telescope-ui:selected')")) == ids  # ...and kept the pick
    page.reload()
    page.goto(f"{served.url}/#/metrics")
    page.locator(".metric-filter").fill("grad_norm")
    page.locator("[data-metric='grad_norm'] .u-legend .u-series").nth(2).wait_for()


def test_metrics_filtered_by_environment(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.ui_sync.test_api import write_two_environment_run

    run = write_two_environment_run(tmp_path / "runs" / "envs")
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    page.evaluate("localStorage.removeItem('telescope-ui:metrics-settings')")
    page.goto(f"{served.url}/#/metrics")
    reward = page.locator("[data-metric='reward/mean']")
    reward.locator("canvas").wait_for()
    page.locator("details[data-filter='env'] summary").click()
    with page.expect_response(lambda r: "env=a" in r.url and "names=reward%2Fmean" in r.url) as answer:
        page.locator("details[data-filter='env'] input[data-value='a']").check()
    by_name = {s["name"]: s for s in answer.value.json()["series"]}  # the Reward section's charts
    assert by_name["reward/mean"]["y"] == [1.0, 1.0, 1.0] and by_name["reward/mean"]["filtered"] is True
    page.locator(".filter-badge").filter(has_text="env: a").wait_for()
    page.locator("[data-metric='reward/mean'][data-filtered='yes']").wait_for()
    page.locator("[data-metric='grad_norm'][data-filtered='no'] .chart-title.unfiltered").wait_for()
    shot(page, "metrics-filtered")
    page.locator(".filter-badge button").click()  # removing the badge removes the filter
    page.locator("[data-metric='reward/mean'][data-filtered='']").wait_for()
    assert page.errors == []


def test_a_script_in_a_completion_is_text(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    payload = "<script>window.__pwned = 1</script><img src=x onerror='window.__pwned = 2'> $x^2$"
    run = write_run(tmp_path / "runs" / "evil", steps=1, completion=payload)
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    for mode in ("markdown", "raw"):
        page.evaluate(f"localStorage.setItem('telescope-ui:rollouts-render', '\"{mode}\"')")
        page.goto(f"{served.url}/#/rollouts?step=0")
        page.reload()
        page.locator(".completion").filter(has_text="<script>").wait_for()
        assert page.evaluate("window.__pwned") is None
        assert page.locator(".completion script, .completion img").count() == 0
    page.locator(".search-input").fill("<script>")
    page.locator(".search-hit").first.wait_for()
    assert page.evaluate("window.__pwned") is None
    assert page.errors == []


def test_a_run_deleted_while_open_is_reported(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import httpx

    run = write_run(tmp_path / "runs" / "doomed", steps=2)
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    page.goto(f"{served.url}/#/rollouts")
    page.locator(".sample-dot").first.wait_for()
    shutil.rmtree(run)
    page.locator(".banner.warning").filter(has_text="was deleted").wait_for(timeout=5000)
    page.locator(".sample-dot").first.wait_for()  # what was synced is still shown
    assert httpx.get(f"{served.url}/api/health").json()["ok"] is True
    assert (
        httpx.get(f"{served.url}/api/files/{run_id_for(run)}", params={"path": "logs/orchestrator.log"}).status_code
        == 410
    )
