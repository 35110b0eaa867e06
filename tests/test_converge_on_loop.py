"""``Host.converge_async``: the daemon's converge, its work on the event loop's thread and
its waits for the disk in a worker (``mokka.diskwaits``)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
import trio

import mokka.fsops
from mokka.errors import HostFaultError
from mokka.host import CharDevice, Directory, File, Host, Symlink
from mokka.layout import temp_name
from tests.support import snapshot

#: How a temp file's name ends.
TEMP = temp_name("/x").rpartition("x")[2]
#: Bounds every wait on a thread or the loop in these tests: a regression fails, never hangs.
BOUND = 30.0


def node_of(count: int = 12) -> list:
    """Enough regular files that the batch syncs the filesystem, plus the other kinds."""
    return [
        Directory("/etc/mokka-test", 0o750),
        *(File(f"/etc/mokka-test/f{i}", f"{i}\n") for i in range(count)),
        Symlink("/etc/mokka-test/latest", "f0"),
        CharDevice("/dev/mokka-test0", major=195, minor=0),
    ]


def foreign(root: Path) -> None:
    """What the node had before: a file the converge replaces and discard restores."""
    (root / "etc" / "mokka-test").mkdir(parents=True)
    (root / "etc" / "mokka-test" / "f3").write_text("the node's own\n")


def temp_files(root: Path) -> list[Path]:
    """Temp files a batch left beside their paths (``layout.temp_name``)."""
    return [p for p in root.rglob("*") if p.name.startswith(".") and p.name.endswith(TEMP)]


def nodes_alike(tree: dict[str, tuple]) -> dict[str, tuple]:
    """``tree`` without the backup's record of the replaced file's mtime (each root's own)."""
    return {path: entry for path, entry in tree.items() if not path.endswith(".mode")}


async def test_it_leaves_the_node_the_blocking_converge_leaves_and_discard_restores_it(
    tmp_path: Path,
):
    roots = [tmp_path / "blocking", tmp_path / "on-loop"]
    for root in roots:
        root.mkdir()
        foreign(root)
    before = snapshot(roots[1])
    blocking, on_loop = Host(roots[0]), Host(roots[1])
    with trio.fail_after(BOUND):
        expected = await trio.to_thread.run_sync(blocking.converge, "test", node_of())
        report = await on_loop.converge_async("test", node_of())
    assert nodes_alike(snapshot(roots[1])) == nodes_alike(snapshot(roots[0]))
    assert (roots[1] / "etc/mokka-test/f3").read_text() == "3\n"
    assert (report.created, report.updated, report.degraded) == (
        expected.created, expected.updated, expected.degraded)
    assert on_loop.owned("test") == blocking.owned("test")
    with trio.fail_after(BOUND):
        again = await on_loop.converge_async("test", node_of())
        assert not again.changed
        await on_loop.discard_async("test")
    assert snapshot(roots[1]) == before
    assert on_loop.leftovers() == []


async def test_the_work_runs_on_the_loop_thread_and_only_the_sync_in_a_worker(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    before = snapshot(node_root)
    threads: dict[str, set[int]] = {"mkdir": set(), "replace": set(), "sync": set()}
    real_mkdir, real_replace = os.mkdir, os.replace
    real_sync = mokka.fsops.sync_filesystem

    def mkdir(*args, **kwargs):
        threads["mkdir"].add(threading.get_ident())
        return real_mkdir(*args, **kwargs)

    def replace(*args, **kwargs):
        threads["replace"].add(threading.get_ident())
        return real_replace(*args, **kwargs)

    def sync(root):
        threads["sync"].add(threading.get_ident())
        return real_sync(root)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(mokka.fsops, "sync_filesystem", sync)
    with trio.fail_after(BOUND):
        await host.converge_async("test", node_of())
    loop = threading.get_ident()
    assert threads["mkdir"] == {loop}
    assert threads["replace"] == {loop}
    assert len(threads["sync"]) == 1
    assert loop not in threads["sync"]
    monkeypatch.undo()
    with trio.fail_after(BOUND):
        await host.discard_async("test")
    assert snapshot(node_root) == before


async def test_the_disk_turn_is_let_go_while_it_waits_so_a_worker_converges_meanwhile(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """The sync of the loop's converge waits until another owner's blocking converge, in a
    worker, has finished: only possible if the wait gave the turn away."""
    before = snapshot(node_root)
    other_done = threading.Event()
    real_sync = mokka.fsops.sync_filesystem

    def sync(root):
        if threading.get_ident() != loop:
            # the loop's converge waiting for the disk: the other one must get through
            assert other_done.wait(BOUND), "the other converge never got the turn"
        return real_sync(root)

    def other() -> None:
        host.converge("other", [File("/other/only", "x\n")])
        other_done.set()

    loop = threading.get_ident()
    monkeypatch.setattr(mokka.fsops, "sync_filesystem", sync)
    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(host.converge_async, "test", node_of())
            nursery.start_soon(trio.to_thread.run_sync, other)
    assert other_done.is_set()
    assert (node_root / "etc/mokka-test/f11").read_text() == "11\n"
    with trio.fail_after(BOUND):
        await host.discard_async("test")
        await host.discard_async("other")
    assert snapshot(node_root) == before


async def test_an_owner_busy_in_a_worker_is_waited_for_without_blocking_the_loop(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    before = snapshot(node_root)
    syncing, release = threading.Event(), threading.Event()
    real_sync = mokka.fsops.sync_filesystem

    def sync(root):
        if not release.is_set():
            syncing.set()
            assert release.wait(BOUND)
        return real_sync(root)

    monkeypatch.setattr(mokka.fsops, "sync_filesystem", sync)
    ticks = 0
    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            # The owner's blocking converge, held in its sync in a worker.
            nursery.start_soon(trio.to_thread.run_sync, host.converge, "test", node_of())
            await trio.to_thread.run_sync(syncing.wait, BOUND)
            done = trio.Event()

            async def second() -> None:
                await host.converge_async("test", node_of(13))
                done.set()

            nursery.start_soon(second)
            while ticks < 50:  # the loop runs while the second waits for the owner
                ticks += 1
                await trio.lowlevel.checkpoint()
            assert not done.is_set()
            release.set()
            await done.wait()
    assert (node_root / "etc/mokka-test/f12").read_text() == "12\n"
    with trio.fail_after(BOUND):
        await host.discard_async("test")
    assert snapshot(node_root) == before


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
async def test_a_failed_sync_abandons_the_batch_and_names_the_fault(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch, code: int
):
    """Nothing is renamed over a path before its data is on disk; no temp file stays."""
    foreign(node_root)
    before = snapshot(node_root)

    def sync(root):
        raise OSError(code, os.strerror(code), str(root))

    monkeypatch.setattr(mokka.fsops, "sync_filesystem", sync)
    with trio.fail_after(BOUND), pytest.raises(
        HostFaultError if code == errno.ENOSPC else OSError, match=os.strerror(code)
    ):
        await host.converge_async("test", node_of())
    assert (node_root / "etc/mokka-test/f3").read_text() == "the node's own\n"
    assert not (node_root / "etc/mokka-test/f4").exists()
    assert temp_files(node_root) == []
    monkeypatch.undo()
    with trio.fail_after(BOUND):
        await host.converge_async("test", node_of())  # the next converge completes it
        assert (node_root / "etc/mokka-test/f3").read_text() == "3\n"
        await host.discard_async("test")
    assert snapshot(node_root) == before


async def test_a_converge_cancelled_during_its_sync_renames_nothing_and_leaves_a_record(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    foreign(node_root)
    before = snapshot(node_root)
    syncing, release = threading.Event(), threading.Event()
    real_sync = mokka.fsops.sync_filesystem

    def sync(root):
        syncing.set()
        assert release.wait(BOUND)
        return real_sync(root)

    monkeypatch.setattr(mokka.fsops, "sync_filesystem", sync)
    with trio.fail_after(BOUND), trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def cancel_once_syncing() -> None:
                await trio.to_thread.run_sync(syncing.wait, BOUND)
                scope.cancel()
                release.set()

            nursery.start_soon(cancel_once_syncing)
            await host.converge_async("test", node_of())
    assert scope.cancelled_caught
    assert (node_root / "etc/mokka-test/f3").read_text() == "the node's own\n"
    assert not (node_root / "etc/mokka-test/f4").exists()
    assert temp_files(node_root) == []
    assert "/etc/mokka-test/f4" in host.owned("test")  # recorded before it was written
    monkeypatch.undo()
    with trio.fail_after(BOUND):
        await host.discard_async("test")  # a teardown now: what was recorded goes
    assert snapshot(node_root) == before
