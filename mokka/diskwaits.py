"""A converge as steps: its work in the caller's thread, its waits for the disk anywhere.

``Host`` writes a converge as a generator that does the filesystem work
itself and *yields* each wait for the disk (the batch's sync before its
renames, ``WriteBatch.commit_steps``) as a blocking callable.  Whoever
drives the generator decides where that wait runs:

* ``run`` calls it right there: ``Host.converge``, for one-shot commands,
  worker threads and tests;
* ``run_waiting_in_worker`` runs the steps on the event loop's thread and
  only the waits in a worker thread: ``Host.converge_async``, the daemon's.

Why the daemon's steps run on the event loop (docs/daemon.md, "Converges
on the event loop", has the figures): a converge is hundreds of short
syscalls with Python between them; in a worker thread, each one hands the
GIL to whatever else runs (the event loop, the next simulator's
rendering), and each hop to and from a worker wakes a CPU.  On this
project's two-CPU machines that cost a cold h100 pass about a sixth of its
time.  The syscalls that are not waits for the disk (``mkdir``, ``open``,
``write`` to the page cache, ``lstat``, ``rename``) take microseconds; the
ones that wait (``syncfs``, ``fsync``) still run in a worker, so the
converges of a wave on a real disk still overlap their syncs.

A failed wait is thrown into the generator at its ``yield``, as if the
call had failed there, so the converge abandons its batch and names the
fault exactly as a wait made inline would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from typing import TypeVar

T = TypeVar("T")

#: A converge's steps: yields each wait for the disk, returns its outcome.
Steps = Generator[Callable[[], object], None, T]


def run(steps: Steps[T]) -> T:
    """Drive ``steps`` to their end, each wait made in this thread."""
    error: BaseException | None = None
    while True:
        try:
            wait = steps.send(None) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        error = None
        try:
            wait()
        except BaseException as exc:
            error = exc


async def run_waiting_in_worker(steps: Steps[T]) -> T:
    """Drive ``steps`` on this (the event loop's) thread, each wait in a worker thread.

    A cancellation while a wait runs is delivered once the wait returned
    (a sync cannot be interrupted), at the ``yield``: the converge then
    abandons its batch as on any other failure.
    """
    import trio  # here: a one-shot command drives its converges with ``run``

    error: BaseException | None = None
    try:
        while True:
            try:
                wait = steps.send(None) if error is None else steps.throw(error)
            except StopIteration as done:
                return done.value
            error = None
            try:
                await trio.to_thread.run_sync(wait)
                # A cancellation that came while the wait ran: delivered at the yield.
                await trio.lowlevel.checkpoint_if_cancelled()
            except BaseException as exc:
                error = exc
    finally:
        steps.close()


async def acquire_off_loop(lock: threading.Lock) -> None:
    """Take ``lock`` from the event loop's thread without blocking it: at once when it
    is free, else waited for in a worker thread (a plain lock: any thread releases it)."""
    if not lock.acquire(blocking=False):
        import trio

        await trio.to_thread.run_sync(lock.acquire)
