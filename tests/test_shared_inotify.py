"""One inotify descriptor per process (``shared_inotify``): every watcher a view of it.

inotify descriptors are a per-user count shared by the whole machine (128 by
default); a daemon with one per watcher made a fleet of 33 or more agents of
one user fall back to polling.  These tests hold the views to what each
watcher had with a descriptor of its own: its own events and only those,
its own mask kept when another view watches the same directory, a watch kept
until the last view lets go, waits that do not get in each other's way, and
one descriptor for a whole daemon.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
import trio

from mokka.state.sources.inotify import (
    DIR_MASK,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_MODIFY,
    IN_Q_OVERFLOW,
)
from mokka.state.sources.shared_inotify import open_shared
from tests.daemon_support import running_daemon, stop_daemon, wait_for_lines

PROCESS_TIMEOUT = 120


def inotify_descriptors(pid: int | str = "self") -> int:
    """How many inotify descriptors process ``pid`` holds."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            continue
    return count


def kernel_watches() -> int:
    """How many watches the kernel holds on this process's inotify descriptors (fdinfo)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{fd}") as info:
                count += sum(line.startswith("inotify wd:") for line in info)
        except OSError:
            continue
    return count


def task_names() -> list[str]:
    """The names of every task of this run (system tasks included)."""
    names: list[str] = []
    pending = [trio.lowlevel.current_root_task()]
    while pending:
        task = pending.pop()
        names.append(task.name)
        for nursery in task.child_nurseries:
            pending.extend(nursery.child_tasks)
    return names


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    return one, two


def test_views_share_one_descriptor_and_each_gets_only_its_own_events(dirs) -> None:
    one, two = dirs
    before = inotify_descriptors()
    with open_shared() as first, open_shared() as second:
        assert inotify_descriptors() == before + 1
        wd_one = first.add_watch(str(one))
        wd_two = second.add_watch(str(two))
        (one / "a").write_bytes(b"a")
        events = first.read_pending()
        assert {(e.wd, e.name) for e in events} == {(wd_one, "a")}
        assert second.read_pending() == []
        (two / "b").write_bytes(b"b")
        assert second.read_pending()[0].wd == wd_two
        assert first.read_pending() == []
    assert inotify_descriptors() == before


def test_a_view_keeps_its_mask_when_another_watches_the_same_directory(dirs) -> None:
    one, _ = dirs
    with open_shared() as closes, open_shared() as writes:
        closes.add_watch(str(one), DIR_MASK)
        writes.add_watch(str(one), IN_MODIFY)  # replacing the mask would lose CLOSE_WRITE
        (one / "saved").write_bytes(b"x")
        masks = [e.mask for e in closes.read_pending()]
        assert any(mask & IN_CLOSE_WRITE for mask in masks)
        assert any(e.mask & IN_MODIFY for e in writes.read_pending())


def test_a_watch_stays_until_the_last_view_holding_it_lets_go(dirs) -> None:
    one, _ = dirs
    watches = kernel_watches()
    with open_shared() as first, open_shared() as second:
        wd = first.add_watch(str(one))
        assert second.add_watch(str(one)) == wd  # one kernel watch for the inode
        assert kernel_watches() == watches + 1
        first.rm_watch(wd)
        assert kernel_watches() == watches + 1
        (one / "c").write_bytes(b"c")
        assert [e.name for e in second.read_pending() if e.mask & IN_CREATE] == ["c"]
        assert first.read_pending() == []
        second.rm_watch(wd)
        assert kernel_watches() == watches


async def test_two_tasks_wait_on_their_own_views_at_once(dirs) -> None:
    one, two = dirs
    got: dict[str, list[str]] = {}
    with open_shared() as first, open_shared() as second:
        first.add_watch(str(one))
        second.add_watch(str(two))

        async def wait(name: str, view) -> None:
            got[name] = [e.name for e in await view.read_events()]

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait, "first", first)
                nursery.start_soon(wait, "second", second)
                await trio.testing.wait_all_tasks_blocked()
                (two / "for-second").write_bytes(b"")
                (one / "for-first").write_bytes(b"")
    assert set(got["first"]) == {"for-first"}
    assert set(got["second"]) == {"for-second"}


async def test_events_read_from_a_worker_thread_wake_the_task_they_are_for(dirs) -> None:
    # The drift watch reads the descriptor from worker threads: whatever it
    # brings in for another view must wake the task waiting on that view.
    one, two = dirs
    with open_shared() as waiting, open_shared() as pumping:
        waiting.add_watch(str(one))
        pumping.add_watch(str(two))
        received = []

        async def wait() -> None:
            received.extend(await waiting.read_events())

        def write_and_read_in_a_thread() -> list:
            (one / "from-a-thread").write_bytes(b"")
            return pumping.read_pending()

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                await trio.testing.wait_all_tasks_blocked()
                assert await trio.to_thread.run_sync(write_and_read_in_a_thread) == []
        assert {e.name for e in received} == {"from-a-thread"}


def test_the_descriptor_reopens_for_a_new_run_after_the_last_view_closed(dirs) -> None:
    one, _ = dirs
    before = inotify_descriptors()

    async def one_event(name: str) -> list[str]:
        with open_shared() as view, trio.fail_after(10):
            view.add_watch(str(one))
            (one / name).write_bytes(b"")
            return [e.name for e in await view.read_events()]

    assert "first-run" in trio.run(one_event, "first-run")
    assert inotify_descriptors() == before
    assert "second-run" in trio.run(one_event, "second-run")
    assert inotify_descriptors() == before


def test_a_coalescing_view_keeps_one_entry_per_watch_however_many_events(dirs) -> None:
    one, two = dirs
    with open_shared(coalescing=True) as drift, open_shared() as other:
        wd = drift.add_watch(str(one))
        other.add_watch(str(two))
        for n in range(500):
            (one / f"f{n}").write_bytes(b"x")
        (two / "elsewhere").write_bytes(b"")
        changes = drift.read_changes()
        assert list(changes) == [wd]
        assert changes[wd] & IN_CREATE
        assert changes[wd] & IN_CLOSE_WRITE
        assert drift.read_changes() == {}  # taken
        assert {e.name for e in other.read_pending()} == {"elsewhere"}


def test_an_overflowed_queue_is_told_to_every_view(dirs) -> None:
    one, two = dirs
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    with open_shared() as busy, open_shared() as quiet, open_shared(coalescing=True) as drift:
        busy.add_watch(str(one))
        quiet.add_watch(str(two))  # nothing happens there; events were still lost
        drift.add_watch(str(two))
        for n in range(limit // 2 + 100):  # a create and a close-write each
            (one / f"f{n}").touch()
        busy_events = busy.read_pending()
        assert any(e.mask & IN_Q_OVERFLOW for e in busy_events)
        assert [e.mask for e in quiet.read_pending()] == [IN_Q_OVERFLOW]
        assert drift.read_changes() == {-1: IN_Q_OVERFLOW}


async def test_a_daemon_holds_one_inotify_descriptor(node_root: Path, tmp_path: Path) -> None:
    # Its input files, the fabric manager's marker, the kubelet's socket and,
    # from its first resync on, the drift watch: all on one descriptor.
    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon(
            "--root", str(node_root), "--health-addr", "127.0.0.1:0",
            "--resync-interval", "1", cwd=tmp_path,
        ) as daemon:
            await wait_for_lines(daemon, r"reconcile pass ok generation=1", 3)
            assert inotify_descriptors(daemon.process.pid) == 1
            code = await stop_daemon(daemon, signal.SIGTERM)
    assert code == 0, "\n".join(daemon.lines)
    assert os.listdir(node_root) == []


async def test_the_last_view_closed_from_a_worker_thread_ends_the_wait_cleanly(dirs) -> None:
    # The reader task waits on the descriptor in the trio thread; closing the
    # last view elsewhere must tell it there, not pull the descriptor from
    # under its wait (which crashes the run).
    one, _ = dirs
    before = inotify_descriptors()
    view = open_shared()
    view.add_watch(str(one))
    ended = []

    async def wait() -> None:
        with pytest.raises(trio.ClosedResourceError):
            await view.read_events()
        ended.append(True)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            closer = threading.Thread(target=view.close)  # no trio at all in it
            closer.start()
            await trio.to_thread.run_sync(closer.join)
        await trio.testing.wait_all_tasks_blocked()  # the reader task's exit
    assert ended == [True]
    assert inotify_descriptors() == before
    # No reader task left waiting on a descriptor that is gone.
    assert not [name for name in task_names() if "_Hub._read" in name]
    with open_shared() as again, trio.fail_after(10):  # and the next view works
        again.add_watch(str(one))
        (one / "after").write_bytes(b"")
        assert "after" in {e.name for e in await again.read_events()}
