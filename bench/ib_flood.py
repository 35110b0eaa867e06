"""Memory of a mock-ib daemon under hostile tools, against its own idle figure.

Run: ``.venv/bin/python bench/ib_flood.py [--mads 50000] [--connections 2000]``.

One child stages the ib simulator on a scratch root and runs its daemon
(``ib_idle.py``'s child: the umad socket of one node, no relay).  Its
resident set is read (``VmRSS``) once idle, the floor, and then after each
flood, while the flooding connections are still open and again once they
are gone:

* ``--mads`` requests with the longest timeout a umad header can carry
  (2**32-1 ms, 2**32-1 retries) to a LID nothing answers, from one tool
  that reads what comes back;
* a tool that sends requests and never reads the answers (until the daemon
  drops it);
* ``--connections`` tools connected at once, each after its HELLO;
* ``--junk`` frames too short to be anything, from one tool.

Each figure is the RSS as a ratio to the idle one: bounded tables keep it
near 1 whatever the flood's size (Python keeps some freed memory for reuse,
so "after" is not exactly the floor).  Needs the package's native build.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from figures import report
from ib_idle import start

from mokka.daemon.limits import raise_fd_limit
from mokka.simulators.ib import mad
from mokka.simulators.ib.mockib import UMAD_SOCKET

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' own MADs

from tests.mad_requests import smp_get

QUICK_ARGS = ["--mads", "5000", "--connections", "300", "--junk", "20000"]
BENCH = "ib_flood"
#: A LID no entity of a one-node fabric has: its requests wait for their timeout.
NOBODY = 77
U32_MAX = 2**32 - 1


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmRSS for {pid}")


@contextmanager
def address_of(root: Path) -> Iterator[str]:
    """The socket's address through a descriptor of its directory."""
    path = root / UMAD_SOCKET.lstrip("/")
    dirfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{dirfd}/{path.name}"
    finally:
        os.close(dirfd)


def connect(address: str) -> socket.socket:
    """A tool's connection after its HELLO (closed at once past the daemon's cap)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(30)
    sock.connect(address)
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        sock.send(mad.control_frame(mad.CTL_HELLO, 0))
        sock.recv(64)
    return sock


def long_timeout_mads(address: str, count: int) -> socket.socket:
    """``count`` requests that wait as long as they may; their answers read."""
    sock = connect(address)
    sock.setblocking(False)
    sent = 0
    while sent < count:
        try:
            sock.send(smp_get(NOBODY, tid=sent, timeout_ms=U32_MAX, retries=U32_MAX))
            sent += 1
        except BlockingIOError:
            pass
        try:
            while sock.recv(512):
                pass
        except BlockingIOError:
            pass
    sock.setblocking(True)
    return sock


def never_reads(address: str) -> int:
    """Requests the daemon answers, none of them read; how many went out."""
    sock = connect(address)
    sent = 0
    try:
        while True:
            sock.send(smp_get(2, tid=sent))  # LID 2: the node's first HCA
            sent += 1
    except TimeoutError:
        pass  # the daemon stopped reading the tool instead
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
            raise
    finally:
        sock.close()
    return sent


def measure(pid: int, name: str, idle: float, hold: float = 0.5) -> None:
    time.sleep(hold)  # let the daemon finish with what was sent
    report(BENCH, name, rss_mib(pid), "MiB", floor=idle, floor_name="idle mock-ib",
           goal="ratio near 1, whatever the flood's size")


def main(mads: int, connections: int, junk: int) -> None:
    raise_fd_limit()  # this process holds the flood's connections
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "node"
        root.mkdir()
        child = start(["--serve", str(root), "solo"])
        try:
            time.sleep(1)  # start-up's worker threads settle
            idle = rss_mib(child.pid)
            report(BENCH, "idle mock-ib RSS", idle, "MiB")
            with address_of(root) as address:
                sock = long_timeout_mads(address, mads)
                measure(child.pid, f"{mads:,} long-timeout MADs, tool connected", idle)
                sock.close()
                measure(child.pid, f"{mads:,} long-timeout MADs, tool gone", idle)

                sent = never_reads(address)
                measure(child.pid, f"a tool that never reads ({sent:,} sent)", idle)

                held = [connect(address) for _ in range(connections)]
                measure(child.pid, f"{connections:,} connections held", idle)
                for sock in held:
                    sock.close()
                measure(child.pid, f"{connections:,} connections gone", idle)

                sock = connect(address)
                for i in range(junk):
                    sock.send(i.to_bytes(4, "little") + b"junk")
                measure(child.pid, f"{junk:,} junk frames", idle)
                sock.close()
            if child.poll() is not None:
                raise SystemExit(f"the daemon exited ({child.returncode}) under the flood")
        finally:
            child.terminate()
            child.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mads", type=int, default=50_000)
    parser.add_argument("--connections", type=int, default=2_000)
    parser.add_argument("--junk", type=int, default=100_000)
    args = parser.parse_args()
    main(args.mads, args.connections, args.junk)
