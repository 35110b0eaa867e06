"""The fabric manager stand-in: the fabric-state directory, the readiness marker's
timing on the autojump clock (exact virtual times), reload, cancellation, and
``mokka fabricmanager-ctl -q``."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from mokka import cli, layout
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.supervisor import Supervisor
from mokka.errors import SpecError, StageError
from mokka.noderoot.host import Host
from mokka.simulators import fabricmanager, registry
from mokka.simulators.base import Daemon, Readiness, Simulator
from mokka.simulators.fabricmanager import (
    PLUGIN,
    FabricManagerSettings,
    FabricManagerSimulator,
)
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.support import ROOT, snapshot, wait_for_count

MARKER = layout.FABRIC_READY_MARKER.lstrip("/")
STATE_DIR = layout.FABRIC_STATE_DIR.lstrip("/")


def make_state(*, nvswitch: bool = True, generation: int = 1) -> State:
    """The built-in h100 profile (HGX, NVSwitch: fabric manager on) or l40s (PCIe only)."""
    return compile_profile("h100" if nvswitch else "l40s", node_name="node-a",
                           generation=generation)


# ---- the re-assert tick --------------------------------------------------------


async def test_a_tick_that_finds_the_marker_in_place_reads_no_manifest(
    host: Host, node_root: Path, autojump_clock: trio.abc.Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An idle fabric manager costs a few ``lstat`` calls per tick: no converge
    (which reads manifests and may rewrite one) while the markers stand, and
    one as soon as a marker is altered."""
    fm = FabricManagerSimulator(settings=FabricManagerSettings(init_delay=0.0))
    state = make_state()
    await fm.stage(host, state)
    converges: list[str] = []
    real_converge = Host.converge

    def counting(self: Host, owner: str, artifacts) -> object:
        converges.append(owner)
        return real_converge(self, owner, artifacts)

    async with trio.open_nursery() as nursery:
        await nursery.start(fm.run, host, state)
        monkeypatch.setattr(Host, "converge", counting)
        await trio.sleep(20.5)  # ten ticks
        assert converges == []
        os.chmod(node_root / MARKER, 0o600)  # altered, not deleted
        await wait_for_count(fm.rewrites, 1)
        assert converges == ["fabricmanager-marker"]
        assert os.stat(node_root / MARKER).st_mode & 0o777 == 0o644
        nursery.cancel_scope.cancel()
    await fm.discard(host)


# ---- stage / discard ---------------------------------------------------------


async def test_stage_gives_exactly_the_fabric_state_directory(host: Host, node_root: Path) -> None:
    before = snapshot(node_root)
    fm = FabricManagerSimulator()
    await fm.stage(host, make_state())
    staged = snapshot(node_root)
    outside = {
        k: v for k, v in staged.items()
        if not k.startswith("var/lib/mokka") and k != ".mokka-created-parents.json"
    }
    assert outside == {
        "var": ("dir", 0o755), "var/lib": ("dir", 0o755), "var/lib/nvml-mock": ("dir", 0o755),
        STATE_DIR: ("dir", 0o755),
    }
    assert not fm.readiness.ready
    assert fm.readiness.reason == "fabric manager not running"
    mtime = os.stat(node_root / STATE_DIR).st_mtime_ns
    await fm.stage(host, make_state())
    assert snapshot(node_root) == staged
    assert os.stat(node_root / STATE_DIR).st_mtime_ns == mtime
    await fm.discard(host)
    assert snapshot(node_root) == before


@pytest.mark.parametrize("profile", ["l40s", "gb200"])
async def test_a_profile_without_nvswitch_stages_nothing(
    host: Host, node_root: Path, profile: str
) -> None:
    # GB200 compute trays reach the NVSwitch trays over the fabric: the fabric
    # manager runs on the switch trays, not on this node.
    before = snapshot(node_root)
    fm = FabricManagerSimulator()
    await fm.stage(host, compile_profile(profile, node_name="node-a"))
    assert snapshot(node_root) == before
    assert fm.readiness.ready
    assert "profile has no NVSwitch" in fm.readiness.reason


# ---- the marker over (virtual) time -------------------------------------------


async def test_the_marker_appears_at_the_init_delay(
    host: Host, node_root: Path, autojump_clock: trio.abc.Clock
) -> None:
    before = snapshot(node_root)
    fm = FabricManagerSimulator(settings=FabricManagerSettings(init_delay=3.0))
    state = make_state()
    await fm.stage(host, state)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fm.run, host, state)
        await fm.phase.wait_value("initializing")
        assert trio.current_time() == 0.0
        await trio.sleep(2.99)
        assert not (node_root / MARKER).exists()
        assert not fm.readiness.ready
        assert "initializing (init delay 3 s)" in fm.readiness.reason
        await fm.phase.wait_value("ready")
        assert trio.current_time() == 3.0
        assert (node_root / MARKER).read_bytes() == b""
        assert fm.readiness.ready
        nursery.cancel_scope.cancel()
    assert not (node_root / MARKER).exists()
    await fm.discard(host)
    assert snapshot(node_root) == before


async def test_started_is_signalled_once_the_marker_exists(
    host: Host, node_root: Path, autojump_clock: trio.abc.Clock
) -> None:
    before = snapshot(node_root)
    fm = FabricManagerSimulator(settings=FabricManagerSettings(init_delay=1.5))
    async with trio.open_nursery() as nursery:
        await nursery.start(fm.run, host, make_state())
        assert trio.current_time() == 1.5
        assert (node_root / MARKER).exists()
        nursery.cancel_scope.cancel()
    await fm.discard(host)
    assert snapshot(node_root) == before


async def test_a_deleted_or_altered_marker_comes_back_at_once_with_no_timer(
    host: Host, node_root: Path, autojump_clock: trio.abc.Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """inotify wakes the fabric manager: no tick while the marker stands, and a
    marker deleted (or its directory removed) is rewritten with no time passing."""
    fm = FabricManagerSimulator(settings=FabricManagerSettings(init_delay=1.0))
    state = make_state()
    await fm.stage(host, state)
    checks: list[int] = []
    real_reassert = fabricmanager._reassert_marker

    def counting(host: Host) -> bool:
        checks.append(1)  # (a worker thread: no trio clock here)
        return real_reassert(host)

    async with trio.open_nursery() as nursery:
        await nursery.start(fm.run, host, state)
        await trio.sleep(0.5)
        monkeypatch.setattr(fabricmanager, "_reassert_marker", counting)
        await trio.sleep(600)  # ten idle minutes: not one check
        assert checks == []
        (node_root / MARKER).unlink()
        await wait_for_count(fm.rewrites, 1)
        assert trio.current_time() == 601.5
        assert (node_root / MARKER).exists()
        os.chmod(node_root / MARKER, 0o600)  # altered, not deleted
        await wait_for_count(fm.rewrites, 2)
        assert os.stat(node_root / MARKER).st_mode & 0o777 == 0o644
        # The directory itself goes: the watch is re-planned and the marker back.
        shutil.rmtree(node_root / STATE_DIR)
        await wait_for_count(fm.rewrites, 3)
        assert (node_root / MARKER).exists()
        # The rewrite's own events cost a check or two, never a loop of them.
        await trio.sleep(600)
        settled = len(checks)
        await trio.sleep(600)
        assert len(checks) == settled <= 9
        nursery.cancel_scope.cancel()
    await fm.discard(host)


async def test_a_deleted_marker_is_reasserted_at_the_next_tick_without_inotify(
    host: Host, node_root: Path, autojump_clock: trio.abc.Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fabricmanager.WatchSet, "open", classmethod(lambda cls: None))
    before = snapshot(node_root)
    fm = FabricManagerSimulator(settings=FabricManagerSettings(init_delay=1.0))
    state = make_state()
    await fm.stage(host, state)
    async with trio.open_nursery() as nursery:
        await nursery.start(fm.run, host, state)
        await trio.sleep(0.5)
        (node_root / MARKER).unlink()  # t = 1.5
        await wait_for_count(fm.rewrites, 1)
        # Ticks run every 2 s from the marker's first write: 3.0 is the next one.
        assert trio.current_time() == 3.0
        assert (node_root / MARKER).exists()
        await trio.sleep(1.9)  # t = 4.9
        (node_root / MARKER).unlink()
        await wait_for_count(fm.rewrites, 2)
        assert trio.current_time() == 5.0
        cancelled_at = trio.current_time()
        nursery.cancel_scope.cancel()
    # Removed on cancellation, with no time passing; the staged directory stays
    # (CDI specs mount it until they are revoked).
    assert trio.current_time() == cancelled_at
    assert not (node_root / MARKER).exists()
    assert (node_root / STATE_DIR).is_dir()
    assert fm.phase.value == "stopped"
    assert not fm.readiness.ready
    await fm.discard(host)
    assert snapshot(node_root) == before


async def test_a_stale_marker_is_removed_before_the_init_delay(
    host: Host, node_root: Path, autojump_clock: trio.abc.Clock
) -> None:
    before = snapshot(node_root)
    fm = FabricManagerSimulator(settings=FabricManagerSettings(init_delay=2.0))
    state = make_state()
    await fm.stage(host, state)
    (node_root / MARKER).write_bytes(b"")  # left by a fabric manager that died
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fm.run, host, state)
        await fm.phase.wait_value("initializing")
        assert not (node_root / MARKER).exists()
        await fm.phase.wait_value("ready")
        assert trio.current_time() == 2.0
        nursery.cancel_scope.cancel()
    await fm.discard(host)
    assert snapshot(node_root) == before


async def test_a_fresh_process_discards_a_marker_a_killed_one_left(
    host: Host, node_root: Path
) -> None:
    before = snapshot(node_root)
    fm = FabricManagerSimulator()
    await fm.stage(host, make_state())
    async with trio.open_nursery() as nursery:
        await nursery.start(fm.run, host, make_state())
        # A killed process runs no finally: simulate by leaving the marker and
        # discarding from a new simulator over the same root.
        nursery.cancel_scope.cancel()
    from mokka.simulators.fabricmanager import _write_marker

    await trio.to_thread.run_sync(_write_marker, host)
    assert (node_root / MARKER).exists()
    await FabricManagerSimulator().discard(Host(node_root))
    assert snapshot(node_root) == before


async def test_reload_disables_and_a_reenable_waits_the_delay_again(
    host: Host, node_root: Path, autojump_clock: trio.abc.Clock
) -> None:
    before = snapshot(node_root)
    fm = FabricManagerSimulator(settings=FabricManagerSettings(init_delay=4.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(fm.run, host, make_state())
        assert trio.current_time() == 4.0
        await trio.sleep(1.0)
        await fm.reload(make_state(nvswitch=False, generation=2))
        await fm.phase.wait_value("off")
        assert trio.current_time() == 5.0
        assert not (node_root / MARKER).exists()
        await trio.sleep(5.0)  # idle: nothing comes back
        assert not (node_root / MARKER).exists()
        await fm.reload(make_state(generation=3))  # t = 10
        await fm.phase.wait_value("ready")
        assert trio.current_time() == 14.0
        assert (node_root / MARKER).exists()
        nursery.cancel_scope.cancel()
    await fm.discard(host)
    assert snapshot(node_root) == before


async def test_disabled_during_the_init_delay_never_writes_the_marker(
    host: Host, node_root: Path, autojump_clock: trio.abc.Clock
) -> None:
    before = snapshot(node_root)
    fm = FabricManagerSimulator(settings=FabricManagerSettings(init_delay=4.0))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fm.run, host, make_state())
        await fm.phase.wait_value("initializing")
        await trio.sleep(1.0)
        await fm.reload(make_state(nvswitch=False, generation=2))
        await fm.phase.wait_value("off")
        assert trio.current_time() == 1.0
        await trio.sleep(10)
        assert not (node_root / MARKER).exists()
        nursery.cancel_scope.cancel()
    await fm.discard(host)
    assert snapshot(node_root) == before


async def test_disabled_at_start_signals_started_at_once(
    host: Host, node_root: Path, autojump_clock: trio.abc.Clock
) -> None:
    before = snapshot(node_root)
    fm = FabricManagerSimulator(settings=FabricManagerSettings(mode="off", init_delay=3.0))
    state = make_state()
    await fm.stage(host, state)
    async with trio.open_nursery() as nursery:
        await nursery.start(fm.run, host, state)
        assert trio.current_time() == 0.0
        assert fm.phase.value == "off"
        assert fm.readiness == fm.readiness.ok("fabric manager off (--fabric-manager off)")
        nursery.cancel_scope.cancel()
    assert snapshot(node_root) == before


class _BrokenStage:
    """A simulator whose stage fails, so a pass stops at the barrier."""

    name = "broken"
    readiness = Readiness.not_ready("broken")

    async def stage(self, host: Host, state: State) -> None:
        raise StageError("broken: stage failed on purpose")

    async def discard(self, host: Host) -> None:
        return None


async def test_a_pass_that_fails_at_the_barrier_does_not_bring_the_fabric_up(
    host: Host, node_root: Path, autojump_clock: trio.abc.Clock
) -> None:
    """The marker turns every ``auto`` GPU COMPLETED: it may only follow a
    state that passed the barrier (``reload``), not one a Stage wave saw."""
    before = snapshot(node_root)
    fm = FabricManagerSimulator()
    async with trio.open_nursery() as nursery:
        supervisor = Supervisor(host)
        await nursery.start(supervisor.run)
        good = Reconciler(host, [fm], supervisor=supervisor)
        assert (await good.reconcile_once(make_state(nvswitch=False))).ok
        assert fm.phase.value == "off"
        failing = Reconciler(host, [fm, _BrokenStage()], supervisor=supervisor)
        assert not (await failing.reconcile_once(make_state(generation=2))).ok
        await trio.sleep(30)
        assert fm.phase.value == "off"
        assert not (node_root / MARKER).exists()
        assert (await good.reconcile_once(make_state(generation=3))).ok
        await fm.phase.wait_value("ready")
        assert (node_root / MARKER).exists()
        assert fm.readiness.ready
        supervisor.stop()
        await supervisor.wait_stopped()
        nursery.cancel_scope.cancel()
    await fm.discard(host)
    assert snapshot(node_root) == before


# ---- fabricmanager-ctl ---------------------------------------------------------


def test_ctl_query_answers_from_the_marker(node_root: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["fabricmanager-ctl", "-q", "--root", str(node_root)]) == 1
    assert capsys.readouterr().out == "NOT READY\n"
    marker = node_root / MARKER
    marker.parent.mkdir(parents=True)
    marker.write_bytes(b"")
    assert cli.main(["fabricmanager-ctl", "-q", "--root", str(node_root)]) == 0
    assert capsys.readouterr().out == "READY\n"


def test_ctl_as_a_real_process_reads_mokka_root(node_root: Path) -> None:
    env = {**os.environ, "MOKKA_ROOT": str(node_root), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "mokka", "fabricmanager-ctl", "-q"]
    missing = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    assert (missing.returncode, missing.stdout) == (1, "NOT READY\n")
    marker = node_root / MARKER
    marker.parent.mkdir(parents=True)
    marker.write_bytes(b"")
    ready = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    assert (ready.returncode, ready.stdout) == (0, "READY\n")


def test_ctl_without_q_is_a_usage_error(node_root: Path) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["fabricmanager-ctl", "--root", str(node_root)])
    assert info.value.code == 2


# ---- settings and registration -------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    PLUGIN.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_build_the_simulator() -> None:
    fm = PLUGIN.build(parse("--fabric-manager", "on", "--fabric-manager-init-delay", "2.5"))
    assert isinstance(fm, Simulator)
    assert isinstance(fm, Daemon)
    assert fm.settings == FabricManagerSettings(mode="on", init_delay=2.5)
    assert PLUGIN.build(parse()).settings == FabricManagerSettings(mode="auto", init_delay=0.0)
    assert "mokka.simulators.fabricmanager" in registry.PLUGIN_MODULES
    assert "mokka.ctl.fabricmanager" in cli.SUBCOMMAND_MODULES


@pytest.mark.parametrize("delay", ["-1", "nan", "inf"])
def test_a_bad_init_delay_is_a_clear_error(delay: str) -> None:
    with pytest.raises(
        SpecError, match=r"--fabric-manager-init-delay: .*expected a number of seconds >= 0"
    ):
        PLUGIN.build(parse("--fabric-manager-init-delay", delay))
