"""Probe latency and the daemon's memory under 500 concurrent clients and a hostile flood.

Starts a real daemon (``python -m mokka``, the built-in h100 profile, a temp
root), waits for its first good pass, then, in one run, each phase for
``--seconds``:

1. **floor**: one client GETs ``/readyz`` in a loop, on one keep-alive
   connection, then on a fresh connection per probe (as the kubelet does);
2. **500 clients**: ``--clients`` keep-alive clients at once: their p99
   against the keep-alive floor;
3. **flood**: ``--flood`` connections that send half a request and hold on,
   and ``--never-read`` clients that pipeline requests and never read their
   answers, while one client probes on fresh connections: its p99 against
   the fresh-connection floor.

The daemon's RSS (``VmRSS``) is sampled every 0.1 s; the peaks of phases 2
and 3 are reported against its RSS at the end of phase 1.  The clients run
in this process (one trio loop, the minimal HTTP client of
``probe_latency.py``), so their own scheduling is in the figures.

    .venv/bin/python bench/probe_flood.py [--seconds 5] [--clients 500] [--flood 1000]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
from figures import percentile, report
from probe_latency import ROOT, Connection, Log, stop_daemon

QUICK_ARGS = ["--seconds", "3", "--flood", "600"]
NAME = "probe_flood"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def keep_alive_prober(port: int, latencies: list[float]) -> None:
    """One keep-alive connection, a new one when the server closes it (hypercorn
    does after 1,000 requests on one connection)."""
    while True:
        connection = Connection(await trio.open_tcp_stream("127.0.0.1", port))
        try:
            while True:
                started = time.perf_counter()
                await connection.get("/readyz")
                latencies.append(time.perf_counter() - started)
        except (ConnectionError, trio.BrokenResourceError):
            await connection.stream.aclose()


async def fresh_prober(port: int, latencies: list[float]) -> None:
    """A new connection per probe, the time to connect included."""
    while True:
        started = time.perf_counter()
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await Connection(stream).get("/readyz")
        latencies.append(time.perf_counter() - started)


async def half_request(port: int, held: list[trio.SocketStream]) -> None:
    """A slow client: half a request, then nothing (reconnects when dropped)."""
    while True:
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            held.append(stream)
            await stream.send_all(b"GET /readyz HTTP/1.1\r\nX-Slow: ")
            await stream.receive_some(1)  # until the server hangs up
        except (trio.BrokenResourceError, OSError):
            pass


async def never_reader(port: int) -> None:
    """Pipelines requests on a tiny receive buffer and never reads (reconnects when dropped)."""
    request = b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n" * 100
    while True:
        sock = trio.socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            await sock.connect(("127.0.0.1", port))
            stream = trio.SocketStream(sock)
            while True:
                await stream.send_all(request)
        except (trio.BrokenResourceError, OSError):
            sock.close()


async def phase(seconds: float, *tasks) -> None:
    with trio.move_on_after(seconds):
        async with trio.open_nursery() as nursery:
            for task, *args in tasks:
                nursery.start_soon(task, *args)


async def run(seconds: float, clients: int, flood: int, never_read: int) -> None:
    with tempfile.TemporaryDirectory(prefix="mokka-probe-flood-") as tmp:
        work = Path(tmp)
        (work / "node").mkdir()
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "mokka", "--root", str(work / "node"),
             "--health-addr", "127.0.0.1:0", "--node-name", "bench-node"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=work,
        )
        log = Log(process)
        samples: list[tuple[str, int]] = []
        stage = ["floor"]

        async def sample_rss() -> None:
            while True:
                samples.append((stage[0], rss_bytes(process.pid)))
                await trio.sleep(0.1)

        keep_alive_floor: list[float] = []
        fresh_floor: list[float] = []
        crowd: list[float] = []
        flooded: list[float] = []
        held: list[trio.SocketStream] = []
        try:
            with trio.fail_after(120):
                port = await log.wait_ready()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(log.follow)
                nursery.start_soon(sample_rss)
                await phase(seconds, (keep_alive_prober, port, keep_alive_floor))
                await phase(seconds, (fresh_prober, port, fresh_floor))
                baseline = rss_bytes(process.pid)
                stage[0] = "clients"
                await phase(seconds, *[(keep_alive_prober, port, crowd)] * clients)
                stage[0] = "flood"
                await phase(seconds, *[(half_request, port, held)] * flood,
                            *[(never_reader, port)] * never_read,
                            (fresh_prober, port, flooded))
                for stream in held:
                    await stream.aclose()
                stage[0] = "after"
                await trio.sleep(1)
                # The daemon answers once the flood is gone.
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    status, _ = await Connection(stream).get("/healthz")
                nursery.cancel_scope.cancel()
        finally:
            await stop_daemon(process)
    peak = {name: max((rss for s, rss in samples if s == name), default=0)
            for name in ("clients", "flood")}
    lines = [line for line in log.lines if "health probes:" in line]
    print(f"{clients} keep-alive clients, then a flood of {flood} half requests and "
          f"{never_read} clients that never read; {seconds:g} s each")
    floor99 = percentile(keep_alive_floor, 99) * 1000
    fresh99 = percentile(fresh_floor, 99) * 1000
    report(NAME, "probe p99, 1 keep-alive client", floor99, "ms")
    report(NAME, f"probe p99, {clients} keep-alive clients", percentile(crowd, 99) * 1000, "ms",
           floor=floor99, floor_name="1 client")
    report(NAME, "probe p99, 1 fresh-connection client", fresh99, "ms")
    report(NAME, "probe p99 under the flood (fresh connections)",
           percentile(flooded, 99) * 1000, "ms", floor=fresh99, floor_name="no flood")
    report(NAME, "probes answered under the flood", len(flooded), "count")
    report(NAME, f"daemon RSS peak, {clients} clients", peak["clients"] / 2**20, "MiB",
           floor=baseline / 2**20, floor_name="after 1 client")
    report(NAME, "daemon RSS peak, flood", peak["flood"] / 2**20, "MiB",
           floor=baseline / 2**20, floor_name="after 1 client")
    report(NAME, "health log lines during the run", len(lines), "count")
    print(f"  /healthz after the flood: {status}; daemon exit code {process.returncode}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--flood", type=int, default=1000)
    parser.add_argument("--never-read", type=int, default=20)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.clients + args.flood + args.never_read + 64
    if soft < wanted:  # this process holds every client's descriptor
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, wanted), hard))
    trio.run(run, args.seconds, args.clients, args.flood, args.never_read)


if __name__ == "__main__":
    main()
