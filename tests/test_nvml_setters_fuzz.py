"""The NVML socket's ``SET`` against hostile clients: refused with an NVML
code, logged once (then counted), nothing written, the server unharmed.

The daemon's server runs in this process on a staged t4 root (as
``tests/test_nvml_socket.py`` runs it) with a setter holding the compiled
state; no reconcile pass runs, so nothing here may need one: every request
below must be refused before anything is written.  A caller that is not
root is a child process under ``setpriv --reuid=nobody`` in a directory
every user may search.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from mokka.noderoot.host import Host
from mokka.simulators.gpudriver import nvml_set, nvml_socket
from mokka.simulators.gpudriver.nvml_setter import Setter
from mokka.simulators.gpudriver.nvml_socket import NvmlSocketServer
from mokka.state.model import State
from tests.nvml_support import node_path, state_with_overrides, write_config
from tests.support import require_tool, snapshot

CHILD_TIMEOUT = 30

PEER = """
import os, socket, sys
path = sys.argv[1]
fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
s = socket.socket(socket.AF_UNIX)
s.connect(f"/proc/self/fd/{fd}/" + os.path.basename(path))
s.sendall(sys.argv[2].encode() + b"\\n")
print(s.makefile("rb").readline().decode(), end="")
"""


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may search: a child that is not root must reach the socket."""
    path = Path(tempfile.mkdtemp(prefix="mokka-set-fuzz-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@asynccontextmanager
async def serving(root: Path, state: State) -> AsyncIterator[NvmlSocketServer]:
    server = NvmlSocketServer(Host(root), setter=Setter(Host(root), state))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server
        nursery.cancel_scope.cancel()


def hostile_lines(uuid: str) -> Iterator[bytes]:
    prefix = b"MOKKA-NVML 1 SET "
    good = uuid.encode()
    yield prefix + good + b" power_limit_mw 999999999\n"          # out of the board's range
    yield prefix + good + b" power_limit_mw 12a\n"
    yield prefix + good + b" compute_mode chaos\n"
    yield prefix + good + b" no_such_setter 1\n"
    yield prefix + good + b" applications_clocks 99999,99999\n"
    yield prefix + good + b" locked_gpu_clocks 1500,300\n"
    yield prefix + b"GPU-00000000-0000-0000-0000-000000000000 compute_mode default\n"
    yield prefix + b"../../../../etc/passwd compute_mode default\n"
    yield prefix + good + b" persistence_mode ../../x\n"
    yield prefix + good + b" persistence_mode enabled extra\n"
    yield prefix + good + b" persistence_mode " + b"e" * 100 + b"\n"
    yield prefix + good + b" persistence_mode \xff\xfe\n"
    yield prefix + good + b" persistence\x00mode enabled\n"
    yield prefix + b"\n"
    rng = random.Random(32)
    for _ in range(40):
        junk = bytes(rng.randrange(1, 256) for _ in range(rng.randrange(0, 120)))
        yield prefix + junk.replace(b"\n", b" ") + b"\n"


@pytest.mark.timeout(90)
async def test_hostile_set_requests_are_refused_and_change_nothing(
    open_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = open_dir / "node"
    state = state_with_overrides("t4", open_dir)
    write_config(root, state)
    uuid = state.gpus[0].uuid
    caplog.set_level(logging.INFO, logger=nvml_socket.__name__)
    path = node_path(root, nvml_socket.SOCKET)

    async def exchange(request: bytes) -> bytes:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with sock:
            await sock.connect(f"/proc/self/fd/{dirfd}/{path.name}")
            with contextlib.suppress(OSError):
                await sock.send(request)
            data = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := await sock.recv(1 << 16):
                    data += chunk
            return data

    with trio.fail_after(60):
        async with serving(root, state):
            before = snapshot(root)
            dirfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
            try:
                answers = [await exchange(line) for line in hostile_lines(uuid)]
                huge = await exchange(b"MOKKA-NVML 1 SET " + b"A" * 1_000_000 + b"\n")
                # a caller that is not root, asking for a change it could make as root
                peer = await trio.to_thread.run_sync(functools.partial(
                    subprocess.run,
                    [require_tool("setpriv"), "--reuid=nobody", "--regid=nogroup",
                     "--clear-groups", sys.executable, "-c", PEER, str(path),
                     f"MOKKA-NVML 1 SET {uuid} compute_mode prohibited"],
                    capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False))
                # the server still serves the engine config
                served = await exchange(b"MOKKA-NVML 1 GET -\n")
            finally:
                os.close(dirfd)
            assert snapshot(root) == before
    for line, answer in zip(hostile_lines(uuid), answers, strict=True):
        assert answer.startswith(b"MOKKA-NVML 1 ERROR "), (line, answer)
    assert answers[0] == b"MOKKA-NVML 1 ERROR %d power limit 999999999 mW is outside " \
        b"60000..70000 mW\n" % nvml_set.INVALID_ARGUMENT
    assert answers[6].startswith(b"MOKKA-NVML 1 ERROR %d " % nvml_set.NOT_FOUND)
    assert huge in (b"MOKKA-NVML 1 ERROR malformed request\n", b"")
    assert peer.returncode == 0, peer.stderr
    assert peer.stdout.startswith(f"MOKKA-NVML 1 ERROR {nvml_set.NO_PERMISSION} ")
    assert served.startswith(b"MOKKA-NVML 1 OK ")
    # Dozens of refused requests, a line for the first of each kind and one
    # counting the rest: the log cannot be flooded.
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(answers) > 50
    assert 2 <= len(warnings) <= 6, warnings
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
