"""The pool (pre-warmed, bounded, never dirty) and sandbox observability (events, usage)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from telescope.api import events
from telescope.api.sandbox import SandboxError, SandboxLimits
from telescope_sandbox import SandboxPool, SandboxUsage, get_provider
from telescope_sandbox.local import LocalProvider, LocalSandbox


@pytest.fixture
def captured() -> Iterator[list[dict[str, object]]]:
    seen: list[dict[str, object]] = []
    unsubscribe = events.subscribe(seen.append)
    yield seen
    unsubscribe()


def test_pool_prewarms(captured: list[dict[str, object]]) -> None:
    with SandboxPool("local", size=3) as pool:
        assert pool.idle == 3 and pool.created == 3
        assert [e["kind"] for e in captured].count("sandbox.create") == 3


def test_sandbox_is_clean_for_the_next_sample() -> None:
    with SandboxPool("local", size=1) as pool:
        with pool.acquire() as first:
            first.upload("answer.txt", b"from sample 1")
            first.execute("mkdir -p d && echo x > d/f && echo y > $TMPDIR/t")
            first_id = first.sandbox_id
        with pool.acquire() as second:
            assert second.sandbox_id == first_id  # reused...
            listing = second.execute("ls -A; ls -A $TMPDIR").stdout.split()
            assert listing == [".tmp"]  # ...but empty
        assert pool.reused == 2


def test_dirty_sandbox_is_destroyed_not_reused() -> None:
    with SandboxPool("local", size=1) as pool:
        with pool.acquire() as first:
            first.execute("sleep 5", timeout_s=0.5)  # a timeout marks it dirty
            dirty_id = first.sandbox_id
        with pool.acquire() as second:
            assert second.sandbox_id != dirty_id
        assert pool.discarded == 1


def test_bounded_concurrency() -> None:
    with SandboxPool("local", size=1, max_concurrency=2) as pool:
        active = 0
        peak = 0
        lock = threading.Lock()

        def work() -> None:
            nonlocal active, peak
            with pool.acquire() as sb:
                with lock:
                    active += 1
                    peak = max(peak, active)
                sb.execute("sleep 0.3")
                with lock:
                    active -= 1

        threads = [threading.Thread(target=work) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert peak == 2 and pool.leased == 0


@pytest.mark.timeout(60)  # an acquire that never times out hangs here (the lease above is never returned)
def test_acquire_timeout() -> None:
    with SandboxPool("local", size=0, max_concurrency=1, acquire_timeout_s=0.2) as pool, pool.acquire():  # noqa: SIM117
        with pytest.raises(SandboxError, match="no sandbox became free"), pool.acquire():
            pass


def test_events_and_usage(captured: list[dict[str, object]]) -> None:
    usage = SandboxUsage()
    provider = get_provider("local")
    sandbox = provider.create(SandboxLimits(timeout_s=5), usage=usage)
    sandbox.upload("x.py", b"print('hi')")
    sandbox.execute("python3 x.py")
    sandbox.execute("exit 2")
    sandbox.execute("sleep 3", timeout_s=0.3)
    sandbox.download("x.py")
    sandbox.destroy()
    kinds = [e["kind"] for e in captured]
    assert kinds == [
        "sandbox.create",
        "sandbox.upload",
        "sandbox.execute",
        "sandbox.execute",
        "sandbox.execute",
        "sandbox.download",
        "sandbox.destroy",
    ]
    create = captured[0]
    assert create["sandbox_id"] == sandbox.sandbox_id and create["provider"] == "local" and create["memory_mb"] == 512
    first = captured[2]
    assert first["command"] == "python3 x.py" and first["exit_code"] == 0 and first["timed_out"] is False
    assert float(first["duration_s"]) > 0  # type: ignore[arg-type]
    usage_fields = first["resource_usage"]
    assert isinstance(usage_fields, dict) and {"cpu_s", "max_rss_mb", "disk_mb"} <= set(usage_fields)
    assert captured[3]["exit_code"] == 2 and captured[4]["timed_out"] is True
    assert first["stdout"] == "hi\n" and first["stderr"] == ""  # output excerpts for the timeline and sandboxes.log
    assert all(e["sandbox_id"] == sandbox.sandbox_id and e["component"] == "sandbox" for e in captured)
    m = usage.as_metrics()
    assert m["sandbox_commands"] == 3 and m["sandbox_command_errors"] == 1 and m["sandbox_timeouts"] == 1
    assert usage.creates == 1 and m["sandbox_command_time_s"] > 0


def test_unknown_provider_says_what_exists() -> None:
    with pytest.raises(SandboxError, match="local"):
        get_provider("nope")


def test_pool_accepts_a_provider_object() -> None:
    with SandboxPool(LocalProvider(), size=0) as pool, pool.acquire() as sb:
        assert sb.execute("echo ok").stdout.strip() == "ok"


def test_output_excerpts_keep_head_and_tail() -> None:
    from telescope_sandbox.observed import output_excerpt

    assert output_excerpt("short") == "short"
    text = "a" * 600 + "MIDDLE" + "z" * 600
    excerpt = output_excerpt(text, limit=1000)
    assert excerpt.startswith("a" * 500) and excerpt.endswith("z" * 500) and "MIDDLE" not in excerpt
    assert "[... 206 characters ...]" in excerpt


class _FailingCleanup(LocalProvider):
    """Local sandboxes whose reset (or destroy) raises, as one with an unremovable tree would."""

    def __init__(self, fail: str) -> None:
        super().__init__()
        self.fail = fail

    def create(self, limits: SandboxLimits | None = None) -> LocalSandbox:
        sandbox = super().create(limits)
        real = getattr(sandbox, self.fail)

        def failing() -> None:
            real()
            raise SandboxError(f"cannot {self.fail} sandbox {sandbox.sandbox_id}: 1 entry could not be removed")

        setattr(sandbox, self.fail, failing)
        return sandbox


def test_a_failed_reset_is_counted_and_the_sandbox_replaced(
    captured: list[dict[str, object]], caplog: pytest.LogCaptureFixture
) -> None:
    usage = SandboxUsage()
    with SandboxPool(_FailingCleanup("reset"), size=1) as pool:
        with pool.acquire(usage) as first:
            first.execute("true")
        with pool.acquire() as second:
            assert second.sandbox_id != first.sandbox_id  # never reused after a failed reset
        assert pool.reset_failures == 2 and pool.discarded == 2 and pool.destroy_failures == 0
    assert usage.as_metrics()["sandbox_errors"] == 1
    resets = [e for e in captured if e["kind"] == "sandbox.reset"]
    assert resets and "could not be removed" in str(resets[0]["error"])
    assert "reset failed" in caplog.text


def test_a_failed_destroy_is_counted_not_swallowed(caplog: pytest.LogCaptureFixture) -> None:
    usage = SandboxUsage()
    with SandboxPool(_FailingCleanup("destroy"), size=1) as pool:
        with pool.acquire(usage) as sb:
            sb.execute("sleep 2", timeout_s=0.2)  # dirty: destroyed on release
        assert pool.destroy_failures == 1 and pool.reset_failures == 0
    assert usage.as_metrics()["sandbox_errors"] == 1 and "destroy failed" in caplog.text
