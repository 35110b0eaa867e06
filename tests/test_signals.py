"""Signals a real daemon process gets: none may end it without its teardown.

Every catchable signal is sent, one by one, to a real ``python -m mokka``:
the stop signals tear down (a fresh daemon each); SIGHUP (a closed
terminal) re-reads every input and repairs the node; the rest leave the
daemon up and answering (one daemon for all of them).  Each test compares
the node root with its snapshot from before.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import httpx
import pytest
import trio
import trio_util

from mokka.state.profile import read_profile_text
from mokka.state.sources.base import SourceUpdate
from mokka.state.sources.file import FileSource
from tests.daemon_support import (
    PROCESS_TIMEOUT,
    kill_if_running,
    running_daemon,
    start_daemon,
    stop_daemon,
    wait_for_lines,
)
from tests.support import snapshot

PASS_OK = r"reconcile pass ok generation=1 "


async def _probe(port: int, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        return await client.get(path)


def _remove_a_staged_file(root: Path) -> tuple[Path, bytes]:
    """Drift: one staged regular file goes; returns it and what it held."""
    path = next(p for p in sorted(root.rglob("vendor")) if p.is_file())
    content = path.read_bytes()
    path.unlink()
    return path, content


async def test_stray_signals_are_ignored_and_sighup_repairs_the_node(
    node_root: Path, tmp_path: Path
):
    before = snapshot(node_root)
    with trio.fail_after(PROCESS_TIMEOUT):
        daemon = await start_daemon(
            "--root", str(node_root), "--health-addr", "127.0.0.1:0",
            # No periodic resync: only SIGHUP can cause the second pass.
            "--resync-interval", "0",
            cwd=tmp_path,
        )
        try:
            port = int((await daemon.wait_for_line(r"health probes on .* port=(\d+)"))[1])
            await daemon.wait_for_line(PASS_OK)
            for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGPIPE):
                daemon.process.send_signal(signum)
            await daemon.wait_for_line(r"received SIGALRM; ignored")
            assert daemon.process.returncode is None
            assert (await _probe(port, "/readyz")).status_code == 200
            # Drift: a staged file goes.  SIGHUP re-reads and runs a repair pass.
            drifted, content = _remove_a_staged_file(node_root)
            daemon.process.send_signal(signal.SIGHUP)
            await daemon.wait_for_line(r"received SIGHUP; re-reading every input")
            await wait_for_lines(daemon, PASS_OK, 2)
            assert await trio.Path(drifted).read_bytes() == content
            assert (await _probe(port, "/readyz")).status_code == 200
            code = await stop_daemon(daemon, signal.SIGTERM)
        finally:
            await kill_if_running(daemon)
    log = "\n".join(daemon.lines)
    assert code == 0, log
    assert len([line for line in daemon.lines if PASS_OK in line + " "]) == 2, log
    for name in ("SIGUSR1", "SIGUSR2", "SIGALRM"):
        assert f"received {name}; ignored" in log
    assert "teardown finished" in log
    # The probes' address is logged once, by the daemon; hypercorn's own line is silenced.
    assert "Running on" not in log
    assert len([line for line in daemon.lines if "health probes on" in line]) == 1
    assert snapshot(node_root) == before


#: What the daemon does with each signal it can catch (docs/daemon.md, "Signals").
TEAR_DOWN = {
    signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGABRT, signal.SIGPWR,
    signal.SIGXCPU, signal.SIGSYS, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
}
RESYNC = {signal.SIGHUP}
LOGGED_AND_IGNORED = {
    signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGTRAP, signal.SIGSTKFLT,
    signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO,
    *range(signal.SIGRTMIN, signal.SIGRTMAX + 1),
}
#: Ignored by Python (SIGPIPE, SIGXFSZ) or by default (the rest): nothing is logged.
QUIETLY_IGNORED = {
    signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGCONT, signal.SIGURG,
    signal.SIGWINCH,
}
#: Job control: the process stops until SIGCONT, as any program does.
STOP_UNTIL_CONTINUED = {signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}
SMALL = ("--profile", "t4", "--health-addr", "127.0.0.1:0", "--resync-interval", "0")


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"


def test_the_table_names_every_catchable_signal_once():
    groups = [TEAR_DOWN, RESYNC, LOGGED_AND_IGNORED, QUIETLY_IGNORED, STOP_UNTIL_CONTINUED]
    catchable = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}
    assert sorted(s for group in groups for s in group) == sorted(catchable)
    documented = (Path(__file__).parent.parent / "docs/daemon.md").read_text()
    for signum in catchable - set(range(signal.SIGRTMIN + 1, signal.SIGRTMAX)):
        assert f"`{_name(signum)}`" in documented, _name(signum)


@pytest.mark.parametrize("signum", sorted(TEAR_DOWN), ids=_name)
async def test_each_stop_signal_tears_down(node_root: Path, tmp_path: Path, signum: int):
    before = snapshot(node_root)
    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon("--root", str(node_root), *SMALL, cwd=tmp_path) as daemon:
            await daemon.wait_for_line(PASS_OK)
            assert snapshot(node_root) != before
            code = await stop_daemon(daemon, signum)
    log = "\n".join(daemon.lines)
    assert code == 0, log
    assert f"received {_name(signum)}; tearing down" in log
    assert "teardown finished" in log
    assert snapshot(node_root) == before


async def test_every_other_signal_leaves_the_daemon_up_and_answering(
    node_root: Path, tmp_path: Path
):
    """One daemon gets each ignored signal in turn and must still answer after each;
    the job-control ones stop it until SIGCONT; a repeated one is logged once."""
    before = snapshot(node_root)
    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon("--root", str(node_root), *SMALL, cwd=tmp_path) as daemon:
            port = int((await daemon.wait_for_line(r"health probes on .* port=(\d+)"))[1])
            await daemon.wait_for_line(PASS_OK)

            async def still_up(signum: int) -> None:
                assert daemon.process.returncode is None, _name(signum)
                assert (await _probe(port, "/healthz")).status_code == 200, _name(signum)

            for signum in sorted(QUIETLY_IGNORED):
                daemon.process.send_signal(signum)
                await still_up(signum)
            for signum in sorted(LOGGED_AND_IGNORED):
                daemon.process.send_signal(signum)
                await daemon.wait_for_line(re.escape(f"received {_name(signum)}; ignored"))
                await still_up(signum)
            for signum in sorted(STOP_UNTIL_CONTINUED):
                daemon.process.send_signal(signum)
                await _wait_for_state(daemon.process.pid, os.WSTOPPED)
                daemon.process.send_signal(signal.SIGCONT)
                await _wait_for_state(daemon.process.pid, os.WCONTINUED)
                await still_up(signum)
            # A flood of one ignored signal is not a flood of log lines.
            for _ in range(20):
                daemon.process.send_signal(signal.SIGRTMAX)
                daemon.process.send_signal(signal.SIGUSR1)
            code = await stop_daemon(daemon, signal.SIGTERM)
    log = "\n".join(daemon.lines)
    assert code == 0, log
    assert "received SIGTERM; tearing down" in log
    for name in ("SIGUSR1", "SIGRTMAX"):
        assert len([line for line in daemon.lines if f"received {name}; ignored" in line]) == 1
    assert snapshot(node_root) == before


async def _wait_for_state(pid: int, state: int) -> None:
    """Until the child ``pid`` stopped (``WSTOPPED``) or continued (``WCONTINUED``);
    ``WNOWAIT`` leaves its exit to be reaped as usual."""
    await trio.to_thread.run_sync(os.waitid, os.P_PID, pid, state | os.WNOWAIT)


async def test_sighup_on_a_local_run_does_not_end_it(tmp_path: Path):
    """The terminal a local run was started from is closed: the run goes on."""
    with trio.fail_after(PROCESS_TIMEOUT):
        daemon = await start_daemon("--health-addr", "127.0.0.1:0", cwd=tmp_path)
        try:
            await daemon.wait_for_line(PASS_OK)
            daemon.process.send_signal(signal.SIGHUP)
            await daemon.wait_for_line(r"received SIGHUP")
            assert daemon.process.returncode is None
            code = await stop_daemon(daemon, signal.SIGINT)
        finally:
            await kill_if_running(daemon)
    assert code == 0, "\n".join(daemon.lines)
    assert _listing(tmp_path) == []


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("resync_interval", [0.0, 3600.0])
async def test_a_requested_resync_rereads_without_any_event(
    autojump_clock, tmp_path: Path, resync_interval: float
):
    """What SIGHUP asks of the file source: read every input now, even with no
    inotify and no (or a distant) periodic resync."""
    profile = tmp_path / "profile.yaml"
    _, text = read_profile_text("t4")
    _edit(profile, text)

    def no_inotify():
        raise OSError("inotify disabled for this test")

    source = FileSource(
        profile=profile, node_name="node-a", resync_interval=resync_interval,
        open_inotify=no_inotify, offload=_inline,
    )
    updates: trio_util.AsyncValue[SourceUpdate | None] = trio_util.AsyncValue(None)
    async with trio.open_nursery() as nursery:
        await nursery.start(source.run, updates)
        first = updates.value
        assert first.state.generation == 1
        _edit(profile, text.replace("name: Tesla T4", "name: Tesla T4 edited", 1))
        await trio.sleep(600)
        assert updates.value is first  # nothing notices the edit by itself
        source.request_resync()
        await updates.wait_value(lambda u: u is not first)
        assert updates.value.state.generation == 2
        nursery.cancel_scope.cancel()


async def _inline(fn):
    """Runs the source's read in the test's task: virtual time cannot skip past it."""
    return fn()


def _edit(path: Path, text: str) -> None:
    path.write_text(text)
