"""One daemon per node root: the second waits until the first lets go."""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path

import pytest
import trio
import trio.testing

from mokka import layout
from mokka.daemon import command
from mokka.daemon.nodelock import hold_node_root
from mokka.noderoot.host import Host
from mokka.settings import Settings
from tests.support import snapshot


async def test_a_free_root_is_taken_at_once_and_nothing_is_written(node_root: Path) -> None:
    before = snapshot(node_root)
    async with hold_node_root(node_root):
        # Held: another descriptor cannot take it.
        other = os.open(node_root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    assert snapshot(node_root) == before  # a lock on the directory: no lock file


async def test_a_second_daemon_waits_for_the_first_to_let_go(node_root: Path) -> None:
    first = os.open(node_root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(first, fcntl.LOCK_EX)
    acquired = trio.Event()

    async def second() -> None:
        async with hold_node_root(node_root):
            acquired.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            # The second is parked in a blocking flock in a worker thread.
            await trio.testing.wait_all_tasks_blocked()
            assert not acquired.is_set()
            os.close(first)  # the first daemon's process ends: the lock goes with it
            first = -1
            # A real kernel lock hand-over: bounded, not slept on.
            with trio.fail_after(10):
                await acquired.wait()
    finally:
        if first >= 0:
            os.close(first)


async def test_waiting_can_be_cancelled(node_root: Path) -> None:
    first = os.open(node_root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(first, fcntl.LOCK_EX)
    try:
        with trio.move_on_after(0.05) as scope:  # SIGTERM while waiting
            async with hold_node_root(node_root):
                raise AssertionError("acquired a lock that is held")
        assert scope.cancelled_caught
    finally:
        os.close(first)


async def test_a_waiting_daemon_leaves_the_runtime_state_of_the_first_alone(
    node_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon start resets the overrides file, but only once the root is its
    own: while it waits, the failures injected into the first daemon stay."""
    overrides = node_root / layout.OVERRIDES.lstrip("/")
    overrides.parent.mkdir(parents=True)
    overrides.write_text("version: 1\ndevices: {'0': {failure: {mode: lost}}}\n")
    before = snapshot(node_root)
    reset = trio.Event()
    real_reset = command._reset_overrides

    def reset_overrides(path: Path, *rest) -> None:
        real_reset(path, *rest)
        reset.set()

    monkeypatch.setattr(command, "_reset_overrides", reset_overrides)
    settings = Settings(root=node_root, node_name="worker-0", health_addr=("127.0.0.1", 0))
    first = os.open(node_root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(first, fcntl.LOCK_EX)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(command.run_daemon, settings, Host(node_root), [])
            await trio.testing.wait_all_tasks_blocked()  # parked on the lock
            assert not reset.is_set()
            assert snapshot(node_root) == before
            os.close(first)  # the first daemon is gone
            first = -1
            with trio.fail_after(10):  # a real kernel lock hand-over, bounded
                await reset.wait()
            assert not overrides.exists()
            nursery.cancel_scope.cancel()
    finally:
        if first >= 0:
            os.close(first)
    del before[str(overrides.relative_to(node_root))]
    assert snapshot(node_root) == before


def test_cleanup_refuses_a_root_a_daemon_holds(node_root: Path, capsys) -> None:
    from mokka import cli
    from mokka.noderoot.host import File, Host

    Host(node_root).converge("sim", [File("/var/lib/nvml-mock/x", "staged\n")])
    staged = snapshot(node_root)
    daemon = os.open(node_root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(daemon, fcntl.LOCK_EX)
    try:
        assert cli.main(["cleanup", "--root", str(node_root)]) == 1
        assert "a Mokka daemon is running on" in capsys.readouterr().err
        assert snapshot(node_root) == staged
    finally:
        os.close(daemon)
    assert cli.main(["cleanup", "--root", str(node_root)]) == 0
    assert snapshot(node_root) == {}


# ---- who holds it; a root removed under a waiter ------------------------------


def test_the_holder_s_pid_is_read_from_the_kernel(node_root: Path) -> None:
    from mokka.daemon.nodelock import describe_holder, lock_holder

    assert lock_holder(node_root) is None
    assert describe_holder(node_root) == "another Mokka daemon"
    fd = os.open(node_root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert lock_holder(node_root) == os.getpid()
        assert describe_holder(node_root) == f"another Mokka daemon (pid {os.getpid()})"
    finally:
        os.close(fd)
    assert lock_holder(node_root) is None


def test_the_holder_is_found_among_other_locks(node_root: Path, tmp_path: Path) -> None:
    from mokka.daemon.nodelock import lock_holder

    st = os.stat(node_root)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    table = tmp_path / "locks"
    table.write_text(
        f"1: POSIX  ADVISORY  WRITE 11 {dev}:{st.st_ino} 0 EOF\n"
        f"2: FLOCK  ADVISORY  WRITE 22 {dev}:{st.st_ino + 1} 0 EOF\n"
        f"3: FLOCK  ADVISORY  WRITE 33 {dev}:{st.st_ino} 0 EOF\n"
        f"3: -> FLOCK  ADVISORY  WRITE 44 {dev}:{st.st_ino} 0 EOF\n"
    )
    assert lock_holder(node_root, locks=table) == 33
    # Another pid namespace: the kernel says 0, and no pid is claimed.
    table.write_text(f"1: FLOCK  ADVISORY  WRITE 0 {dev}:{st.st_ino} 0 EOF\n")
    assert lock_holder(node_root, locks=table) is None


async def test_a_waiter_takes_the_live_root_when_its_holder_removed_it(tmp_path: Path) -> None:
    root = tmp_path / "mokka-node"
    root.mkdir()
    first = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(first, fcntl.LOCK_EX)
    waits: list[str] = []
    held: list = []
    taken = trio.Event()
    release = trio.Event()

    async def second() -> None:
        async with hold_node_root(root, on_wait=waits.append) as h:
            held.append(h)
            taken.set()
            # The lock is on the directory now at the path, not the deleted one.
            other = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(other)
            await release.wait()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            assert len(waits) == 1
            assert f"(pid {os.getpid()})" in waits[0]
            root.rmdir()  # the first daemon's exit removes the root it made...
            os.close(first)  # ...and then its lock goes
            first = -1
            with trio.fail_after(10):  # a real kernel lock hand-over, bounded
                await taken.wait()
            assert held[0].recreated
            assert root.is_dir()
            release.set()
    finally:
        if first >= 0:
            os.close(first)


async def test_a_second_local_daemon_answers_probes_and_outlives_the_first(tmp_path: Path):
    """Two ``mokka`` runs in one directory: the second says whose lock it waits
    for, takes over the ``./mokka-node`` the first one removes, converges, and on
    Ctrl-C leaves the directory as the first found it."""
    import httpx

    from tests.daemon_support import kill_if_running, start_daemon, stop_daemon

    def listing() -> list[str]:
        return sorted(os.listdir(tmp_path))

    with trio.fail_after(120):
        first = await start_daemon("--health-addr", "127.0.0.1:0", cwd=tmp_path)
        second = None
        try:
            await first.wait_for_line(r"reconcile pass ok generation=1 ")
            second = await start_daemon("--health-addr", "127.0.0.1:0", cwd=tmp_path)
            port = int((await second.wait_for_line(r"health probes on .* port=(\d+)"))[1])
            await second.wait_for_line(r"waiting for the node root")
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                ready = await client.get("/readyz")
                alive = await client.get("/healthz")
            assert ready.status_code == 503
            assert f"(pid {first.process.pid}) holds it" in ready.json()["reasons"][0]
            assert alive.status_code == 200
            assert await stop_daemon(first, signal.SIGTERM) == 0
            try:
                with trio.fail_after(60):
                    await second.wait_for_line(r"reconcile pass ok generation=1 ")
            except trio.TooSlowError:
                raise AssertionError("\n".join(second.lines)) from None
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                assert (await client.get("/readyz")).status_code == 200
            code = await stop_daemon(second, signal.SIGINT)
        finally:
            await kill_if_running(first)
            if second is not None:
                await kill_if_running(second)
    log = "\n".join(second.lines)
    assert code == 0, log
    assert "FileNotFoundError" not in log
    assert "Traceback" not in log
    assert listing() == []
