"""The API of browser episodes: a rollout's screenshots served from the run's media/ folder (and
nothing else), and browser events on the timeline in one lane, each with its session as its row group.

The run is tests/ui_sync/conftest.py's ``write_browser_run``: one miniwob-like episode with two
screenshots, and the browser events of two sessions beside a sandbox's and a weight update's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tests.ui_sync.conftest import SESSIONS, png_bytes, write_browser_run

from telescope_ui_sync.server.app import create_app
from telescope_ui_sync.sync.schema import connect
from telescope_ui_sync.sync.syncer import SyncService, run_id_for


@pytest.fixture
def browser_run(tmp_path: Path) -> tuple[TestClient, str, Path]:
    run = write_browser_run(tmp_path / "runs" / "web")
    con = connect(":memory:")
    SyncService(con, [tmp_path / "runs"]).sync_all()
    return TestClient(create_app(con), base_url="http://localhost"), run_id_for(run), run


def test_a_rollouts_screenshots_are_served_from_the_run_media_folder(browser_run: tuple[TestClient, str, Path]) -> None:
    api, rid, run = browser_run
    [sample] = [
        s for s in api.get("/api/rollouts", params={"run": rid, "step": 0}).json()["samples"] if s["group_index"] == 0
    ]
    record = api.get("/api/rollouts/sample", params={"run": rid, "seq": sample["seq"]}).json()["record"]
    shots = record["attachments"]
    assert [(a["turn"], a["path"].split("/")[:2]) for a in shots] == [
        (0, ["media", "step-0"]),
        (1, ["media", "step-0"]),
    ]
    for shot, colour in zip(shots, ((220, 20, 20), (20, 20, 220)), strict=True):
        served = api.get("/api/rollouts/media", params={"run": rid, "path": shot["path"]})
        assert served.status_code == 200 and served.headers["content-type"] == "image/png"
        assert served.content == (run / shot["path"]).read_bytes() and served.content[:4] == b"\x89PNG"
        assert served.content == png_bytes(*((32, 24) if shot["turn"] == 0 else (48, 20)), colour)
    (run / "media" / "step-0" / "page.html").write_text("<script>alert(1)</script>")
    (run / "media" / "step-0" / "blob.svg").write_text("<svg/>")
    html = api.get("/api/rollouts/media", params={"run": rid, "path": "media/step-0/page.html"})
    assert (
        html.headers["content-type"].startswith("text/plain")
        and "script-src 'self'" in html.headers["content-security-policy"]
    )
    svg = api.get("/api/rollouts/media", params={"run": rid, "path": "media/step-0/blob.svg"})
    assert (
        svg.headers["content-type"] == "application/octet-stream" and svg.headers["content-disposition"] == "attachment"
    )
    missing = api.get("/api/rollouts/media", params={"run": rid, "path": "media/step-0/nope.png"})
    assert missing.status_code == 404 and "nope.png" in missing.json()["detail"]
    assert api.get("/api/rollouts/media", params={"run": "nope", "path": shots[0]["path"]}).status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "media/../config.json",
        "media/step-0/../../status.json",
        "../web/config.json",
        "/etc/passwd",
        "config.json",
        "media",
        "",
    ],
)
def test_the_media_route_refuses_paths_outside_the_media_folder(
    browser_run: tuple[TestClient, str, Path], path: str
) -> None:
    api, rid, _ = browser_run
    refused = api.get("/api/rollouts/media", params={"run": rid, "path": path})
    assert refused.status_code == 400 and "media/" in refused.json()["detail"], refused.text


def test_the_media_route_refuses_a_symlink_out_of_the_media_folder(
    browser_run: tuple[TestClient, str, Path], tmp_path: Path
) -> None:
    api, rid, run = browser_run
    secret = tmp_path / "secret.png"
    secret.write_bytes(png_bytes(2, 2, (0, 0, 0)))
    (run / "media" / "step-0" / "out.png").symlink_to(secret)  # out of the run directory
    (run / "media" / "step-0" / "config.json").symlink_to(run / "config.json")  # in the run, out of media/
    for name, said in (("out.png", "outside the run directory"), ("config.json", "leads out of the run's media/")):
        refused = api.get("/api/rollouts/media", params={"run": rid, "path": f"media/step-0/{name}"})
        assert refused.status_code == 403 and said in refused.json()["detail"], refused.text


def test_browser_events_lie_in_one_lane_with_their_session_as_the_row_group(
    browser_run: tuple[TestClient, str, Path],
) -> None:
    api, rid, _ = browser_run
    timeline = api.get("/api/timeline", params={"run": rid}).json()
    lanes = [lane["id"] for lane in timeline["lanes"]]
    assert lanes == [
        "trainer|steps",
        "sandbox|sandbox_id sb-1",
        "browser|main",
        "weights|main",
    ]  # browser after sandbox
    browser = sorted((e["start"], e["kind"], e["group"]) for e in timeline["events"] if e["lane"] == "browser|main")
    expected = sorted((1000.0 + at, f"browser.{kind}", s) for s, actions in SESSIONS for kind, at, _ in actions)
    assert browser == expected
    assert all(e["group"] is None for e in timeline["events"] if e["lane"] != "browser|main")
    capped = api.get("/api/timeline", params={"run": rid, "limit": 3}).json()  # the longest three (0.5 s each)
    assert capped["truncated"]
    assert {(e["lane"], e["group"]) for e in capped["events"]} == {
        ("browser|main", "aaaaaaaaaaaa"),
        ("browser|main", "bbbbbbbbbbbb"),
        ("weights|main", None),
    }
