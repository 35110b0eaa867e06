"""Teardown: daemons stop, then revoke, then discard; shielded, bounded, best effort."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
import trio
import trio.testing

from mokka.daemon.runner import DaemonRunner
from mokka.daemon.supervisor import Supervisor
from mokka.daemon.teardown import teardown
from mokka.errors import ApplyError, HostFaultError, SpecError
from mokka.noderoot.host import Host
from mokka.state.sources.base import SourceUpdate
from tests.fakes import FakeApplier, FakeDaemon, FakeSimulator, MemorySource, make_state
from tests.support import snapshot


def _make_sims(log: list) -> list:
    return [
        FakeApplier("driver", log=log, revoke_delay=3, discard_delay=2),
        FakeApplier("cri", log=log, revoke_delay=1),
        FakeDaemon("fabric", log=log),
        FakeSimulator("imex", log=log, discard_delay=1),
    ]


async def _stage_all(host: Host, sims) -> None:
    for sim in sims:
        await sim.stage(host, make_state(1))
        if hasattr(sim, "apply"):
            await sim.apply(host, make_state(1))


async def test_order_is_daemons_then_revoke_then_discard(
    autojump_clock, host: Host, node_root: Path
):
    before = snapshot(node_root)
    log: list = []
    sims = _make_sims(log)
    await _stage_all(host, sims)
    assert snapshot(node_root) != before
    supervisor = Supervisor(host)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.start(sims[2], make_state(1))
        log.clear()
        start = trio.current_time()
        report = await teardown(host, sims, timeout=25, supervisor=supervisor)
    assert report.clean
    assert not report.timed_out
    assert not sims[2].running
    methods = [(method, name, t - start) for name, method, _gen, t in log]
    # Revokes concurrently at once; discards concurrently after the slowest revoke (3 s).
    # (trio schedules a batch in no fixed order, so compare each step as a set.)
    assert [m for m, *_ in methods] == ["revoke"] * 2 + ["discard"] * 4
    assert set(methods) == {
        ("revoke", "driver", 0),
        ("revoke", "cri", 0),
        ("discard", "driver", 3),
        ("discard", "cri", 3),
        ("discard", "fabric", 3),
        ("discard", "imex", 3),
    }
    assert report.duration == 3 + 2
    assert snapshot(node_root) == before


async def test_a_failing_revoke_stops_neither_the_others_nor_the_discards(
    autojump_clock, host: Host, node_root: Path, caplog: pytest.LogCaptureFixture
):
    before = snapshot(node_root)
    log: list = []
    sims = _make_sims(log)
    sims[1].revoke_errors.append(ApplyError("containerd unreachable"))
    sims[3].discard_errors.append(OSError("busy"))
    await _stage_all(host, sims)

    report = await teardown(host, sims, timeout=25)

    assert not report.clean
    assert not report.timed_out
    assert report.failures == (
        ("revoke", "cri", "ApplyError: containerd unreachable"),
        ("discard", "imex", "OSError: busy"),
    )  # revokes all finish before any discard starts, so this order is fixed
    steps = [(m, n) for n, m, *_ in log if m in ("revoke", "discard")]
    assert [m for m, _n in steps] == ["revoke"] * 2 + ["discard"] * 4
    assert sorted(steps) == [
        ("discard", "cri"),
        ("discard", "driver"),
        ("discard", "fabric"),
        ("discard", "imex"),
        ("revoke", "cri"),
        ("revoke", "driver"),
    ]
    assert "teardown: revoke of cri failed" in caplog.text
    # Everything but the failing steps' artifacts is gone; a second teardown finishes the job.
    assert (node_root / "fake/cri/published").exists()
    assert (node_root / "fake/imex/staged").exists()
    assert not (node_root / "fake/driver").exists()
    assert (await teardown(host, sims, timeout=25)).clean
    assert snapshot(node_root) == before


async def test_an_expected_fault_is_one_line_and_a_bug_keeps_its_traceback(
    autojump_clock, host: Host, caplog: pytest.LogCaptureFixture
):
    """A full or read-only root is not a bug: one warning naming it, no traceback."""
    log: list = []
    sims = _make_sims(log)
    sims[0].revoke_errors.append(
        HostFaultError("gpudriver: /run/nvidia/driver: Read-only file system (EROFS)")
    )
    sims[3].discard_errors.append(RuntimeError("a bug"))
    await _stage_all(host, sims)
    with caplog.at_level(logging.WARNING, logger="mokka.daemon.teardown"):
        report = await teardown(host, sims, timeout=25)
    assert [step for step, *_ in report.failures] == ["revoke", "discard"]
    (fault,) = [r for r in caplog.records if "revoke of driver" in r.getMessage()]
    assert fault.getMessage() == (
        "teardown: revoke of driver failed: "
        "gpudriver: /run/nvidia/driver: Read-only file system (EROFS)"
    )
    assert (fault.levelno, fault.exc_info) == (logging.WARNING, None)
    (bug,) = [r for r in caplog.records if "discard of imex" in r.getMessage()]
    assert bug.exc_info is not None
    assert bug.exc_info[0] is RuntimeError


async def test_deadline_bounds_teardown(
    autojump_clock, host: Host, node_root: Path, caplog: pytest.LogCaptureFixture
):
    before = snapshot(node_root)
    slow = FakeApplier("slow", revoke_delay=100)
    fast = FakeSimulator("fast")
    await _stage_all(host, [slow, fast])
    report = await teardown(host, [slow, fast], timeout=5)
    assert report.timed_out
    assert not report.clean
    assert report.duration == 5
    assert trio.current_time() == 5
    assert fast.calls("discard") == []  # never reached
    assert "deadline of 5s hit" in caplog.text
    assert (await teardown(host, [slow, fast], timeout=500)).clean
    assert snapshot(node_root) == before


def _runner(host: Host, sims, source: MemorySource, **kw) -> DaemonRunner:
    return DaemonRunner(
        host=host, simulators=sims, source=source, health_addr=("127.0.0.1", 0), **kw
    )


async def test_teardown_completes_although_the_main_scope_is_cancelled(
    autojump_clock, host: Host, node_root: Path
):
    before = snapshot(node_root)
    log: list = []
    sims = _make_sims(log)
    source = MemorySource()
    runner = _runner(host, sims, source, handle_signals=False, shutdown_timeout=25)
    with trio.CancelScope() as outer:
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            source.publish(make_state(1))
            await runner.reconciler.passes.wait_value(lambda n: n >= 1)
            assert runner.reconciler.status.last_pass.ok
            assert sims[2].running
            cancelled_at = trio.current_time()
            outer.cancel(reason="test")
    assert outer.cancelled_caught
    report = runner.teardown_report
    assert report is not None
    assert report.clean
    # Shielded: revoke (3 s) and discard (2 s) ran to completion despite the cancel.
    assert trio.current_time() - cancelled_at == 5
    assert not sims[2].running
    assert snapshot(node_root) == before


async def test_stop_tears_down_and_exits_zero(autojump_clock, host: Host, node_root: Path):
    before = snapshot(node_root)
    sims = _make_sims([])
    source = MemorySource()
    runner = _runner(host, sims, source, handle_signals=False)
    codes: list[int] = []
    async with trio.open_nursery() as nursery:

        async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
            codes.append(await runner.run(task_status=task_status))

        await nursery.start(run)
        source.publish(make_state(1))
        await runner.reconciler.passes.wait_value(lambda n: n >= 1)
        runner.stop("test is done")
    assert codes == [0]
    assert runner.teardown_report.clean
    assert snapshot(node_root) == before


async def test_sigterm_in_process_tears_down_and_exits_zero(
    autojump_clock, host: Host, node_root: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO)
    before = snapshot(node_root)
    sims = _make_sims([])
    source = MemorySource()
    runner = _runner(host, sims, source, handle_signals=True)
    codes: list[int] = []
    async with trio.open_nursery() as nursery:

        async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
            codes.append(await runner.run(task_status=task_status))

        await nursery.start(run)
        source.publish(make_state(1))
        await runner.reconciler.passes.wait_value(lambda n: n >= 1)
        os.kill(os.getpid(), signal.SIGTERM)
    assert codes == [0]
    assert "received SIGTERM; tearing down" in caplog.text
    assert snapshot(node_root) == before


async def test_a_failing_task_tears_down_and_exits_one(
    autojump_clock, host: Host, node_root: Path, caplog: pytest.LogCaptureFixture
):
    before = snapshot(node_root)
    log: list = []
    sims = _make_sims(log)
    # The source publishes a first state, then dies: the daemon must not stay half-up.
    source = MemorySource(
        initial=[SourceUpdate(state=make_state(1))],
        fail_with=RuntimeError("inotify limit reached"),
    )
    runner = _runner(host, sims, source, handle_signals=False)
    code = await runner.run()
    assert code == 1
    assert "the daemon failed; tearing down" in caplog.text
    assert "inotify limit reached" in caplog.text
    assert [m for _n, m, *_ in log if m in ("revoke", "discard")] == [
        "revoke",
        "revoke",
        "discard",
        "discard",
        "discard",
        "discard",
    ]
    assert runner.teardown_report.clean
    assert snapshot(node_root) == before


async def test_a_spec_error_from_the_source_tears_down_and_exits_two(
    autojump_clock, host: Host, node_root: Path, caplog: pytest.LogCaptureFixture
):
    before = snapshot(node_root)
    log: list = []
    sims = _make_sims(log)
    source = MemorySource(fail_with=SpecError("--source control-plane: not implemented"))
    runner = _runner(host, sims, source, handle_signals=False)
    assert await runner.run() == 2
    assert "invalid input; tearing down: --source control-plane: not implemented" in caplog.text
    assert sorted(m for _n, m, *_ in log) == ["discard"] * 4 + ["revoke"] * 2
    assert snapshot(node_root) == before
