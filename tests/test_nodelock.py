"""One daemon per node root: the second waits until the first lets go."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest
import trio
import trio.testing

from mokka import layout
from mokka.daemon import command
from mokka.daemon.nodelock import hold_node_root
from mokka.host import Host
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

    def reset_overrides(path: Path) -> None:
        real_reset(path)
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
    from mokka.host import File, Host

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
