"""A real daemon process for the tests: start it, read its log line by line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from tests.support import ROOT

#: Bound on every wait for the real daemon (start-up includes compiling the profile).
PROCESS_TIMEOUT = 60


@attrs.define
class DaemonProcess:
    """A real ``python -m mokka`` whose stdout (the log) is read line by line."""

    process: trio.Process
    lines: list[str] = attrs.field(factory=list)
    _buffer: bytes = b""

    async def read_more(self) -> bool:
        """One chunk of output into ``lines`` (complete lines only); False at the end."""
        chunk = await self.process.stdout.receive_some(65536)
        if not chunk:
            return False
        self._buffer += chunk
        *complete, self._buffer = self._buffer.split(b"\n")
        self.lines.extend(raw.decode(errors="replace") for raw in complete)
        return True

    async def wait_for_line(self, pattern: str) -> re.Match:
        """The first log line (already read or still to come) matching ``pattern``."""
        regex = re.compile(pattern)
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if match := regex.search(line):
                    return match
            seen = len(self.lines)
            if not await self.read_more():
                raise AssertionError(
                    f"daemon exited before logging {pattern!r}; log:\n" + "\n".join(self.lines)
                )

    async def drain(self) -> None:
        while chunk := await self.process.stdout.receive_some(65536):
            self._buffer += chunk
        self.lines.extend(self._buffer.decode(errors="replace").splitlines())
        self._buffer = b""


def daemon_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("MOKKA_ROOT", None)
    return env


async def start_daemon(
    *args: str, cwd: Path, node_name: str = "test-node", env: dict[str, str] | None = None
) -> DaemonProcess:
    """``python -m mokka ARGS --node-name NODE_NAME``, its log (stdout and stderr) piped.

    ``env`` adds to (or overrides) ``daemon_env()``.
    """
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "mokka", *args, "--node-name", node_name],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env={**daemon_env(), **(env or {})},
    )
    return DaemonProcess(process)


@asynccontextmanager
async def running_daemon(
    *args: str, cwd: Path, node_name: str = "test-node", env: dict[str, str] | None = None
) -> AsyncIterator[DaemonProcess]:
    """``start_daemon`` for the body of a ``with``: a process the body leaves
    running (a failed assertion, say) is killed, so none outlives its test; on
    a normal exit the rest of the log is read into ``lines``."""
    daemon = await start_daemon(*args, cwd=cwd, node_name=node_name, env=env)
    try:
        yield daemon
    finally:
        await kill_if_running(daemon)
    await daemon.drain()


async def wait_for_lines(daemon: DaemonProcess, pattern: str, count: int) -> list[str]:
    """Until at least ``count`` log lines match ``pattern``; returns the matching lines."""
    regex = re.compile(pattern)
    while True:
        matching = [line for line in daemon.lines if regex.search(line)]
        if len(matching) >= count:
            return matching
        if not await daemon.read_more():
            raise AssertionError(
                f"daemon exited before logging {pattern!r} {count} times; log:\n"
                + "\n".join(daemon.lines)
            )


async def stop_daemon(daemon: DaemonProcess, signum: int) -> int:
    """Send ``signum`` and wait for the exit code; the rest of the log is read
    first, so a teardown that logs more than a pipe holds cannot block on it."""
    daemon.process.send_signal(signum)
    await daemon.drain()
    return await daemon.process.wait()


async def kill_if_running(daemon: DaemonProcess) -> None:
    """The cleanup of a test that failed half-way: the process must not outlive it."""
    if daemon.process.returncode is None:
        await kill_daemon(daemon)


async def kill_daemon(daemon: DaemonProcess) -> None:
    """SIGKILL, as a node's crash or an OOM kill: nothing of the teardown runs."""
    daemon.process.kill()
    await daemon.process.wait()


def run_mokka(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A real ``python -m mokka ARGS`` run to its end (``--once``, ``cleanup``), bounded."""
    return subprocess.run(
        [sys.executable, "-m", "mokka", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=daemon_env(),
        timeout=PROCESS_TIMEOUT,
        check=False,
    )
