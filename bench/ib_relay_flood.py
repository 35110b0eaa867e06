"""Memory of the IB relay under hostile connections, against an idle relay.

Run: ``.venv/bin/python bench/ib_relay_flood.py [--connections 2000]``.

Two children each run a bare relay (``relay.Relay``, a fabric key, loopback)
in their own process.  The baseline child is left idle; the measured one
gets, from the parent, ``--connections`` idle connections (most are closed
at once past the cap of connections waiting for their hello), as many more
that each send a greeting and the first half of a 64 KiB frame, and a
hundred that send 60,000 nested ``[`` in a frame.  The parent prints both
children's resident memory (``VmRSS``, and ``VmHWM``, the peak) and the
ratio, after the flood and again once the hello deadline has passed.  A
relay that kept what strangers send would grow with ``--connections``; a
bounded one stays within a few MiB of the baseline whatever the count.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from mokka.simulators.ib.relay import HELLO_TIMEOUT
from mokka.simulators.ib.relaywire import MAGIC, MAX_MESSAGE, NONCE_SIZE

CHILD = textwrap.dedent("""
    import sys, trio
    from pathlib import Path
    from mokka.simulators.ib.relay import Relay

    async def on_message(peer, message):
        pass

    async def main():
        relay = Relay(nodes=("node-a", "node-b"), me=0, addresses={},
                      listen=("127.0.0.1", 0), own_guids=dict, on_message=on_message,
                      key_file=Path(sys.argv[1]))
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)
            print(relay.port, flush=True)
            await trio.sleep_forever()

    trio.run(main)
""")


def memory_kib(pid: int) -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def flood(port: int, count: int) -> list[socket.socket]:
    held = []
    half_frame = MAGIC + bytes(NONCE_SIZE) + MAX_MESSAGE.to_bytes(4, "big") + b"x" * 32768
    nested = MAGIC + bytes(NONCE_SIZE) + (60_000).to_bytes(4, "big") + b"[" * 60_000
    for index in range(2 * count + 100):
        sock = socket.create_connection(("127.0.0.1", port))
        with contextlib.suppress(OSError):
            if index >= 2 * count:
                sock.sendall(nested + bytes(32))
            elif index >= count:
                sock.sendall(half_frame)
        held.append(sock)
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        key = Path(scratch) / "relay.key"
        key.write_text("k" * 64 + "\n")
        children = [subprocess.Popen([sys.executable, "-c", CHILD, str(key)],
                                     stdout=subprocess.PIPE, text=True) for _ in range(2)]
        try:
            baseline, measured = children
            ports = [int(child.stdout.readline()) for child in children]  # type: ignore[union-attr]
            held = flood(ports[1], args.connections)
            time.sleep(1)  # the relay reads what was sent
            rows = [("after the flood", memory_kib(baseline.pid), memory_kib(measured.pid))]
            time.sleep(HELLO_TIMEOUT + 1)  # past the hello deadline: all dropped
            rows.append(("after the deadline", memory_kib(baseline.pid),
                         memory_kib(measured.pid)))
            for sock in held:
                sock.close()
            print(f"{'':20} {'baseline RSS':>13} {'flooded RSS':>12} {'peak':>9} {'ratio':>6}")
            for name, (base, _), (rss, peak) in rows:
                print(f"{name:20} {base:>10} kB {rss:>9} kB {peak:>6} kB {rss / base:>6.2f}")
            print(f"({2 * args.connections + 100} connections; alive: "
                  f"{measured.poll() is None})")
        finally:
            for child in children:
                child.kill()
                child.wait()


if __name__ == "__main__":
    main()
