"""Probe latency and readiness while the daemon reconciles without pause.

Starts a real daemon (``python -m mokka``) on a temp root with a copy of
the built-in h100 profile, waits for its first good pass, then for
``--seconds`` rewrites the profile every ``--interval`` seconds (a new
state each time: the GPU temperature changes) while ``--clients``
concurrent clients GET ``/readyz`` in a loop.  Prints the probe latency
(p50, p99, max), the share of 503 answers, how many passes ran, and
``observed_generation`` against ``seen_generation`` once the daemon is idle.

    .venv/bin/python bench/probe_latency.py [--seconds 20] [--clients 50] [--interval 0.2]

The clients run in this process (one trio loop) and speak minimal
HTTP/1.1 over keep-alive connections (a full client library costs more CPU
per request than the daemon's answer does, and would measure itself); their
own scheduling is still in the figures.  The daemon runs in its own process,
as in a pod.  ``BENCH_DAEMON`` replaces ``-m mokka`` in the daemon's command
line (a profiling wrapper script, say).
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent


class Log:
    """The daemon's stdout, read line by line."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._buffer = b""

    async def wait_for(self, pattern: str) -> re.Match:
        regex = re.compile(pattern)
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if match := regex.search(line):
                    return match
            seen = len(self.lines)
            chunk = await self.process.stdout.receive_some(65536)
            if not chunk:
                raise SystemExit("the daemon exited early:\n" + "\n".join(self.lines[-30:]))
            self._buffer += chunk
            *complete, self._buffer = self._buffer.split(b"\n")
            self.lines.extend(raw.decode(errors="replace") for raw in complete)

    async def follow(self) -> None:
        while chunk := await self.process.stdout.receive_some(65536):
            self._buffer += chunk
            *complete, self._buffer = self._buffer.split(b"\n")
            self.lines.extend(raw.decode(errors="replace") for raw in complete)

    async def wait_ready(self) -> int:
        """The daemon's health port, once its first pass is good."""
        port = int((await self.wait_for(r"health probes on .* port=(\d+)"))[1])
        await self.wait_for(r"reconcile pass ok generation=1 ")
        return port


async def stop_daemon(process: trio.Process) -> None:
    """SIGTERM, a minute to exit, then SIGKILL."""
    process.send_signal(signal.SIGTERM)
    with trio.move_on_after(60):
        await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()


class Connection:
    """One keep-alive HTTP/1.1 connection: GET, read the status and the body."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buffer = b""

    async def _fill(self) -> None:
        chunk = await self.stream.receive_some(65536)
        if not chunk:
            raise ConnectionError("the daemon closed the connection")
        self._buffer += chunk

    async def get(self, path: str) -> tuple[int, bytes]:
        await self.stream.send_all(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        while b"\r\n\r\n" not in self._buffer:
            await self._fill()
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(line.split(":", 1)[1]) for line in lines[1:]
            if line.lower().startswith("content-length:")
        )
        while len(self._buffer) < length:
            await self._fill()
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        return status, body


def _write(path: Path, text: str) -> None:
    """An editor's save: a temp file renamed over the profile."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.rename(tmp, path)


async def run(seconds: float, clients: int, interval: float) -> None:
    text = (importlib.resources.files("mokka.state") / "profiles" / "h100.yaml").read_text()
    if "temperature_gpu_c: 29" not in text:
        raise SystemExit("h100.yaml no longer has temperature_gpu_c: 29; update the bench")
    with tempfile.TemporaryDirectory(prefix="mokka-probe-bench-") as tmp:
        work = Path(tmp)
        root = work / "node"
        root.mkdir()
        profile = work / "profile.yaml"
        _write(profile, text)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        process = await trio.lowlevel.open_process(
            [sys.executable, *os.environ.get("BENCH_DAEMON", "-m mokka").split(),
             "--root", str(root), "--profile", str(profile),
             "--health-addr", "127.0.0.1:0", "--node-name", "bench-node"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=work,
        )
        log = Log(process)
        try:
            with trio.fail_after(300):
                port = await log.wait_ready()
            latencies: list[float] = []
            codes: dict[int, int] = {}

            async def prober() -> None:
                connection = Connection(await trio.open_tcp_stream("127.0.0.1", port))
                while True:
                    started = time.perf_counter()
                    status, _ = await connection.get("/readyz")
                    latencies.append(time.perf_counter() - started)
                    codes[status] = codes.get(status, 0) + 1

            async def changer() -> None:
                n = 0
                while True:
                    n += 1
                    changed = text.replace(
                        "temperature_gpu_c: 29", f"temperature_gpu_c: {30 + n % 50}"
                    )
                    await trio.to_thread.run_sync(_write, profile, changed)
                    await trio.sleep(interval)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(log.follow)
                with trio.move_on_after(seconds):
                    async with trio.open_nursery() as load:
                        load.start_soon(changer)
                        for _ in range(clients):
                            load.start_soon(prober)
                # Idle: the last change settles, then the generations are compared.
                await trio.sleep(5)
                connection = Connection(await trio.open_tcp_stream("127.0.0.1", port))
                body = json.loads((await connection.get("/readyz"))[1])
                nursery.cancel_scope.cancel()
            passes = sum("reconcile pass" in line for line in log.lines)
        finally:
            await stop_daemon(process)
    ms = sorted(x * 1000 for x in latencies)
    total = sum(codes.values())
    print(f"{clients} clients, profile changed every {interval:g} s for {seconds:g} s")
    print(f"  requests          {total} ({total / seconds:.0f}/s)")
    print(f"  latency p50       {statistics.median(ms):8.1f} ms")
    print(f"  latency p99       {ms[min(len(ms) - 1, int(len(ms) * 0.99))]:8.1f} ms")
    print(f"  latency max       {ms[-1]:8.1f} ms")
    print(f"  503 share         {100 * codes.get(503, 0) / total:8.1f} %   codes {codes}")
    print(f"  reconcile passes  {passes}")
    print(
        f"  idle afterwards   observed_generation {body['observed_generation']}, "
        f"seen_generation {body['seen_generation']}, phase {body['phase']}, "
        f"status {body['status']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.2)
    args = parser.parse_args()
    trio.run(run, args.seconds, args.clients, args.interval)


if __name__ == "__main__":
    main()
