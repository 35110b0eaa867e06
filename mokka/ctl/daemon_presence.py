"""``mokka ctl``: whether a running daemon holds the node root, told without taking its lock.

A change lands in the overrides file whether or not a daemon runs; only a
daemon applies it (recompiles the engine config, raises the Xid).  So every
writing verb says which it is.  The daemon holds an exclusive ``flock`` on
the node root directory for as long as it runs (``mokka.daemon.nodelock``):
ctl reads the kernel's table of locks (``/proc/locks``) for one on the
root's inode rather than trying the lock itself, which would, for an
instant, make a daemon starting just then wait and report another daemon.

Apart from ``mokka.daemon.nodelock`` because of what ctl may import: that
module brings trio and attrs, and a ctl call loads nothing of the daemon
(``tests/test_startup_imports.py``).  The table's format is the kernel's
(``man 5 proc``): ``N: FLOCK ADVISORY WRITE PID MAJOR:MINOR:INODE START END``,
a waiter's line with ``->`` after its number.

Reading that table is cheap in CPU but not in time: the kernel first waits
for an RCU grace period (``/proc/locks`` takes its lock table's writer side),
10 to 20 ms on the reference machine, a third of a call.  So ``holder_soon``
starts the read on a thread when the call begins, and the call's own work
(parsing, the file's write) runs meanwhile; ``_thread``, not ``threading``,
which a call would otherwise import for this alone.
"""

from __future__ import annotations

import _thread
import os
from collections.abc import Callable
from pathlib import Path

#: The kernel's table of file locks (``man 5 proc``).
PROC_LOCKS = Path("/proc/locks")


def root_holder(root: Path, *, locks: Path = PROC_LOCKS) -> int | None:
    """The pid holding a ``flock`` on the directory ``root``; 0 when a process holds it
    whose pid this pid namespace cannot see; ``None`` when nothing holds it.

    ``OSError`` when the root or the table cannot be read: then nothing can
    be told, and the caller says so.
    """
    st = os.stat(root)
    table = locks.read_text()
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holder: int | None = None
    for line in table.splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK" or fields[5] != wanted:
            continue
        pid = int(fields[4]) if fields[4].isdigit() else 0
        holder = max(holder or 0, pid)
    return holder


def holder_soon(root: Path) -> Callable[[], int | OSError | None]:
    """Start ``root_holder(root)`` on a thread; the returned function waits for its answer
    (the ``OSError`` it raised, returned rather than raised)."""
    done = _thread.allocate_lock()
    done.acquire()
    answer: list[int | OSError | None] = []

    def read() -> None:
        try:
            answer.append(root_holder(root))
        except OSError as exc:
            answer.append(exc)
        finally:
            done.release()

    _thread.start_new_thread(read, ())

    def wait() -> int | OSError | None:
        with done:
            return answer[0] if answer else OSError("/proc/locks: not read")
    return wait
