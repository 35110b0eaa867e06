"""The hardware-fault signals: sent by ``kill`` they tear down, raised by a fault they crash.

SIGSEGV, SIGBUS, SIGFPE and SIGILL come from two places.  The kernel
raises them at a faulting instruction (a bad pointer in C code): the
process cannot go on, and a Python handler, which only sets a flag and
returns, would send the thread back to the same instruction forever, a
crash turned into a spin.  Another process sends them with ``kill``: that
is a request to stop like any other, and ending without a teardown would
leave the node staged.

Blocking the four signals tells the two apart.  The kernel does not queue
a fault behind a blocked signal: it unblocks it, resets it to its default
action and delivers it, so a real fault still ends the process (with a
core dump) exactly as before.  A sent one waits, pending, and is read here
from a ``signalfd`` (Linux), so the daemon handles it like SIGTERM.

The mask is inherited by every thread started later, so it is set before
the first one (``mokka daemon`` does it before trio starts), and by child
processes: a daemon's children keep the four blocked, where they too still
crash on a real fault.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import struct
from collections.abc import AsyncIterator, Iterator

import trio

logger = logging.getLogger(__name__)

#: The signals a faulting instruction raises (see the module's docstring).
FAULT_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)

#: ``sizeof(struct signalfd_siginfo)``; its first field is ``uint32_t ssi_signo``.
_SIGINFO_SIZE = 128


@contextlib.contextmanager
def fault_signals_blocked() -> Iterator[None]:
    """The fault signals blocked in this thread (and the threads it starts) for the body.

    On the way out, sent signals still pending are dropped first: they came
    after the one that stopped the daemon (or during ``--once``), and
    unblocking them would kill the process after a clean teardown.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, FAULT_SIGNALS)
    try:
        yield
    finally:
        if not previous & set(FAULT_SIGNALS):
            while signal.sigtimedwait(FAULT_SIGNALS, 0) is not None:
                pass
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def open_fault_signal_receiver() -> Iterator[AsyncIterator[int] | None]:
    """The sent fault signals as an async iterator of signal numbers, for the body.

    ``None`` where the C library has no ``signalfd`` (not Linux): a sent
    one then stays pending, unread (ignored), and a fault still crashes.
    """
    with fault_signals_blocked():
        fd = _signalfd(FAULT_SIGNALS)
        if fd is None:
            yield None
            return
        try:
            yield _SignalfdReader(fd)
        finally:
            trio.lowlevel.notify_closing(fd)
            os.close(fd)


class _SignalfdReader:
    """``async for signum in reader``: one signal number per ``signalfd`` record."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __aiter__(self) -> AsyncIterator[int]:
        return self

    async def __anext__(self) -> int:
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            try:
                info = os.read(self._fd, _SIGINFO_SIZE)
            except BlockingIOError:  # read by someone else meanwhile
                continue
            return struct.unpack_from("=I", info)[0]


def _signalfd(signums: tuple[int, ...]) -> int | None:
    """A non-blocking, close-on-exec ``signalfd`` over ``signums``; ``None`` if there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        signalfd, sigemptyset, sigaddset = libc.signalfd, libc.sigemptyset, libc.sigaddset
    except (OSError, AttributeError):
        return None
    mask = ctypes.create_string_buffer(_SIGINFO_SIZE)  # a sigset_t fits (glibc: 128 bytes)
    sigemptyset(mask)
    for signum in signums:
        sigaddset(mask, int(signum))
    fd = signalfd(-1, mask, os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        logger.warning(
            "no signalfd (%s): a SIGSEGV, SIGBUS, SIGFPE or SIGILL sent to the daemon "
            "ends it without a teardown", os.strerror(ctypes.get_errno()),
        )
        return None
    return fd
