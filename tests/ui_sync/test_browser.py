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
import time
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


LATEX = {  # what Markdown mangled when it ran before the math was taken out
    "matrix": r"\begin{pmatrix} a & b \\ c & d \end{pmatrix}",
    "thin space": r"a\,b",
    "braces": r"\{ x \mid x > 0 \}",
    "stars": r"a*b*c",
}


def write_dashboard_run(run_dir: Path, steps: int = 20) -> Path:
    """A run for the dashboard's drawing: small and large metric values, a completion full of
    LaTeX, 64 overlapping requests on one server and 25 event kinds."""
    now = time.time()
    store = RunStore(run_dir)
    store.write_config("number_of_steps: 40\n", {"number_of_steps": 40})
    store.set_status("running", step=0)
    for step in range(steps):
        store.log_metrics(
            step, {"reward/mean": 0.1 * step, "grad_norm": 2e-4, "timing_step_total": 12345.6789 + step * 1e-4}
        )
    completion = " and ".join(f"${tex}$" for tex in LATEX.values()) + " — `$not math$`"
    store.log_rollouts(
        0, [{"group_index": 0, "rollout_index": 0, "prompt": "p", "completion": completion, "reward": 1.0}]
    )
    for i in range(64):  # concurrent requests of server 0
        store.log_event(
            {
                "kind": "inference.request",
                "start": now - 60 + i * 0.01,
                "duration_s": 5.0,
                "component": "inference",
                "server": 0,
            }
        )
    for i in range(25):
        store.log_event({"kind": f"misc.kind{i:02d}", "start": now - 50 + i, "duration_s": 0.5, "component": "misc"})
    store.set_status("running", step=steps)
    store.close()
    return run_dir


def test_a_drag_zoom_stays_through_refreshes_and_is_not_a_click(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = write_dashboard_run(tmp_path / "runs" / "draw")
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    for where, metric in (("overview", "reward/mean"), ("metrics", "grad_norm")):
        page.goto(f"{served.url}/#/{where}")
        if where == "metrics":
            page.locator(".metric-filter").fill(metric)
        chart = page.locator(f".page.{where} [data-metric='{metric}']")
        over = chart.locator(".u-over")
        over.wait_for()
        page.wait_for_timeout(300)
        full = [float(v) for v in chart.get_attribute("data-x-range").split(",")]
        box = over.bounding_box()
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + box["width"] * 0.3, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)
        page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=5)
        page.mouse.up()
        page.wait_for_timeout(2500)  # two refreshes (every second) brought the data again
        assert page.url.endswith(f"#/{where}"), f"a drag on {where} was taken for a click: {page.url}"
        assert chart.get_attribute("data-zoomed") == "yes", where
        low, high = (float(v) for v in chart.get_attribute("data-x-range").split(","))
        assert full[0] < low < high < full[1] and high - low < (full[1] - full[0]) / 2, (where, full, low, high)
        shot(page, f"zoom-{where}")
        page.mouse.dblclick(box["x"] + box["width"] / 2, y)  # back to the whole data
        page.wait_for_timeout(1500)
        assert page.url.endswith(f"#/{where}"), f"a double click on {where} was taken for a click: {page.url}"
        assert chart.get_attribute("data-zoomed") == ""
        assert [float(v) for v in chart.get_attribute("data-x-range").split(",")] == full
    assert page.errors == []


def test_small_values_in_legends_and_wide_axis_labels(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = write_dashboard_run(tmp_path / "runs" / "draw")
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    page.goto(f"{served.url}/#/overview")
    chart = page.locator("[data-metric='grad_norm']")
    over = chart.locator(".u-over")
    over.wait_for()
    box = over.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    assert chart.locator(".u-legend .u-series").nth(1).locator(".u-value").inner_text() == "2.00e-4"  # was "0"
    # ticks of 12345.6789 + 1e-4 steps read like 12345.6795: the Y axis is as wide as they are (60 px clipped them)
    left = page.locator("[data-metric='timing_step_total'] .u-over").evaluate("el => el.offsetLeft")
    widest = page.evaluate("telescopeUi.axisSize(['12345.679'])")
    assert widest > 60 and left >= widest
    shot(page, "legend-axis")
    assert page.evaluate("telescopeUi.fmt(2e-4)") == "2.00e-4"
    assert page.errors == []


def test_latex_is_not_read_as_markdown(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = write_dashboard_run(tmp_path / "runs" / "draw")
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    page.evaluate("localStorage.setItem('telescope-ui:rollouts-render', '\"markdown\"')")
    page.goto(f"{served.url}/#/rollouts?step=0")
    page.reload()
    completion = page.locator(".completion")
    completion.locator(".katex").first.wait_for()
    sources = completion.locator("annotation").evaluate_all("els => els.map(e => e.textContent)")
    assert sources == list(LATEX.values())
    assert completion.locator("em").count() == 0  # the stars stayed in the math
    assert completion.locator("code").inner_text() == "$not math$"  # code is not math
    shot(page, "latex")
    assert page.errors == []


def test_the_timeline_gives_overlapping_events_rows_kinds_colours_and_precise_ticks(
    page, serve, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    run = write_dashboard_run(tmp_path / "runs" / "draw")
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    page.goto(f"{served.url}/#/timeline")
    canvas = page.get_by_test_id("timeline-canvas")
    page.locator(".legend-item").nth(25).wait_for()
    page.wait_for_timeout(300)
    assert canvas.bounding_box()["height"] > 64 * 6  # the server's 64 concurrent requests: a row each
    swatches = page.locator(".legend-item .swatch").evaluate_all("els => els.map(e => e.style.background)")
    assert len(swatches) == 26 and len(set(swatches)) == 26, swatches  # every kind its own colour
    assert page.evaluate("telescopeUi.kindColor(0)") != "#dc2626"
    shot(page, "timeline-rows")
    # the ticks of a zoomed window (half a second, 41 minutes into the run) as the canvas draws them:
    # distinct, with the decimals their spacing needs (they all read "+41m06s" before)
    labels = [t["label"] for t in page.evaluate("telescopeUi.timeTicks(1000.2, 1000.7, 1000 - 2466)")]
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
    assert all(label.startswith("+41m06.") for label in labels), labels
    assert json.loads(canvas.get_attribute("data-ticks"))  # the canvas publishes the ticks it drew
    assert page.evaluate("telescopeUi.assignRows([{start: 0, end: 2}, {start: 1, end: 3}, {start: 2, end: 4}])") == [
        0,
        1,
        0,
    ]
    assert page.errors == []


def test_a_bad_block_is_named_on_the_page(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.ui_sync.conftest import write_blocks

    run = tmp_path / "runs" / "bad"
    write_blocks(run, 4)
    block = run / "rollouts" / "block-000002.parquet"
    block.write_bytes(block.read_bytes()[:50])
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    page.goto(f"{served.url}/#/rollouts?step=3")
    banner = page.locator(f".banner[data-bad-blocks='{run_id_for(run)}']")
    banner.filter(has_text="rollouts/block-000002.parquet").wait_for()
    page.locator(".sample-dot").first.wait_for()  # the other blocks' rollouts show
    shot(page, "bad-block")
    assert page.errors == []


def dot_colours(page) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The sidebar's colour of each run, by run id."""
    script = (
        "[...document.querySelectorAll('.run-item')]"
        ".map(e => [e.dataset.run, e.querySelector('.dot').style.background])"
    )
    return dict(page.evaluate(script))


def test_a_page_of_one_run_names_it(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ids = [run_id_for(write_run(tmp_path / "runs" / name, steps=1)) for name in ("alpha", "beta")]
    served = serve([tmp_path / "runs"])
    select(page, served.url, [ids[1], ids[0]])
    for name in ("logs", "rollouts", "overview"):
        page.goto(f"{served.url}/#/{name}")
        label = page.locator(f".page-run[data-run='{ids[1]}']")
        label.filter(has_text="beta").filter(has_text="first of 2 compared").wait_for()
    page.goto(f"{served.url}/#/metrics")  # compares both: no single run to name
    page.locator(".page.metrics").wait_for()
    assert page.locator(".page-run").count() == 0


def test_run_colours_stay_when_a_run_is_added(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ids = [run_id_for(write_run(tmp_path / "runs" / name, steps=1)) for name in ("b", "c")]
    served = serve([tmp_path / "runs"])
    select(page, served.url, ids)
    page.locator(f".run-item[data-run='{ids[1]}']").wait_for()
    before = dot_colours(page)
    early = write_run(tmp_path / "runs" / "a", steps=1)
    status = json.loads((early / "status.json").read_text())
    (early / "status.json").write_text(json.dumps({**status, "start_time": 1.0}))  # listed first
    page.locator(f".run-item[data-run='{run_id_for(early)}']").wait_for(timeout=5000)
    after = dot_colours(page)
    assert next(iter(after)) == run_id_for(early)
    assert {rid: after[rid] for rid in ids} == before
    assert len(set(after.values())) == 3
    page.reload()  # kept across reloads
    page.locator(f".run-item[data-run='{run_id_for(early)}']").wait_for()
    assert dot_colours(page) == after


def test_a_deleted_run_can_be_removed_from_the_sidebar(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import httpx

    kept = run_id_for(write_run(tmp_path / "runs" / "kept", steps=1))
    doomed = write_run(tmp_path / "runs" / "doomed", steps=1)
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(doomed)])
    item = page.locator(f".run-item[data-run='{run_id_for(doomed)}']")
    item.wait_for()
    assert item.locator(".run-remove").count() == 0  # only a run whose directory is gone
    shutil.rmtree(doomed)
    page.on("dialog", lambda dialog: dialog.accept())
    item.locator(".run-remove").click(timeout=5000)
    item.wait_for(state="detached", timeout=5000)
    assert [run["run_id"] for run in httpx.get(f"{served.url}/api/runs").json()["runs"]] == [kept]
    page.locator(f".run-item.selected[data-run='{kept}']").wait_for()  # the newest left is shown
    assert page.errors == []


def test_logs_page_back_past_their_last_500_lines(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = write_run(tmp_path / "runs" / "chatty", steps=1)  # 2 lines in orchestrator.log
    with (run / "logs" / "worker.log").open("w") as log:
        log.writelines(f"2026-01-02 03:04:05,678 INFO telescope.worker: line {i}\n" for i in range(1100))
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    page.goto(f"{served.url}/#/logs")
    lines = page.locator(".log-line")
    page.locator(".log-earlier").filter(has_text="602 not shown").wait_for()
    assert lines.count() == 500 and "line 1099" in lines.last.inner_text()
    page.locator(".log-earlier").click()
    page.locator(".log-earlier").filter(has_text="Show 102 earlier").wait_for()
    assert lines.count() == 1000
    page.locator(".log-earlier").click()
    page.locator(".log-earlier").wait_for(state="detached")
    assert lines.count() == 1102 and "step 0 done" in lines.first.inner_text()
    assert page.errors == []


def test_a_finished_run_is_not_polled(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An open Metrics tab of a finished run asks for nothing but the run list, until the run gets new data."""
    run = write_run(tmp_path / "runs" / "done", steps=3)
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    page.goto(f"{served.url}/#/metrics")
    page.locator("[data-metric='grad_norm'] canvas").wait_for()
    page.wait_for_timeout(1500)  # the first loads settle
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url.split("?")[0].removeprefix(served.url)))
    page.wait_for_timeout(5000)
    assert asked.count("/api/runs") >= 3  # the run list is still polled (new runs appear)...
    assert [path for path in asked if path != "/api/runs"] == []  # ...the finished run's page is not
    store = RunStore(run)
    with page.expect_request("**/api/metrics/series**", timeout=5000):  # new data: the page loads again
        store.log_metrics(3, {"grad_norm": 9.0})
    store.close()


def test_a_huge_completion_is_cut_with_a_way_to_see_all(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = write_run(tmp_path / "runs" / "long", steps=1, completion="word " * 60_000 + "THE-END")
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    page.goto(f"{served.url}/#/rollouts?step=0")
    completion = page.locator(".completion")
    completion.locator(".show-all").filter(has_text="300,007").wait_for()
    assert len(completion.inner_text()) < 25_000 and "THE-END" not in completion.inner_text()
    completion.locator(".show-all").click()
    completion.filter(has_text="THE-END").wait_for()
    assert completion.locator(".show-all").count() == 0
    assert page.errors == []


def test_an_agent_episode_shows_its_calls_and_the_samples_they_train_in(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    call = {"role": "assistant", "content": None}
    tool_call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    first = {"role": "user", "content": "add 2 and 3"}
    calls = [
        {
            "index": 0,
            "route": "chat",
            "sequence": 0,
            "continues": None,
            "mismatch": False,
            "start": 1.0,
            "latency_s": 0.012,
            "prompt_tokens": 20,
            "completion_tokens": 9,
            "finish_reason": "stop",
            "messages": [first],
            "reply": {**call, "tool_calls": [tool_call]},
            "logprobs": [-0.5, -1.5],
        },
        {
            "index": 1,
            "route": "chat",
            "sequence": 0,
            "continues": 0,
            "mismatch": True,
            "start": 1.1,
            "latency_s": 0.02,
            "prompt_tokens": 35,
            "completion_tokens": 3,
            "finish_reason": "stop",
            "first_message": 2,
            "messages": [{"role": "tool", "content": "TOOL-SAYS-5"}],
            "reply": {"role": "assistant", "content": "FINAL-5"},
            "logprobs": [-0.25],
        },
    ]
    run = write_run(tmp_path / "runs" / "agent", steps=1, first_rollout={"agent_calls": calls})
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    page.goto(f"{served.url}/#/rollouts?step=0")
    page.get_by_text("Agent calls (2), trained as 1 sample").wait_for()
    second = page.locator(".agent-call[data-call='1']")
    assert "continues call 0" in second.inner_text() and "re-tokenization differs" in second.inner_text()
    second.locator(":scope > summary").click()
    second.filter(has_text="TOOL-SAYS-5").filter(has_text="FINAL-5").wait_for()
    assert "mean -0.25" in second.inner_text()
    first_call = page.locator(".agent-call[data-call='0']")
    first_call.locator(":scope > summary").click()
    first_call.locator(".tool-call").filter(has_text="tool call: add").wait_for()
    assert page.errors == []


def test_a_compacted_episode_shows_its_segments_and_each_tokens_policy_version(page, serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def turn(inputs: int, runs: list[list[int]]) -> dict[str, object]:
        outputs = sum(count for _, count in runs)
        return {
            "input_tokens": inputs,
            "output_tokens": outputs,
            "policy_version": runs[0][0],
            "finish_reason": "stop",
            "versions": runs,
        }

    episode = {
        "segment_turns": [[turn(20, [[1, 6]]), turn(4, [[1, 2], [2, 3]])]],
        "turns": [turn(30, [[2, 4]]), turn(5, [[3, 7]])],
        "segments": 1,
        "compactions": 1,
    }
    run = write_run(tmp_path / "runs" / "compacted", steps=1, first_rollout=episode)
    served = serve([tmp_path / "runs"])
    select(page, served.url, [run_id_for(run)])
    page.goto(f"{served.url}/#/rollouts?step=0")
    page.get_by_text("Context segments (2), compacted 1 times").wait_for()
    first, last = page.locator(".segment[data-segment='0']"), page.locator(".segment[data-segment='1']")
    assert "compacted into segment 1" in first.inner_text() and "the episode's end" in last.inner_text()
    assert [r.inner_text() for r in first.locator(".version-run").all()] == ["v1×6", "v1×2", "v2×3"]
    assert [r.inner_text() for r in last.locator(".version-run").all()] == ["v2×4", "v3×7"]
    assert page.errors == []
