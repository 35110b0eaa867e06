"""The reconcile pass (stage → barrier → supervise → apply) and the reconcile loop."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trio.lowlevel
import trio.testing
import trio_util

import mokka.noderoot.convergence
from mokka.daemon.backoff import Backoff
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.supervisor import Supervisor
from mokka.daemon.teardown import teardown
from mokka.daemon.waves import Replays
from mokka.errors import SpecError, StageError
from mokka.noderoot.host import File, Host
from tests.fakes import FakeApplier, FakeDaemon, FakeSimulator, MemorySource, make_state
from tests.support import snapshot


@attrs.define
class Harness:
    source: MemorySource
    reconciler: Reconciler
    supervisor: Supervisor

    async def passes(self, count: int) -> None:
        await self.reconciler.passes.wait_value(lambda n: n >= count)


async def inline(fn):
    """The drift check in the trio thread: under autojump no worker thread can be outrun."""
    return fn()


@asynccontextmanager
async def running(
    host: Host, sims, *, backoff: Backoff | None = None, repair_interval: float = 0.0
) -> AsyncIterator[Harness]:
    """A supervisor, a reconcile loop and a ``MemorySource``, torn down like the daemon does."""
    source = MemorySource()
    updates: trio_util.AsyncValue = trio_util.AsyncValue(None)
    supervisor = Supervisor(host)
    reconciler = Reconciler(
        host, sims, supervisor=supervisor, backoff=backoff or Backoff(),
        repair_interval=repair_interval, replays=Replays(offload=inline),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await nursery.start(reconciler.run, updates)
        await nursery.start(source.run, updates)
        yield Harness(source, reconciler, supervisor)
        nursery.cancel_scope.cancel()
    report = await teardown(host, sims, timeout=10)
    assert report.clean, report


# ---- one pass -------------------------------------------------------------


async def test_stage_errors_of_several_simulators_are_all_reported(
    autojump_clock, host: Host, node_root: Path
):
    before = snapshot(node_root)
    log: list = []
    good = FakeSimulator("good", log=log)
    bad1 = FakeSimulator("bad1", log=log, stage_errors=[StageError("disk full")], stage_delay=2)
    bad2 = FakeSimulator("bad2", log=log, stage_errors=[ValueError("bug")], stage_delay=1)
    reconciler = Reconciler(host, [good, bad1, bad2])

    result = await reconciler.reconcile_once(make_state(1))

    assert result.outcome == "stage-failed"
    assert {(o.name, o.error) for o in result.failures} == {
        ("bad1", "StageError: disk full"),
        ("bad2", "ValueError: bug"),
    }
    # All ran in parallel: the wave took as long as the slowest, not the sum.
    assert result.duration == 2
    assert [o.name for o in result.stage] == ["good", "bad1", "bad2"]
    assert result.stage[0].ok
    assert good.staged == [1]
    assert result.retry_delay == 1.0
    assert not result.terminal
    assert reconciler.status.stage_failures == result.failures
    assert reconciler.status.failures_total == {("bad1", "stage"): 1, ("bad2", "stage"): 1}
    assert (await teardown(host, [good, bad1, bad2], timeout=5)).clean
    assert snapshot(node_root) == before


async def test_barrier_blocks_daemons_and_apply(autojump_clock, host: Host, node_root: Path):
    before = snapshot(node_root)
    failing = FakeSimulator("failing", stage_errors=[StageError("nope")])
    applier = FakeApplier("applier")
    daemon = FakeDaemon("daemon")
    supervisor = Supervisor(host)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        reconciler = Reconciler(host, [failing, applier, daemon], supervisor=supervisor)
        result = await reconciler.reconcile_once(make_state(1))
        assert result.outcome == "stage-failed"
        assert result.supervise == ()
        assert result.apply == ()
        assert applier.calls("apply") == []
        assert daemon.calls("run") == []
        assert not supervisor.is_started("daemon")
        # The node is staged but not published.
        assert (node_root / "fake/applier/staged").exists()
        assert not (node_root / "fake/applier/published").exists()

        # Next pass succeeds: now the daemon starts and the applier publishes.
        result = await reconciler.reconcile_once(make_state(1))
        assert result.ok, result.summary()
        assert daemon.calls("run") != []
        assert applier.applied == [1]
        nursery.cancel_scope.cancel()
    assert (await teardown(host, [failing, applier, daemon], timeout=5)).clean
    assert snapshot(node_root) == before


async def test_apply_fails_fast_and_cancels_the_sibling(
    autojump_clock, host: Host, node_root: Path
):
    before = snapshot(node_root)
    fast_fail = FakeApplier("fast", apply_delay=1, apply_errors=[RuntimeError("containerd down")])
    slow = FakeApplier("slow", apply_delay=5)
    reconciler = Reconciler(host, [fast_fail, slow])

    result = await reconciler.reconcile_once(make_state(1))

    assert result.outcome == "apply-failed"
    by_name = {o.name: o for o in result.apply}
    assert by_name["fast"].failed
    assert by_name["fast"].error == "RuntimeError: containerd down"
    assert by_name["slow"].cancelled
    assert not by_name["slow"].failed
    assert [o.name for o in result.failures] == ["fast"]
    assert slow.applied == []
    assert result.duration == 1  # the sibling did not run its 5 s
    assert trio.current_time() == 1
    assert (await teardown(host, [fast_fail, slow], timeout=5)).clean
    assert snapshot(node_root) == before


async def test_spec_error_in_stage_is_terminal(autojump_clock, host: Host, node_root: Path):
    sim = FakeSimulator(
        "sim", stage_errors=[SpecError("profile.yaml: devices: empty, expected a list")]
    )
    result = await Reconciler(host, [sim]).reconcile_once(make_state(1))
    assert result.terminal
    assert result.retry_delay is None
    assert result.failures[0].error.startswith("SpecError: profile.yaml: devices")
    assert (await teardown(host, [sim], timeout=5)).clean
    assert snapshot(node_root) == {}


def test_simulator_names_must_be_unique(host: Host):
    with pytest.raises(ValueError, match="repeated: twin"):
        Reconciler(host, [FakeSimulator("twin"), FakeSimulator("twin")])


# ---- the loop ---------------------------------------------------------------


async def test_daemons_start_once_then_receive_reload(autojump_clock, host: Host, node_root: Path):
    before = snapshot(node_root)
    daemon = FakeDaemon("daemon")
    applier = FakeApplier("applier")
    async with running(host, [daemon, applier]) as h:
        for generation in (1, 2, 3):
            h.source.publish(make_state(generation))
            await h.passes(generation)
        assert [c[2] for c in daemon.calls("run")] == [1]
        assert daemon.reloaded == [2, 3]
        assert applier.applied == [1, 2, 3]
        assert h.supervisor.status.daemons["daemon"].phase == "running"
        assert [o.name for o in h.reconciler.status.last_pass.supervise] == ["daemon"]
    assert not daemon.running
    assert snapshot(node_root) == before


async def test_a_burst_of_100_updates_mid_stage_yields_one_pass_over_the_newest(
    autojump_clock, host: Host, node_root: Path
):
    """Updates arriving while a pass stages supersede it: the stale stage is
    abandoned at once (nothing is visible before the barrier), and the one
    pass that completes is over the newest state, one stage delay later."""
    before = snapshot(node_root)
    sim = FakeSimulator("sim", stage_delay=1)
    async with running(host, [sim]) as h:
        h.source.publish(make_state(1))
        await trio.testing.wait_all_tasks_blocked()  # the first pass is staging
        for generation in range(2, 101):
            h.source.publish(make_state(generation))
            await trio.lowlevel.checkpoint()
        await h.passes(1)
        await trio.sleep(30)  # idle: no further pass is owed
        stages = [c[2] for c in sim.calls("stage")]
        assert (stages[0], stages[-1]) == (1, 100)
        assert sim.staged == [100]
        assert h.reconciler.passes.value == 1
        assert h.reconciler.status.last_pass.generation == 100
        assert h.reconciler.status.last_pass.started_at == 0
        assert h.reconciler.status.observed_generation == 100
        assert h.reconciler.status.seen_generation == 100
    assert snapshot(node_root) == before


async def test_a_change_mid_stage_does_not_wait_for_the_stale_pass(
    autojump_clock, host: Host, node_root: Path
):
    """8 -> 4 GPUs arriving 1 s into a 5 s stage: converged 5 s after the
    change (one stage), not 9 s (the rest of the stale pass, then its own)."""
    sim = FakeSimulator("sim", stage_delay=5)
    async with running(host, [sim]) as h:
        h.source.publish(make_state(1))
        await trio.sleep(1)
        h.source.publish(make_state(2))
        await h.passes(1)
        assert trio.current_time() == 6
        assert sim.staged == [2]
        assert h.reconciler.status.last_pass.outcome == "ok"
        # The superseded stage is no failure and left no retry behind.
        await trio.sleep(120)
        assert h.reconciler.passes.value == 1
        assert h.reconciler.status.phase == "idle"


@attrs.define(eq=False)
class ThreadedStager(FakeSimulator):
    """Stages ``count`` files in one converge in a worker thread, as the real simulators do."""

    count: int = 50

    async def stage(self, host: Host, state) -> None:
        self._record("stage", state)
        files = [File(f"/fake/{self.name}/{i}", f"{state.generation}\n")
                 for i in range(self.count)]
        await trio.to_thread.run_sync(host.converge, self.name, files)
        self.staged.append(state.generation)


async def test_a_converge_in_a_worker_thread_gives_way_to_a_newer_input(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """Cancellation cannot reach a worker thread: the stale converge stops at its next
    path instead of placing the other 49, the newer input's pass converges the node,
    and no failure is logged for the pass that gave way."""
    placing, proceed = threading.Event(), threading.Event()
    placed: list[tuple[str, bytes]] = []
    real_put = mokka.noderoot.convergence.Convergence.put

    def put(self, art, norm):
        placed.append((norm, art.content))
        if art.content == b"1\n" and not placing.is_set():
            placing.set()  # the stale pass is placing its first path: hold it there
            assert proceed.wait(30)
        return real_put(self, art, norm)

    monkeypatch.setattr(mokka.noderoot.convergence.Convergence, "put", put)
    before = snapshot(node_root)
    sim = ThreadedStager("sim")
    with trio.fail_after(60):
        async with running(host, [sim]) as h:
            h.source.publish(make_state(1))
            assert await trio.to_thread.run_sync(placing.wait, 30)
            h.source.publish(make_state(2))
            await trio.testing.wait_all_tasks_blocked()  # the loop has told it to give way
            proceed.set()
            await h.passes(1)
            assert sim.staged == [2]
            assert [c for _n, c in placed].count(b"1\n") == 1
            assert [c for _n, c in placed].count(b"2\n") == 50
            assert {(node_root / f"fake/sim/{i}").read_bytes() for i in range(50)} == {b"2\n"}
            assert h.reconciler.status.last_pass.generation == 2
            assert h.reconciler.status.last_pass.outcome == "ok"
    assert "failed" not in caplog.text
    assert snapshot(node_root) == before


async def test_a_change_after_the_barrier_lets_the_pass_finish(
    autojump_clock, host: Host, node_root: Path
):
    """Past the barrier nothing gives way (daemons and applied specs are not
    left half done): the change waits for the pass, then gets its own."""
    sim = FakeSimulator("sim")
    applier = FakeApplier("applier", apply_delay=5)
    async with running(host, [sim, applier]) as h:
        h.source.publish(make_state(1))
        await trio.sleep(1)  # applying
        h.source.publish(make_state(2))
        await h.passes(2)
        assert applier.applied == [1, 2]
        assert trio.current_time() == 10


async def test_passes_keep_completing_under_a_change_every_200_ms(
    autojump_clock, host: Host, node_root: Path
):
    """An input that never stops changing (every 200 ms, a pass takes 300 ms)
    supersedes passes only for ``supersede_window``: then the pass in flight
    finishes, so one completes at least once a second for the whole minute,
    each over a newer state, and the node converges to the last state one
    pass after the changes stop."""
    before = snapshot(node_root)
    sim = FakeSimulator("sim", stage_delay=0.3)
    finished: list[tuple[float, int]] = []
    with trio.fail_after(120):  # virtual seconds
        await _change_every_200_ms(host, sim, finished)
    assert snapshot(node_root) == before


async def _change_every_200_ms(host: Host, sim, finished: list[tuple[float, int]]) -> None:
    async with running(host, [sim]) as h:

        async def record_passes() -> None:
            count = 0
            while True:
                count = await h.reconciler.passes.wait_value(lambda n, c=count: n > c)
                finished.append((trio.current_time(), h.reconciler.status.last_pass.generation))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(record_passes)
            generations = range(1, 301)
            for generation in generations:
                h.source.publish(make_state(generation))
                await trio.sleep(0.2)
            last_change = trio.current_time() - 0.2
            await h.reconciler.passes.wait_value(
                lambda _n: h.reconciler.status.observed_generation == generations[-1]
            )
            converged = trio.current_time()
            await trio.sleep(30)  # idle: no further pass is owed
            nursery.cancel_scope.cancel()
        times = [0.0] + [t for t, _g in finished]
        assert max(b - a for a, b in itertools.pairwise(times)) <= 1.0
        done = [g for _t, g in finished]
        assert done == sorted(set(done))  # every pass over a newer state than the last
        assert done[-1] == generations[-1]
        assert sim.staged[-1] == generations[-1]
        assert h.reconciler.status.last_pass.outcome == "ok"
        assert converged - last_change <= 0.3 + 0.3  # the pass in flight, then its own
        assert h.reconciler.status.phase == "idle"


async def test_a_burst_before_the_loop_wakes_yields_one_pass(
    autojump_clock, host: Host, node_root: Path
):
    sim = FakeSimulator("sim")
    async with running(host, [sim]) as h:
        for generation in range(1, 101):
            h.source.publish(make_state(generation))
        await h.passes(1)
        await trio.testing.wait_all_tasks_blocked()
        assert sim.staged == [100]
        assert h.reconciler.status.passes_total == 1
    assert snapshot(node_root) == {}


async def test_failed_pass_retries_with_capped_backoff_without_new_state(
    autojump_clock, host: Host, node_root: Path
):
    before = snapshot(node_root)
    errors = [StageError(f"attempt {i}") for i in range(6)]
    sim = FakeSimulator("sim", stage_errors=errors)
    async with running(host, [sim], backoff=Backoff(initial=1, factor=2, cap=8)) as h:
        h.source.publish(make_state(1))
        await h.passes(7)
        # 1, 2, 4, 8, then capped at 8, 8: the seventh try succeeds.
        assert [c[3] for c in sim.calls("stage")] == [0, 1, 3, 7, 15, 23, 31]
        assert sim.staged == [1]
        assert h.reconciler.status.last_pass.ok
        assert h.reconciler.status.passes_by_outcome == {"stage-failed": 6, "ok": 1}
        # Converged: nothing more happens, however long we wait.
        await trio.sleep(1000)
        assert len(sim.calls("stage")) == 7
    assert snapshot(node_root) == before


async def test_retry_delay_is_reported_in_the_pass_result(
    autojump_clock, host: Host, node_root: Path
):
    sim = FakeSimulator("sim", stage_errors=[StageError("a"), StageError("b")])
    async with running(host, [sim], backoff=Backoff(initial=3, factor=2, cap=60)) as h:
        h.source.publish(make_state(1))
        await h.passes(1)
        assert h.reconciler.status.last_pass.retry_delay == 3
        assert h.reconciler.status.phase == "backoff"
        await h.passes(2)
        assert h.reconciler.status.last_pass.retry_delay == 6
        assert trio.current_time() == 3
        await h.passes(3)
        assert h.reconciler.status.last_pass.retry_delay is None
        assert trio.current_time() == 9
        assert h.reconciler.status.phase == "idle"
    assert snapshot(node_root) == {}


async def test_new_input_cuts_the_backoff_short(autojump_clock, host: Host, node_root: Path):
    sim = FakeSimulator("sim", stage_errors=[StageError("broken")])
    async with running(host, [sim], backoff=Backoff(initial=100)) as h:
        h.source.publish(make_state(1))
        await h.passes(1)
        await trio.sleep(5)
        h.source.publish(make_state(2))
        await h.passes(2)
        assert [(c[2], c[3]) for c in sim.calls("stage")] == [(1, 0), (2, 5)]
        assert sim.staged == [2]
    assert snapshot(node_root) == {}


async def test_spec_error_waits_for_new_input(autojump_clock, host: Host, node_root: Path):
    sim = FakeSimulator("sim", stage_errors=[SpecError("bad profile")])
    async with running(host, [sim]) as h:
        h.source.publish(make_state(1))
        await h.passes(1)
        await trio.sleep(3600)
        assert len(sim.calls("stage")) == 1
        assert h.reconciler.status.phase == "terminal"
        # The same input again (a resync) does not retry either.
        h.source.publish(make_state(1))
        await trio.testing.wait_all_tasks_blocked()
        assert len(sim.calls("stage")) == 1
        h.source.publish(make_state(2))
        await h.passes(2)
        assert sim.staged == [2]
        assert trio.current_time() == 3600
    assert snapshot(node_root) == {}


async def test_unchanged_state_after_success_causes_no_pass(
    autojump_clock, host: Host, node_root: Path
):
    sim = FakeSimulator("sim")
    async with running(host, [sim]) as h:
        h.source.publish(make_state(1))
        await h.passes(1)
        # A resync re-reads the same inputs: same content hash.
        h.source.publish(make_state(1))
        h.source.publish(make_state(7, content_hash="hash-1"))
        await trio.sleep(60)
        assert len(sim.calls("stage")) == 1
        assert h.reconciler.status.passes_total == 1
    assert snapshot(node_root) == {}


def wipe(root: Path) -> None:
    for path in sorted(root.rglob("*"), key=lambda p: -len(p.parts)):
        path.unlink() if path.is_file() else path.rmdir()


async def test_an_unchanged_resync_repairs_drift_once_the_interval_passed(
    autojump_clock, host: Host, node_root: Path
):
    sim = FakeSimulator("sim")
    async with running(host, [sim], repair_interval=60) as h:
        h.source.publish(make_state(1))
        await h.passes(1)
        staged = snapshot(node_root)
        wipe(node_root)  # drift: someone removes what the simulator staged
        await trio.sleep(30)
        h.source.publish(make_state(1))  # a resync before the interval: no pass
        await trio.testing.wait_all_tasks_blocked()
        assert h.reconciler.status.passes_total == 1
        await trio.sleep(30)
        h.source.publish(make_state(1))  # 60 s after the good pass: repair
        await h.passes(2)
        assert trio.current_time() == 60
        assert [c[3] for c in sim.calls("stage")] == [0, 60]
        assert snapshot(node_root) == staged
    assert snapshot(node_root) == {}


async def test_a_pass_that_takes_time_still_repairs_at_the_next_resync(
    autojump_clock, host: Host, node_root: Path
):
    """The source's resync timer runs from its read, before the pass that read
    starts and long before a slow pass ends: drift must still be repaired at the
    next resync, not every other one (a repair pass is slow too)."""
    sim = FakeSimulator("sim", stage_delay=5)
    async with running(host, [sim], repair_interval=60) as h:
        h.source.publish(make_state(1))
        await h.passes(1)
        assert trio.current_time() == 5
        staged = snapshot(node_root)
        wipe(node_root)
        await trio.sleep(55)
        h.source.publish(make_state(1))  # the resync, 60 s after the read
        with trio.fail_after(10):  # virtual seconds: fails instead of waiting forever
            await h.passes(2)
        wipe(node_root)  # drift again: the next resync must see it too
        await trio.sleep(55)  # the repair pass took 5 s again
        h.source.publish(make_state(1))
        with trio.fail_after(10):
            await h.passes(3)
        assert [c[3] for c in sim.calls("stage")] == [0, 60, 120]
        assert snapshot(node_root) == staged
    assert snapshot(node_root) == {}


async def test_source_error_keeps_the_last_good_state(autojump_clock, host: Host, node_root: Path):
    sim = FakeSimulator("sim")
    async with running(host, [sim]) as h:
        state = make_state(1)
        h.source.publish(state)
        await h.passes(1)
        h.source.publish(
            state, error=SpecError("overrides.yaml: all.temp: 'hot', expected a number")
        )
        await trio.testing.wait_all_tasks_blocked()
        status = h.reconciler.status
        assert status.source_error == "overrides.yaml: all.temp: 'hot', expected a number"
        assert status.source_errors_total == 1
        assert status.passes_total == 1
        # The error clears with the next good update.
        h.source.publish(make_state(2))
        await h.passes(2)
        assert h.reconciler.status.source_error is None
        assert h.reconciler.status.source_errors_total == 1
    assert snapshot(node_root) == {}


async def test_no_state_yet_means_no_pass(autojump_clock, host: Host, node_root: Path):
    sim = FakeSimulator("sim")
    async with running(host, [sim]) as h:
        h.source.publish(None, error=SpecError("profile.yaml: version: missing, expected 1"))
        await trio.sleep(100)
        assert sim.calls("stage") == []
        assert h.reconciler.status.phase == "waiting"
        assert h.reconciler.status.source_error is not None
    assert snapshot(node_root) == {}


async def test_daemon_start_failure_fails_the_pass_and_is_retried(
    autojump_clock, host: Host, node_root: Path
):
    before = snapshot(node_root)
    daemon = FakeDaemon("daemon", start_errors=[RuntimeError("socket in use")])
    applier = FakeApplier("applier")
    async with running(host, [daemon, applier]) as h:
        h.source.publish(make_state(1))
        await h.passes(1)
        first = h.reconciler.status.last_pass
        assert first.outcome == "supervise-failed"
        assert first.failures[0].error == "RuntimeError: socket in use"
        assert first.apply == ()
        assert applier.applied == []
        assert not h.supervisor.is_started("daemon")
        await h.passes(2)
        assert h.reconciler.status.last_pass.ok
        assert trio.current_time() == 1
        assert daemon.started_at == [1]
        assert applier.applied == [1]
    assert snapshot(node_root) == before


async def test_one_canonical_log_line_per_pass(
    autojump_clock, host: Host, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="mokka.daemon.reconciler")
    sim = FakeSimulator("sim", stage_errors=[StageError("x")])
    async with running(host, [sim]) as h:
        h.source.publish(make_state(4))
        await h.passes(2)
    lines = [r for r in caplog.records if r.getMessage().startswith("reconcile pass")]
    assert [r.getMessage() for r in lines] == ["reconcile pass stage-failed", "reconcile pass ok"]
    assert [(r.generation, r.stage_failed, r.staged, r.retry_in_s) for r in lines] == [
        (4, 1, 0, 1.0),
        (4, 0, 1, None),
    ]
    assert lines[0].duration_s == 0


@attrs.define(eq=False)
class RetractingSimulator(FakeSimulator):
    """A simulator that also retracts (like the CDI specs) before the Stage wave."""

    retract_errors: list[BaseException | None] = attrs.field(factory=list)

    async def retract(self, host: Host, state) -> None:
        self._record("retract", state)
        await trio.sleep(1)  # slow on purpose: no stage may start meanwhile
        if self.retract_errors and (error := self.retract_errors.pop(0)) is not None:
            raise error


async def test_retract_runs_before_any_stage_and_its_failure_is_a_stage_failure(
    autojump_clock, host: Host, node_root: Path
):
    log: list = []
    retracting = RetractingSimulator("cri", log=log, retract_errors=[None, StageError("cannot")])
    other = FakeSimulator("gpudriver", log=log)
    reconciler = Reconciler(host, [retracting, other])
    first = await reconciler.reconcile_once(make_state(1))
    assert first.ok
    # retract at 0, then both stages (in either order) at 1: nothing staged while retracting
    calls = [(c[0], c[1], c[3]) for c in log]
    assert calls[0] == ("cri", "retract", 0)
    assert sorted(calls[1:]) == [("cri", "stage", 1), ("gpudriver", "stage", 1)]
    log.clear()
    second = await reconciler.reconcile_once(make_state(2))
    assert not second.ok
    failed = {o.name: o.error for o in second.failures}
    assert failed == {"cri": "StageError: cannot"}
    # the failing retractor's stage did not run; the others' did
    assert [(c[0], c[1]) for c in log] == [("cri", "retract"), ("gpudriver", "stage")]
    report = await teardown(host, [retracting, other], timeout=10)
    assert report.clean
    assert snapshot(node_root) == {}


# ---- observed generation and requested repairs ------------------------------


async def test_an_input_that_returns_to_the_last_pass_s_content_is_observed(
    autojump_clock, host: Host
):
    """A → B → A while the pass over A runs: the loop skips the second A (the node
    already is A), and ``observed_generation`` catches up with ``seen_generation``
    instead of lagging behind it with the daemon idle."""
    sim = FakeSimulator("sim", stage_delay=5)
    async with running(host, [sim]) as h:
        h.source.publish(make_state(1, content_hash="A"))
        await trio.sleep(1)  # the pass over generation 1 is under way
        h.source.publish(make_state(2, content_hash="B"))
        h.source.publish(make_state(3, content_hash="A"))
        await h.passes(1)
        await trio.sleep(30)  # idle: nothing left to do
        status = h.reconciler.status
        assert h.reconciler.passes.value == 1
        assert (status.phase, status.seen_generation, status.observed_generation) == (
            "idle",
            3,
            3,
        )
        assert status.last_pass.generation == 1


async def test_a_requested_repair_runs_one_pass_over_the_unchanged_state(
    autojump_clock, host: Host
):
    sim = FakeSimulator("sim")
    async with running(host, [sim]) as h:  # no repair interval: drift repair is off
        h.source.publish(make_state(1))
        await h.passes(1)
        h.source.publish(make_state(1))  # an unchanged resync: skipped
        await trio.sleep(10)
        assert h.reconciler.passes.value == 1
        h.reconciler.request_repair()  # SIGHUP
        h.source.publish(make_state(1))  # ...and the re-read it causes
        await h.passes(2)
        h.source.publish(make_state(1))  # the request was used up
        await trio.sleep(10)
        assert h.reconciler.passes.value == 2
        assert sim.staged == [1, 1]


async def test_a_repair_pass_over_the_same_state_reloads_no_daemon(
    autojump_clock, host: Host, node_root: Path
):
    """A reload only hands a daemon its state: the same state again would change nothing
    it serves, and would only wake its loops once a resync interval."""
    daemon = FakeDaemon("daemon")
    async with running(host, [daemon], repair_interval=60) as h:
        h.source.publish(make_state(1))
        await h.passes(1)
        assert daemon.started_at == [0]
        wipe(node_root)  # drift, so the repair pass does work and is no replay of all
        await trio.sleep(60)
        h.source.publish(make_state(1))
        await h.passes(2)
        assert [c[2] for c in daemon.calls("stage")] == [1, 1]
        assert daemon.reloaded == []
        h.source.publish(make_state(2))
        await h.passes(3)
        assert daemon.reloaded == [2]
        await trio.sleep(60)
        h.source.publish(make_state(2))  # nothing drifted: no call at all
        await h.passes(4)
        assert [c[2] for c in daemon.calls("stage")] == [1, 1, 2]
        assert daemon.reloaded == [2]
        assert h.reconciler.status.last_pass.ok
