"""Daemon supervision: start once, reload, restart with backoff, not ready meanwhile."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from mokka.daemon.backoff import Backoff
from mokka.daemon.supervisor import DaemonExited, Supervisor
from mokka.noderoot.host import Host
from mokka.simulators.base import Readiness
from tests.fakes import FakeDaemon, make_state
from tests.support import snapshot


def test_backoff_schedule_is_capped():
    backoff = Backoff(initial=1, factor=2, cap=30)
    assert [backoff.delay(n) for n in range(0, 8)] == [0, 1, 2, 4, 8, 16, 30, 30]
    assert backoff.delay(10_000) == 30  # no overflow on a long outage


async def test_crashing_daemon_restarts_with_backoff_and_is_not_ready(
    autojump_clock, host: Host, node_root: Path
):
    daemon = FakeDaemon("fm", crash_after=[0, 0, 0, 0], crash_error=RuntimeError("lost the socket"))
    supervisor = Supervisor(host, backoff=Backoff(initial=1, factor=2, cap=30))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.start(daemon, make_state(1))
        await trio.testing.wait_all_tasks_blocked()
        # Crashed at once; the restart is due in 1 s and the simulator is not ready.
        assert trio.current_time() == 0
        readiness = supervisor.readiness(daemon)
        assert readiness == Readiness.not_ready(
            "daemon crashed: RuntimeError: lost the socket, restarting in 1s"
        )
        status = supervisor.status.daemons["fm"]
        assert (status.phase, status.restart_at, status.restarts) == ("crashed", 1, 0)

        await trio.sleep(1.5)
        assert supervisor.readiness(daemon).reason.endswith("restarting in 2s")

        await trio.sleep(100)
        # Restarts after 1, 2, 4, 8 s of backoff; the fifth run stays up.
        assert daemon.started_at == [0, 1, 3, 7, 15]
        assert daemon.running
        assert supervisor.readiness(daemon) == Readiness.ok()
        assert supervisor.status.daemons["fm"].phase == "running"
        assert supervisor.status.daemons["fm"].restarts == 4
        nursery.cancel_scope.cancel()
    assert not daemon.running
    assert supervisor.status.daemons["fm"].phase == "stopped"
    assert snapshot(node_root) == {}


async def test_restart_runs_on_the_newest_state_and_skips_reload_while_down(
    autojump_clock, host: Host
):
    daemon = FakeDaemon("ib", crash_after=[1])
    supervisor = Supervisor(host)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.start(daemon, make_state(1))
        await supervisor.reload(daemon, make_state(2))
        assert daemon.reloaded == [2]
        await trio.sleep(1.5)  # crashed at 1, restart due at 2
        await supervisor.reload(daemon, make_state(3))
        assert daemon.reloaded == [2]  # nothing live to reload
        await trio.sleep(1)
        assert [(c[2], c[3]) for c in daemon.calls("run")] == [(1, 0), (3, 2)]
        nursery.cancel_scope.cancel()


async def test_a_stable_run_resets_the_backoff(autojump_clock, host: Host):
    daemon = FakeDaemon("kl", crash_after=[0, 0, 100, 0])
    supervisor = Supervisor(host, backoff=Backoff(initial=1, factor=2, cap=30), stable_after=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.start(daemon, make_state(1))
        await trio.sleep(500)
        # Crash at 0 → 1 (1 s); at 1 → 3 (2 s); up for 100 s, crash at 103 → 104
        # (back to 1 s, not 4 s); crash at 104 → 106 (2 s); the fifth run stays up.
        assert daemon.started_at == [0, 1, 3, 104, 106]
        nursery.cancel_scope.cancel()


async def test_start_failure_surfaces_in_the_caller(autojump_clock, host: Host):
    daemon = FakeDaemon("fm", start_errors=[OSError("address in use")], start_delay=2)
    supervisor = Supervisor(host)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        with pytest.raises(OSError, match="address in use"):
            await supervisor.start(daemon, make_state(1))
        assert trio.current_time() == 2
        assert not supervisor.is_started("fm")
        assert "fm" not in supervisor.status.daemons
        # The next try starts it for good, exactly once.
        await supervisor.start(daemon, make_state(1))
        assert supervisor.is_started("fm")
        assert daemon.running
        with pytest.raises(RuntimeError, match="already started"):
            await supervisor.start(daemon, make_state(1))
        assert len(daemon.started_at) == 1
        nursery.cancel_scope.cancel()


async def test_a_run_that_returns_is_restarted_like_a_crash(autojump_clock, host: Host):
    class Quitter(FakeDaemon):
        async def run(self, host, state, *, task_status=trio.TASK_STATUS_IGNORED):
            self._record("run", state)
            task_status.started()

    daemon = Quitter("quitter")
    supervisor = Supervisor(host, backoff=Backoff(initial=5, cap=5))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.start(daemon, make_state(1))
        await trio.testing.wait_all_tasks_blocked()
        assert supervisor.status.daemons["quitter"].error == "DaemonExited: quitter: run returned"
        assert issubclass(DaemonExited, Exception)
        await trio.sleep(12)
        assert [c[3] for c in daemon.calls("run")] == [0, 5, 10]
        nursery.cancel_scope.cancel()


async def test_stop_cancels_every_daemon(autojump_clock, host: Host):
    daemons = [FakeDaemon("a"), FakeDaemon("b")]
    supervisor = Supervisor(host)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        for d in daemons:
            await supervisor.start(d, make_state(1))
        assert all(d.running for d in daemons)
        supervisor.stop()
        await supervisor.wait_stopped()
        assert not any(d.running for d in daemons)
        assert {n: s.phase for n, s in supervisor.status.daemons.items()} == {
            "a": "stopped",
            "b": "stopped",
        }
        assert supervisor.readiness(daemons[0]) == Readiness.not_ready("daemon stopped")
    with pytest.raises(RuntimeError, match="not running"):
        await supervisor.start(FakeDaemon("c"), make_state(1))
