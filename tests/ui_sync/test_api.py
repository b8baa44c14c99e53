"""The JSON API over synced runs, the CLI, path safety and the shipped assets."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tests.ui_sync.conftest import REPO, write_blocks, write_run

from telescope_ui_sync import build
from telescope_ui_sync.server.app import create_app
from telescope_ui_sync.server.guards import allowed_hosts
from telescope_ui_sync.sync.schema import connect
from telescope_ui_sync.sync.syncer import SyncService, run_id_for


@pytest.fixture
def client(tmp_path: Path) -> tuple[TestClient, str, Path]:
    run = write_run(tmp_path / "runs" / "a", steps=6)
    write_run(tmp_path / "runs" / "b", steps=2)
    con = connect(":memory:")
    service = SyncService(con.cursor(), [tmp_path / "runs"])
    service.sync_all()
    return TestClient(create_app(con, service), base_url="http://localhost"), run_id_for(run), run


def test_runs_and_summary(client: tuple[TestClient, str, Path]) -> None:
    api, rid, _ = client
    runs = api.get("/api/runs").json()["runs"]
    assert [r["name"] for r in runs] == ["a", "b"]
    summary = api.get(f"/api/runs/{rid}").json()
    assert summary["run"]["progress"]["fraction"] == 0.6
    assert summary["ranges"]["reward"] == {"countdown": [0.0, 2.0]}
    assert summary["counts"]["steps"] == 6 and summary["log_files"] == ["orchestrator.log"]
    assert api.get("/api/runs/nope").status_code == 404


def test_catalog_and_series_compare_runs(client: tuple[TestClient, str, Path]) -> None:
    api, rid, _ = client
    other = run_id_for(client[2].parent / "b")
    sections = api.get("/api/metrics/catalog", params={"runs": f"{rid},{other}"}).json()["sections"]
    assert [s["name"] for s in sections][:3] == ["General", "Reward", "Sample Metrics"]
    assert "Evals" in [s["name"] for s in sections]
    series = api.get("/api/metrics/series", params={"runs": f"{rid},{other}", "names": "grad_norm"}).json()["series"]
    assert [(s["run_id"], s["x"], s["y"]) for s in series] == [
        (rid, [0, 1, 2, 3, 4, 5], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        (other, [0, 1], [1.0, 2.0]),
    ]
    evals = api.get("/api/metrics/series", params={"runs": rid, "names": "eval/countdown/reward_mean"}).json()
    assert evals["series"][0]["x"] == [6]


def test_a_copied_block_stored_run_is_a_second_run_with_its_own_series(tmp_path: Path) -> None:
    """The layer below the two-run chart: a copy of a run (its events and rollouts in sealed
    Parquet blocks) syncs as a run of its own, and the series route returns both runs'.
    (The chart's missing series was the front end's: see test_browser's selection test.)"""
    import shutil

    run = write_run(tmp_path / "runs" / "a", steps=3)
    assert (run / "events" / "block-000000.parquet").is_file() and (run / "rollouts" / "block-000000.parquet").is_file()
    copy = Path(shutil.copytree(run, tmp_path / "runs" / "a-2"))
    con = connect(":memory:")
    SyncService(con, [tmp_path / "runs"]).sync_all()
    api = TestClient(create_app(con), base_url="http://localhost")
    ids = [run_id_for(run), run_id_for(copy)]
    assert [r["run_id"] for r in api.get("/api/runs").json()["runs"]] == sorted(ids)
    for rid in ids:
        counts = api.get(f"/api/runs/{rid}").json()["counts"]
        assert (counts["rollouts"], counts["events"], counts["steps"]) == (24, 4, 3)
    series = api.get("/api/metrics/series", params={"runs": ",".join(ids), "names": "reward/mean"}).json()["series"]
    assert [(s["run_id"], s["x"]) for s in series] == [(ids[0], [0, 1, 2]), (ids[1], [0, 1, 2])]
    assert series[0]["y"] == series[1]["y"] == [0.0, 0.1, 0.2]


def test_long_series_are_downsampled_keeping_extremes(tmp_path: Path) -> None:
    from telescope.recording.run_store import RunStore

    store = RunStore(tmp_path / "long")
    store.set_status("running", step=0)
    for step in range(5000):
        store.log_metrics(step, {"grad_norm": 100.0 if step == 2345 else 1.0})
    store.close()
    con = connect(":memory:")
    SyncService(con, [tmp_path / "long"]).sync_all()
    api = TestClient(create_app(con), base_url="http://localhost")
    rid = run_id_for(tmp_path / "long")
    series = api.get("/api/metrics/series", params={"runs": rid, "names": "grad_norm", "max_points": 200}).json()
    [one] = series["series"]
    assert len(one["x"]) <= 200 and max(one["y"]) == 100.0 and one["x"] == sorted(one["x"])
    full = api.get("/api/metrics/series", params={"runs": rid, "names": "grad_norm", "max_points": 0}).json()
    assert len(full["series"][0]["x"]) == 5000


def test_rollouts_by_step_sample_and_search(client: tuple[TestClient, str, Path]) -> None:
    api, rid, _ = client
    steps = api.get("/api/rollouts/steps", params={"run": rid}).json()["steps"]
    assert [s["step"] for s in steps] == list(range(6)) and steps[0]["count"] == 8
    samples = api.get("/api/rollouts", params={"run": rid, "step": 2}).json()["samples"]
    assert len(samples) == 8 and {s["group_index"] for s in samples} == {0, 1}
    latest = api.get("/api/rollouts", params={"run": rid}).json()
    assert latest["step"] == 5
    full = api.get("/api/rollouts/sample", params={"run": rid, "seq": samples[0]["seq"]}).json()
    assert full["record"]["prompt"] == "prompt 2 0"
    found = api.get("/api/rollouts/search", params={"run": rid, "q": "TOOL OUTPUT 3-1"}).json()
    assert found["total"] == 4 and {r["field"] for r in found["results"]} == {"tool"}
    assert all(r["step"] == 3 and r["group_index"] == 1 for r in found["results"])
    assert api.get("/api/rollouts/search", params={"run": rid, "q": "prompt 4 1"}).json()["total"] == 4
    assert api.get("/api/rollouts/search", params={"run": rid, "q": "100%_"}).json()["total"] == 0  # wildcards literal


def test_timeline_sandboxes_infra_evals_logs(client: tuple[TestClient, str, Path]) -> None:
    api, rid, _ = client
    timeline = api.get("/api/timeline", params={"run": rid}).json()
    assert {lane["id"] for lane in timeline["lanes"]} == {"trainer|steps", "sandbox|sandbox_id sb-1"}
    assert len(timeline["events"]) == 6 and len(timeline["steps"]) == 6
    window = api.get("/api/timeline", params={"run": rid, "start": 1001.5, "end": 1002.1}).json()
    assert [e["step"] for e in window["events"]] == [2]
    capped = api.get("/api/timeline", params={"run": rid, "limit": 2}).json()
    assert capped["truncated"] and len(capped["events"]) == 2
    detail = api.get(f"/api/events/{rid}/{window['events'][0]['seq']}").json()
    assert detail["fields"]["command"] == "python main.py"
    [box] = api.get("/api/sandboxes", params={"run": rid}).json()["sandboxes"]
    assert (box["sandbox_id"], box["commands"], box["failures"]) == ("sb-1", 6, 3)
    events = api.get(f"/api/sandboxes/{rid}/sb-1").json()["events"]
    assert [e["failed"] for e in events] == [False, True] * 3
    [cpu] = api.get("/api/infra", params={"run": rid}).json()["series"]
    assert cpu["name"] == "cpu_utilization_percent" and cpu["v"] == [42.0]
    evals = api.get("/api/evals", params={"run": rid}).json()["evals"]
    assert evals[0]["metrics"] == {"eval/countdown/reward_mean": 0.25} and evals[0]["phase"] == "after"
    logs = api.get("/api/logs", params={"run": rid, "levels": "ERROR"}).json()
    assert [line["message"] for line in logs["lines"]] == ["something failed"]
    assert api.get("/api/logs", params={"run": rid, "q": "step 0"}).json()["total"] == 1


def test_a_full_timeline_window_comes_with_its_density_per_lane(tmp_path: Path) -> None:
    from telescope.recording.run_store import RunStore

    store = RunStore(tmp_path / "busy")
    store.set_status("running", step=0)
    con = connect(":memory:")
    service = SyncService(con, [tmp_path / "busy"])
    for i in range(3000):  # 3,000 s of events on two servers, one in 100 failed
        store.log_event(
            {
                "kind": "inference.request",
                "start": 1000.0 + i,
                "duration_s": 0.5 + (i % 7) / 10,
                "server": i % 2,
                **({"error": "boom"} if i % 100 == 0 else {}),
            }
        )
        if i == 1504:  # the syncer reads the run in two parts, the cut inside a 10 s bin: its halves add up
            store.flush()
            service.sync_all()
    store.close()
    service.sync_all()
    by_width = con.execute("SELECT width, sum(events), count(*) FROM event_bins GROUP BY 1 ORDER BY 1").fetchall()
    assert by_width == [(10.0, 3000, 600), (100.0, 3000, 60), (1000.0, 3000, 6)]  # 2 lanes x 300, 30 and 3 bins
    api = TestClient(create_app(con), base_url="http://localhost")
    rid = run_id_for(tmp_path / "busy")
    for buckets in (
        2,
        10,
        50,
        1000,
    ):  # 1500 s buckets from the 1000 s bins, 300 s from 100 s, 60 s from 10 s, 3 s from events
        whole = api.get("/api/timeline", params={"run": rid, "limit": 100, "buckets": buckets}).json()
        assert whole["truncated"] and whole["total"] == 3000 and len(whole["events"]) == 100
        assert min(e["duration"] for e in whole["events"]) == 1.1  # the longest
        bins = whole["bins"]
        lanes = [whole["lanes"][i]["id"] for i in bins["lane"]]
        assert set(lanes) == {"inference|server 0", "inference|server 1"} and bins["kinds"] == ["inference.request"]
        assert sum(bins["count"]) == 3000 and sum(bins["errors"]) == 30
        assert len(bins["count"]) <= 2 * buckets and all(n > 0 for n in bins["count"])
        assert all(0 <= b < buckets for b in bins["bucket"]) and bins["width"] * buckets == pytest.approx(2999.8)
        assert abs(sum(bins["busy"]) - sum(0.5 + (i % 7) / 10 for i in range(3000))) < 1e-3
        detail = api.get(f"/api/events/{rid}/{bins['seq'][0]}").json()  # a bucket's longest event
        server, first = int(lanes[0][-1]), bins["bucket"][0]
        in_bucket = [i for i in range(server, 3000, 2) if int((1000.0 + i - 1000.0) // bins["width"]) == first]
        assert f"{detail['component']}|{detail['lane']}" == lanes[0]
        assert detail["duration"] == pytest.approx(max(0.5 + (i % 7) / 10 for i in in_bucket))
    narrow = api.get("/api/timeline", params={"run": rid, "start": 1100.0, "end": 1149.0}).json()
    assert not narrow["truncated"] and narrow["bins"] is None and len(narrow["events"]) == 50
    assert [e["start"] for e in narrow["events"]] == sorted(e["start"] for e in narrow["events"])


def write_two_environment_run(run_dir: Path) -> Path:
    """Three steps of rollouts from environments ``a`` (reward 1, tag ``level=hard``) and ``b``
    (reward 0, ``level=easy``), with the step metrics a run records over all of them."""
    from telescope.recording.run_store import RunStore

    store = RunStore(run_dir)
    store.set_status("running", step=0)
    for step in range(3):
        store.log_metrics(step, {"reward/mean": 0.5, "grad_norm": 1.0 + step, "sample_metrics/correct/mean": 0.5})
        store.log_rollouts(
            step,
            [
                {
                    "environment": env,
                    "reward": float(env == "a"),
                    "sample_metrics": {"correct": float(env == "a")},
                    "completion_tokens": 10 * (i + 1),
                    "tags": {"level": "hard" if env == "a" else "easy"},
                    "group_index": i,
                }
                for i, env in enumerate("abab")
            ],
        )
    store.set_status("completed", step=3)
    store.close()
    return run_dir


def test_metrics_filtered_by_environment_and_tag_come_from_the_rollouts(tmp_path: Path) -> None:
    run = write_two_environment_run(tmp_path / "runs" / "envs")
    con = connect(":memory:")
    SyncService(con, [tmp_path / "runs"]).sync_all()
    api = TestClient(create_app(con), base_url="http://localhost")
    rid = run_id_for(run)
    assert api.get("/api/metrics/filters", params={"runs": rid}).json() == {
        "environments": ["a", "b"],
        "tags": ["level=easy", "level=hard"],
    }
    names = "reward/mean,sample_metrics/correct/mean,tokens/completion/max,rollouts/count,grad_norm"

    def series(**filters: object) -> dict[str, tuple[list[float], bool]]:
        params = {"runs": rid, "names": names, **filters}
        return {
            s["name"]: (s["y"], s["filtered"]) for s in api.get("/api/metrics/series", params=params).json()["series"]
        }

    unfiltered = series()
    assert unfiltered["reward/mean"] == ([0.5, 0.5, 0.5], False)  # as recorded
    by_env = series(env="a")
    assert by_env["reward/mean"] == ([1.0, 1.0, 1.0], True)
    assert by_env["sample_metrics/correct/mean"] == ([1.0, 1.0, 1.0], True)
    assert by_env["tokens/completion/max"] == ([30.0, 30.0, 30.0], True)  # rollouts 0 and 2 of a step are env a
    assert by_env["rollouts/count"] == ([2.0, 2.0, 2.0], True)
    assert by_env["grad_norm"] == ([1.0, 2.0, 3.0], False)  # the rollouts cannot give it: as recorded
    assert series(tag="level=easy")["reward/mean"] == ([0.0, 0.0, 0.0], True)
    assert series(tag=["level=easy", "level=hard"])["rollouts/count"] == ([4.0, 4.0, 4.0], True)  # one name: either
    assert series(env="a", tag="level=easy")["reward/mean"] == ([], True)  # both must hold
    timed = api.get("/api/metrics/series", params={"runs": rid, "names": "reward/mean", "env": "b", "x": "time"}).json()
    assert timed["series"][0]["y"] == [0.0, 0.0, 0.0] and timed["series"][0]["x"][0] == 0.0


def test_declared_ranges_come_from_the_config_and_the_run_metadata(tmp_path: Path) -> None:
    import json

    run = write_run(tmp_path / "runs" / "a", steps=1)
    ranges = {"correct": {"min": 0, "max": 1}}
    (run / "metadata.json").write_text(
        json.dumps(
            {
                "environments": [
                    {"name": "countdown", "reward_min": 0.0, "reward_max": 2.0, "metrics_ranges": ranges},
                ]
            }
        )
    )
    con = connect(":memory:")
    SyncService(con, [tmp_path / "runs"]).sync_all()
    ranges = (
        TestClient(create_app(con), base_url="http://localhost").get(f"/api/runs/{run_id_for(run)}").json()["ranges"]
    )
    assert ranges == {"reward": {"countdown": [0.0, 2.0]}, "metrics": {"correct": [0, 1]}}


def test_code_snapshot_files_text_and_diff_between_runs(tmp_path: Path) -> None:
    a = write_run(tmp_path / "runs" / "a", steps=1)
    b = write_run(tmp_path / "runs" / "b", steps=1)
    for run, train in ((a, "lr = 1e-6\nsteps = 10\n"), (b, "lr = 3e-6\nsteps = 10\n")):
        (run / "code" / "pkg").mkdir(parents=True)
        (run / "code" / "README.md").write_text("# the project\n")
        (run / "code" / "pkg" / "train.py").write_text(train)
    (a / "code" / "old.py").write_text("x = 1\n")
    (b / "code" / "pkg" / "new.py").write_text("y = 2\n")
    (tmp_path / "secret.txt").write_text("not for the dashboard")
    con = connect(":memory:")
    SyncService(con, [tmp_path / "runs"]).sync_all()
    api = TestClient(create_app(con), base_url="http://localhost")
    ra, rb = run_id_for(a), run_id_for(b)
    listing = api.get(f"/api/code/{ra}").json()
    assert listing["files"] == ["README.md", "old.py", "pkg/train.py"]
    assert api.get(f"/api/code/{ra}/file", params={"path": "pkg/train.py"}).text == "lr = 1e-6\nsteps = 10\n"
    for outside in ("../config.json", "../../secret.txt", "/etc/passwd"):
        assert api.get(f"/api/code/{ra}/file", params={"path": outside}).status_code == 403, outside
    assert api.get(f"/api/code/{ra}/file", params={"path": "missing.py"}).status_code == 404
    diff = api.get("/api/code-diff", params={"a": ra, "b": rb}).json()
    assert (
        diff["changed"]
        == [
            {"path": "old.py", "status": "removed"},
            {"path": "pkg/new.py", "status": "added"},
            {"path": "pkg/train.py", "status": "modified"},
        ]
        and diff["same"] == 1
    )
    text = api.get("/api/code-diff", params={"a": ra, "b": rb, "path": "pkg/train.py"}).json()["diff"]
    assert "-lr = 1e-6\n+lr = 3e-6\n" in text and "--- a/pkg/train.py" in text
    import shutil

    shutil.rmtree(b)
    assert api.get(f"/api/code/{rb}").status_code == 410


def test_config_diff(client: tuple[TestClient, str, Path], tmp_path: Path) -> None:
    api, rid, _ = client
    other = run_id_for(client[2].parent / "b")
    diff = api.get("/api/config-diff", params={"a": rid, "b": other}).json()
    assert diff["differences"] == [] and diff["same"] > 0


@pytest.mark.parametrize("path", ["../b/config.json", "/etc/passwd", "logs/../../b/status.json", "metrics.jsonl", ""])
def test_file_route_refuses_paths_outside_the_run(client: tuple[TestClient, str, Path], path: str) -> None:
    api, rid, _ = client
    assert api.get(f"/api/files/{rid}", params={"path": path}).status_code in (400, 403)


def test_file_route_refuses_a_symlink_out_of_the_run(client: tuple[TestClient, str, Path], tmp_path: Path) -> None:
    api, rid, run = client
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    (run / "logs" / "evil.log").symlink_to(secret)
    assert api.get(f"/api/files/{rid}", params={"path": "logs/evil.log"}).status_code == 403
    served = api.get(f"/api/files/{rid}", params={"path": "logs/orchestrator.log"})
    assert served.status_code == 200 and "something failed" in served.text


def test_pages_are_served_with_a_strict_content_security_policy(client: tuple[TestClient, str, Path]) -> None:
    api, _, _ = client
    page = api.get("/")
    assert page.status_code == 200 and "/assets/app.js" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert api.get("/assets/app.js").status_code == 200


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("localhost:8005", 200),
        ("127.0.0.1", 200),
        ("[::1]:8005", 200),
        ("dash.example", 200),
        ("evil.example", 400),
        ("evil.example:8005", 400),
        ("localhost:port", 400),
        ("", 400),
    ],
)
def test_requests_naming_another_host_are_refused(tmp_path: Path, host: str, status: int) -> None:
    """DNS rebinding: a page of evil.example whose name resolves to 127.0.0.1 still sends its own name."""
    app = create_app(connect(":memory:"), hosts=allowed_hosts("127.0.0.1", ["dash.example"]))
    answer = TestClient(app, base_url="http://localhost").get("/api/runs", headers={"host": host})
    assert answer.status_code == status, answer.text
    if status == 400:
        assert "--allow-host" in answer.text
    assert allowed_hosts("0.0.0.0") >= {"localhost", "::1", socket.gethostname().lower()}
    assert "0.0.0.0" not in allowed_hosts("0.0.0.0") and "10.1.2.3" in allowed_hosts("10.1.2.3")


def test_every_get_route_and_the_static_files_answer_head(client: tuple[TestClient, str, Path]) -> None:
    api, rid, _ = client
    paths = api.get("/api/openapi.json").json()["paths"]
    gets = [path for path, methods in paths.items() if "get" in methods]
    assert len(gets) > 10
    for path in gets:
        answer = api.head(re.sub(r"\{\w+\}", rid, path))
        assert answer.status_code != 405, path  # 404 or 422 (query parameters missing) come from the route
    for path in ("/", "/assets/app.js", f"/api/runs/{rid}", f"/api/logs?run={rid}"):
        head, get = api.head(path), api.get(path)
        assert head.status_code == 200 and head.content == b"", path
        assert head.headers["content-length"] == get.headers["content-length"] == str(len(get.content))


def test_a_run_whose_directory_was_deleted_can_be_removed(client: tuple[TestClient, str, Path]) -> None:
    api, rid, run = client
    service = api.app.state.telescope.service  # type: ignore[attr-defined]
    refused = api.delete(f"/api/runs/{rid}")
    assert refused.status_code == 409 and "still there" in refused.json()["detail"]
    shutil.rmtree(run)
    service.sync_all()
    assert api.delete(f"/api/runs/{rid}").json() == {"removed": rid}
    service.sync_all()
    assert [r["name"] for r in api.get("/api/runs").json()["runs"]] == ["b"]
    assert api.get(f"/api/runs/{rid}").status_code == 404
    con = api.app.state.telescope.con  # type: ignore[attr-defined]
    assert con.execute("SELECT count(*) FROM metrics WHERE run_id = ?", [rid]).fetchone() == (0,)
    assert api.delete(f"/api/runs/{rid}").status_code == 404
    write_run(run, steps=1)  # the directory comes back: a run again, synced from its beginning
    service.sync_all()
    assert api.get(f"/api/runs/{rid}").json()["counts"]["steps"] == 1


def test_built_assets_are_up_to_date_and_load_nothing_from_the_network() -> None:
    assert not build.is_stale(), "front end sources changed: run python -m telescope_ui_sync.build"
    index = (build.STATIC_DIR / "index.html").read_text()
    assert "http://" not in index and "https://" not in index
    css = (build.STATIC_DIR / "assets" / "app.css").read_text()
    assert "url(http" not in css and "@import" not in css


def test_the_wheel_ships_the_built_front_end(tmp_path: Path) -> None:
    """``pip wheel`` of the package (hatchling, no network) holds every built asset and no front-end source."""
    import zipfile

    pytest.importorskip("hatchling", reason="the build backend (requirements-dev.txt installs it)")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w"]
    result = subprocess.run(
        [*command, str(tmp_path), str(REPO / "telescope-ui-sync")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [wheel] = tmp_path.glob("telescope_ui_sync-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    static = build.STATIC_DIR
    built = {f"telescope_ui_sync/static/{p.relative_to(static).as_posix()}" for p in static.rglob("*") if p.is_file()}
    assert {"telescope_ui_sync/static/index.html", "telescope_ui_sync/static/assets/app.js"} <= built
    assert any(name.endswith(".woff2") for name in built)  # KaTeX's fonts: nothing is fetched at run time
    assert built <= names, sorted(built - names)[:5]
    assert not [name for name in names if "node_modules" in name or name.endswith(".ts")]
    entry_points = next(name for name in names if name.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[telescope]" in text and "telescope_ui_sync.plugin" in text


def test_the_cli_module_stays_light() -> None:
    code = (
        "import sys, telescope_ui_sync.plugin, telescope_ui_sync.cli; "
        "print(sorted(m for m in ('duckdb', 'fastapi', 'uvicorn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def entry_point_site(tmp_path: Path) -> Path:
    """A dist-info that registers telescope-ui-sync's entry point (the package itself comes from PYTHONPATH)."""
    site = tmp_path / "site"
    info = site / "telescope_ui_sync-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: telescope-ui-sync\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[telescope]\ntelescope_ui_sync = telescope_ui_sync.plugin\n")
    return site


def telescope_cli(tmp_path: Path, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(entry_point_site(tmp_path)), *sys.path])}
    code = "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )  # type: ignore[call-overload]


def test_telescope_ui_is_added_through_the_hook(tmp_path: Path) -> None:
    helped = telescope_cli(tmp_path, "ui", "--help")
    out, err = helped.communicate(timeout=120)
    assert helped.returncode == 0, err
    assert "--port" in out and "--host" in out and "PATHS" in out


@pytest.mark.slow
def test_telescope_ui_serves_and_warns_off_loopback(tmp_path: Path) -> None:
    import httpx

    write_run(tmp_path / "runs" / "a", steps=2)
    process = telescope_cli(
        tmp_path, "ui", str(tmp_path / "runs"), "--port", "0", "--host", "0.0.0.0", "--db", str(tmp_path / "ui.duckdb")
    )  # port 0: the system picks a free one, which the printed URL names (no port to race for)
    try:
        assert process.stderr is not None
        printed = ""
        while "serving" not in printed:
            line = process.stderr.readline()
            assert line, f"telescope ui exited before serving (code {process.wait()})"
            printed += line
        found = re.search(r"at http://0\.0\.0\.0:(\d+)/", printed)
        assert found and int(found.group(1)) > 0, printed
        port = int(found.group(1))
        deadline = time.time() + 60
        runs = None
        while time.time() < deadline:
            try:
                runs = httpx.get(f"http://127.0.0.1:{port}/api/runs", timeout=2).json()["runs"]
                if runs:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert runs and runs[0]["name"] == "a"
        rebound = httpx.get(f"http://127.0.0.1:{port}/api/runs", headers={"Host": "evil.example"}, timeout=5)
        assert rebound.status_code == 400 and "--allow-host" in rebound.text
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert "WARNING: binding 0.0.0.0" in printed + err


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    from telescope_ui_sync.server.serve import serve

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exited:
            serve([tmp_path], db_path=tmp_path / "ui.duckdb", host="127.0.0.1", port=port)
    message = str(exited.value.code)
    assert f"cannot listen on 127.0.0.1:{port}" in message and "--port" in message


def test_a_bad_block_is_named_in_health_and_in_the_run_list(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "a"
    write_blocks(run, 3)
    block = run / "rollouts" / "block-000001.parquet"
    block.write_bytes(block.read_bytes()[:100])
    con = connect(":memory:")
    service = SyncService(con.cursor(), [tmp_path / "runs"])
    service.sync_all()
    api = TestClient(create_app(con, service), base_url="http://localhost")
    health = api.get("/api/health").json()
    assert [(b["run_id"], b["stream"], b["file"]) for b in health["bad_blocks"]] == [
        (run_id_for(run), "rollouts", "rollouts/block-000001.parquet")
    ]
    assert health["bad_blocks"][0]["error"]
    (listed,) = api.get("/api/runs").json()["runs"]
    assert [b["file"] for b in listed["bad_blocks"]] == ["rollouts/block-000001.parquet"]
    assert api.get(f"/api/runs/{run_id_for(run)}").json()["counts"]["rollouts"] == 16


def test_the_eta_counts_the_time_of_recent_steps_not_the_warm_start(tmp_path: Path) -> None:
    """A run that spent 10 minutes loading and warm-starting before 6 steps of 0.5 s: 4 steps
    left take 2 s, not 10 minutes / 6 x 4."""
    import json

    run = write_run(tmp_path / "runs" / "a", steps=6, status="running")
    status = json.loads((run / "status.json").read_text())
    status["start_time"] = time.time() - 600
    (run / "status.json").write_text(json.dumps(status))
    con = connect(":memory:")
    service = SyncService(con.cursor(), [tmp_path / "runs"])
    service.sync_all()
    api = TestClient(create_app(con, service), base_url="http://localhost")
    (listed,) = api.get("/api/runs").json()["runs"]
    assert listed["progress"]["eta_s"] == pytest.approx(2.0)
    assert listed["progress"]["runtime_s"] >= 600
    summary = api.get(f"/api/runs/{run_id_for(run)}").json()
    assert summary["run"]["progress"]["eta_s"] == pytest.approx(2.0)
