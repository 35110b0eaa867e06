"""A real daemon process for the tests: start it, read its log line by line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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

    async def wait_for_line(self, pattern: str) -> re.Match:
        regex = re.compile(pattern)
        for line in self.lines:
            if match := regex.search(line):
                return match
        while True:
            chunk = await self.process.stdout.receive_some(65536)
            if not chunk:
                raise AssertionError(
                    f"daemon exited before logging {pattern!r}; log:\n" + "\n".join(self.lines)
                )
            self._buffer += chunk
            *complete, self._buffer = self._buffer.split(b"\n")
            for raw in complete:
                line = raw.decode(errors="replace")
                self.lines.append(line)
                if match := regex.search(line):
                    return match

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


async def start_daemon(*args: str, cwd: Path) -> DaemonProcess:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "mokka", *args, "--node-name", "test-node"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=daemon_env(),
    )
    return DaemonProcess(process)


