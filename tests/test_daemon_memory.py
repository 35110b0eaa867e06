"""The daemon's C heap stays one malloc arena (``mokka.daemon.memory``).

Without the limit, glibc gives each worker thread an arena of its own, and a
daemon driven by a ``mokka ctl`` loop grew by about 15 MiB per thousand
changes (``bench/ctl_soak.py`` measures it; no test asserts on memory).
These tests check the mechanism: how many arenas there are, counted by glibc
itself (``malloc_info``) in a child process, and from outside a real daemon
(its heaps in ``/proc/PID/maps``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import trio

from mokka.daemon.memory import ARENA_ENV, limit_malloc_arenas
from tests.daemon_support import PROCESS_TIMEOUT, daemon_env, running_daemon, stop_daemon
from tests.support import snapshot

#: A child that (maybe) limits the arenas, then has six threads allocate at
#: once, and prints how many arenas glibc reports (``<heap nr=...>`` elements
#: of ``malloc_info``).  Blocks of 2,000 bytes: above CPython's small-object
#: allocator, below glibc's mmap threshold, so they come from an arena.
_COUNT_ARENAS = """
import ctypes, os, sys, tempfile, threading
from mokka.daemon.memory import limit_malloc_arenas
if sys.argv[1] == "limit":
    print("taken" if limit_malloc_arenas() else "refused")
start = threading.Barrier(6)
kept = []
def allocate():
    start.wait()
    kept.append([bytes(2000) for _ in range(200)])
threads = [threading.Thread(target=allocate) for _ in range(6)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(None)
libc.fdopen.restype = ctypes.c_void_p
with tempfile.TemporaryFile() as out:
    stream = ctypes.c_void_p(libc.fdopen(os.dup(out.fileno()), b"w"))
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    out.seek(0)
    print("arenas", out.read().decode().count("<heap nr="))
"""

#: glibc's size of one heap of an arena other than the main one
#: (``HEAP_MAX_SIZE`` on 64-bit: twice the largest mmap threshold).
_HEAP_SIZE = 64 << 20


def _arenas_in_child(mode: str) -> list[str]:
    env = {k: v for k, v in daemon_env().items() if k != ARENA_ENV}
    done = subprocess.run([sys.executable, "-c", _COUNT_ARENAS, mode], env=env,
                          capture_output=True, text=True, timeout=PROCESS_TIMEOUT, check=True)
    return done.stdout.split()


def _thread_heaps(pid: int) -> int:
    """glibc heaps of arenas other than the main one in ``pid``'s address space.

    Each is one anonymous reservation of ``_HEAP_SIZE`` aligned to its size:
    the part in use read-write, the rest ``---p``, adjacent in the maps.
    """
    rows = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        rows.append((start, end, fields[1], len(fields) > 5))
    heaps = 0
    for i, (start, end, perms, named) in enumerate(rows):
        if start % _HEAP_SIZE or named or perms != "rw-p":
            continue
        for next_start, next_end, _perms, next_named in rows[i + 1:]:
            if next_start != end or next_named or end - start >= _HEAP_SIZE:
                break
            end = next_end
        heaps += end - start == _HEAP_SIZE
    return heaps


def test_after_the_limit_every_thread_allocates_from_one_arena():
    # The measure itself first: without the limit, six threads at once get arenas of their own.
    assert int(_arenas_in_child("plain")[-1]) > 1
    assert _arenas_in_child("limit") == ["taken", "arenas", "1"]


def test_an_operators_own_arena_limit_is_left_alone(monkeypatch):
    monkeypatch.setenv(ARENA_ENV, "4")
    assert limit_malloc_arenas() is False


async def test_a_running_daemon_keeps_one_arena_through_ctl_changes(
    node_root: Path, tmp_path: Path, monkeypatch
):
    """A real daemon, several ``mokka ctl`` changes (each a converge in worker
    threads): no thread arena appears beside the main one; teardown restores the root."""
    before = snapshot(node_root)
    monkeypatch.delenv(ARENA_ENV, raising=False)  # the daemon's environment is this one's
    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon("--root", str(node_root), "--health-addr", "127.0.0.1:0",
                                  cwd=tmp_path) as daemon:
            await daemon.wait_for_line(r"reconcile pass ok generation=1\b")
            for n in range(6):
                await trio.run_process(
                    [sys.executable, "-m", "mokka", "ctl", "--root", str(node_root),
                     "temp", "--gpu", str(n), "--celsius", str(60 + n)],
                    env=daemon_env(), capture_stdout=True, capture_stderr=True)
            # the changes converged (the last one's pass is never superseded)
            await daemon.wait_for_line(r"reconcile pass ok generation=([2-9]|\d\d+)\b")
            heaps = _thread_heaps(daemon.process.pid)
            code = await stop_daemon(daemon, signal.SIGTERM)
    assert heaps == 0, "\n".join(daemon.lines[-20:])
    assert code == 0, "\n".join(daemon.lines)
    assert snapshot(node_root) == before
