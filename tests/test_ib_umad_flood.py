"""Connection floods on the umad socket, against real processes.

Running out of descriptors is process-wide, so each flood hits a child: a
small script that stages the ib simulator and runs its daemon with a low
soft ``RLIMIT_NOFILE`` (``accept`` fails with ``EMFILE``: the connected tool
goes on being answered, and ``sminfo`` works once the flood is gone), and
a real ``mokka daemon`` started under a soft limit of 256, which raises it
to the hard one and refuses connections past its cap.  Both leave the root
as they found it.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from mokka import cli
from mokka.simulators.ib import mad, umadsocket
from mokka.simulators.ib.mockib import UMAD_SOCKET
from tests.daemon_support import (
    PROCESS_TIMEOUT,
    DaemonProcess,
    daemon_env,
    kill_if_running,
    start_daemon,
    stop_daemon,
    wait_for_lines,
)
from tests.ib_support import (
    ib_native_fixture,  # noqa: F401  (a fixture: tests name it ib_native)
    native_env_fixture,  # noqa: F401  (a fixture: tests name it native_env)
)
from tests.support import ROOT, snapshot
from tests.test_ib_mad import text, tool

pytestmark = pytest.mark.timeout(180)

#: The child: stage, serve, lower the soft descriptor limit to what is open
#: plus argv[2], report "ready"; at the end of stdin restore it and discard.
CHILD = textwrap.dedent("""
    import logging, os, resource, sys, trio
    from pathlib import Path
    from mokka.noderoot.host import Host
    from tests.ib_support import discard_with_pcibus, stage_with_pcibus, state_of
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")

    async def main(root, spare):
        host, state = Host(root), state_of("gb200")
        sim = await stage_with_pcibus(host, state)
        stdin = trio.lowlevel.FdStream(os.dup(0))
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, state)
            limits = resource.getrlimit(resource.RLIMIT_NOFILE)
            opened = len(os.listdir("/proc/self/fd")) - 1  # less listdir's own
            resource.setrlimit(resource.RLIMIT_NOFILE, (opened + spare, limits[1]))
            print("ready", flush=True)
            while await stdin.receive_some():
                pass
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
            nursery.cancel_scope.cancel()
        await stdin.aclose()
        await discard_with_pcibus(host, sim)

    trio.run(main, Path(sys.argv[1]), int(sys.argv[2]))
""")


def umad_address(root: Path) -> tuple[int, str]:
    """A descriptor of the socket's directory and the address through it
    (a node root can be deeper than ``sun_path`` holds); close the descriptor."""
    path = root / UMAD_SOCKET.lstrip("/")
    dirfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return dirfd, f"/proc/self/fd/{dirfd}/{path.name}"


async def hello(address: str) -> trio.socket.SocketType | None:
    """A tool's connection with its HELLO answered, or ``None`` when the
    daemon closed it unanswered (refused)."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    await sock.connect(address)
    try:
        await sock.send(mad.control_frame(mad.CTL_HELLO, 0))
        reply = await sock.recv(64)
    except (ConnectionResetError, BrokenPipeError):
        reply = b""
    if not reply:
        sock.close()
        return None
    assert mad.parse_reply(reply) == (mad.CTL_HELLO, 0, 0)
    return sock


async def test_accept_waits_out_emfile_and_keeps_serving(
    node_root: Path, native_env: Path, tmp_path: Path
) -> None:
    before = snapshot(node_root)
    child = await trio.lowlevel.open_process(
        [sys.executable, "-c", CHILD, str(node_root), "12"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        cwd=ROOT, env=daemon_env(),
    )
    log = DaemonProcess(child)
    flood: list[socket.socket] = []
    try:
        with trio.fail_after(PROCESS_TIMEOUT):
            await log.wait_for_line(r"^ready$")
            dirfd, address = umad_address(node_root)
            try:
                keeper = await hello(address)
                assert keeper is not None
                # More connections than descriptors: some wait in the listen
                # backlog, the rest are refused by the kernel (EAGAIN).
                for _ in range(200):
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                    sock.setblocking(False)
                    try:
                        sock.connect(address)
                    except BlockingIOError:
                        sock.close()
                        continue
                    flood.append(sock)
                await log.wait_for_line(r"cannot accept a tool's connection \(Too many open")
                # The tool connected before the flood is still answered.
                await keeper.send(mad.control_frame(mad.CTL_HELLO, 1))
                assert mad.parse_reply(await keeper.recv(64)) == (mad.CTL_HELLO, 0, 0)
                keeper.close()
            finally:
                os.close(dirfd)
            for sock in flood:
                sock.close()
            flood.clear()
            done = await tool(node_root, "sminfo", "-t", "1000")
            assert done.returncode == 0, done.stderr
            assert re.match(r"sminfo: sm lid 1 ", text(done))
            assert child.returncode is None
            assert child.stdin is not None
            await child.stdin.aclose()
            await log.drain()
            assert await child.wait() == 0, "\n".join(log.lines)
    finally:
        for sock in flood:
            sock.close()
        await kill_if_running(log)
    refusals = [line for line in log.lines if "cannot accept a tool's connection" in line]
    # Rate-limited: the first, and one that counts the rest (the backoff
    # retries every second at most, for far less than the limit's interval).
    assert 1 <= len(refusals) <= 2, refusals
    assert snapshot(node_root) == before


@contextmanager
def soft_fd_limit(soft: int) -> Iterator[None]:
    """This process's soft descriptor limit lowered (for a child to inherit)."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def open_file_limits(pid: int) -> tuple[int, int]:
    """(soft, hard) ``Max open files`` of a process."""
    text = Path(f"/proc/{pid}/limits").read_text()
    soft, hard = re.search(r"^Max open files\s+(\d+)\s+(\d+)", text, re.M).groups()
    return int(soft), int(hard)


async def test_the_daemon_raises_its_fd_limit_and_caps_umad_connections(
    node_root: Path, tmp_path: Path
) -> None:
    before = snapshot(node_root)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    cap = min(umadsocket.MAX_CONNECTIONS, hard // 4)
    assert hard >= 1024, "the test needs a hard descriptor limit of 1024 or more"
    with soft_fd_limit(256):  # what a shell hands down
        daemon = await start_daemon(
            "--root", str(node_root), "--profile", "h100", "--health-addr", "127.0.0.1:0",
            "--ib-mode", "sysfs", cwd=tmp_path)
    kept: list[trio.socket.SocketType] = []
    try:
        with trio.fail_after(PROCESS_TIMEOUT):
            await daemon.wait_for_line(r"mock-ib: MADs served at ")
            await daemon.wait_for_line(r"reconcile pass ok generation=1")
            assert open_file_limits(daemon.process.pid) == (hard, hard)
            held_before = len(os.listdir(f"/proc/{daemon.process.pid}/fd"))
            dirfd, address = umad_address(node_root)
            try:
                refused = 0
                for _ in range(cap + 40):
                    sock = await hello(address)
                    if sock is None:
                        refused += 1
                    else:
                        kept.append(sock)
            finally:
                os.close(dirfd)
            assert (len(kept), refused) == (cap, 40)
            await wait_for_lines(daemon, r"refused a tool's connection", 1)
            for sock in kept:
                sock.close()
            kept.clear()
            # The service sees the closes a moment later: until then the cap is
            # still full and a tool's connection would be refused like the 40
            # above, so wait for the daemon to hold no more descriptors than
            # before the flood.
            fds = Path(f"/proc/{daemon.process.pid}/fd")
            with trio.fail_after(30):
                while len(os.listdir(fds)) > held_before:  # noqa: ASYNC110 (another process)
                    await trio.sleep(0.05)
            done = await tool(node_root, "sminfo", "-t", "1000")
            assert done.returncode == 0, done.stderr
            assert await stop_daemon(daemon, signal.SIGTERM) == 0
    finally:
        for sock in kept:
            sock.close()
        await kill_if_running(daemon)
    lines = [line for line in daemon.lines if "refused a tool's connection" in line]
    # The first refusal, then at the service's end one line for the other 39.
    assert len(lines) == 2, lines
    assert "(and 38 more like it since the last such line)" in lines[1]
    assert await trio.to_thread.run_sync(cli.main, ["cleanup", "--root", str(node_root)]) == 0
    assert snapshot(node_root) == before
