"""Driving a converge's steps: the work where the driver runs, each wait for the disk where
the driver puts it (``mokka.diskwaits``)."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.lowlevel
import trio.testing

from mokka import diskwaits

#: Bounds every wait on a thread in these tests: a regression fails, never hangs.
BOUND = 30.0


def recorded_steps(log: list[tuple[str, int]], waits: int = 2):
    """Steps that note which thread runs each part, and what was thrown into them."""

    def wait_for_disk() -> None:
        log.append(("wait", threading.get_ident()))

    log.append(("start", threading.get_ident()))
    try:
        for _ in range(waits):
            yield wait_for_disk
            log.append(("resumed", threading.get_ident()))
    except OSError as exc:
        log.append((f"thrown {exc.strerror}", threading.get_ident()))
        raise
    return "done"


def failing_steps(log: list[str]):
    """Steps whose one wait fails; they note what reached them and clean up."""

    def wait_for_disk() -> None:
        raise OSError(5, "Input/output error")

    try:
        yield wait_for_disk
        log.append("resumed")
    except OSError as exc:
        log.append(f"abandoned on {exc.strerror}")
        raise
    finally:
        log.append("closed")


def test_run_makes_each_wait_in_the_calling_thread():
    log: list[tuple[str, int]] = []
    assert diskwaits.run(recorded_steps(log)) == "done"
    here = threading.get_ident()
    assert log == [("start", here), ("wait", here), ("resumed", here),
                   ("wait", here), ("resumed", here)]


def test_run_throws_a_failed_wait_into_the_steps_at_their_yield():
    log: list[str] = []
    with pytest.raises(OSError, match="Input/output error"):
        diskwaits.run(failing_steps(log))
    assert log == ["abandoned on Input/output error", "closed"]


def test_steps_without_a_wait_return_at_once():
    def no_wait():
        return 7
        yield  # a generator all the same

    assert diskwaits.run(no_wait()) == 7


async def test_the_steps_run_on_the_loop_thread_and_only_the_waits_in_a_worker():
    log: list[tuple[str, int]] = []
    with trio.fail_after(BOUND):
        assert await diskwaits.run_waiting_in_worker(recorded_steps(log, waits=3)) == "done"
    loop = threading.get_ident()
    assert [event for event, _ in log] == ["start"] + ["wait", "resumed"] * 3
    assert {ident for event, ident in log if event != "wait"} == {loop}
    waits = [ident for event, ident in log if event == "wait"]
    assert len(waits) == 3
    assert loop not in waits


async def test_a_failed_wait_in_the_worker_is_thrown_into_the_steps():
    log: list[str] = []
    with trio.fail_after(BOUND), pytest.raises(OSError, match="Input/output error"):
        await diskwaits.run_waiting_in_worker(failing_steps(log))
    assert log == ["abandoned on Input/output error", "closed"]


async def test_the_loop_keeps_running_while_a_wait_blocks_in_the_worker():
    """Another task makes progress while the steps wait for the disk."""
    release = threading.Event()
    ticks = 0

    def slow_steps():
        yield lambda: release.wait(BOUND)
        return "synced"

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            if ticks == 5:
                release.set()  # only a running loop can let the wait end
            await trio.lowlevel.checkpoint()

    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            assert await diskwaits.run_waiting_in_worker(slow_steps()) == "synced"
            nursery.cancel_scope.cancel()
    assert ticks >= 5


async def test_a_cancellation_during_a_wait_reaches_the_steps_once_it_returned():
    """A sync cannot be interrupted: the wait finishes, then the steps see the cancellation
    at their yield and clean up, and nothing after the yield runs."""
    started, release = threading.Event(), threading.Event()
    log: list[str] = []

    def wait_for_disk() -> None:
        started.set()
        release.wait(BOUND)
        log.append("wait finished")

    def steps():
        try:
            yield wait_for_disk
            log.append("resumed")
        except trio.Cancelled:
            log.append("abandoned on cancellation")
            raise
        finally:
            log.append("closed")

    with trio.fail_after(BOUND):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def cancel_once_waiting() -> None:
                    await trio.to_thread.run_sync(started.wait, BOUND)
                    scope.cancel()
                    release.set()

                nursery.start_soon(cancel_once_waiting)
                await diskwaits.run_waiting_in_worker(steps())
    assert scope.cancelled_caught
    assert log == ["wait finished", "abandoned on cancellation", "closed"]


async def test_a_free_lock_is_taken_at_once_without_a_worker(monkeypatch: pytest.MonkeyPatch):
    lock = threading.Lock()

    async def no_worker(*args, **kwargs):
        raise AssertionError("a free lock needs no worker thread")

    monkeypatch.setattr(trio.to_thread, "run_sync", no_worker)
    await diskwaits.acquire_off_loop(lock)
    assert lock.locked()
    lock.release()


async def test_a_held_lock_is_waited_for_in_a_worker_while_the_loop_runs():
    lock = threading.Lock()
    lock.acquire()
    ticks = 0
    got = trio.Event()

    async def take() -> None:
        await diskwaits.acquire_off_loop(lock)
        got.set()

    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(take)
            while ticks < 20:  # the loop is not blocked on the lock
                ticks += 1
                await trio.lowlevel.checkpoint()
            assert not got.is_set()
            lock.release()  # the holder lets go: the waiting task takes it
            await got.wait()
    assert lock.locked()
    lock.release()
