"""An NRI plugin process for the real-containerd tests (no tests here).

``python -m tests.nri_support SOCKET RECORD [--mount SRC:DST] [--env K=V]``
runs ``mokka.simulators.nri.connection.run_plugin`` on ``SOCKET`` with an
``on_create`` that appends every container it is shown to ``RECORD`` (one
JSON object a line) and answers with the given mounts and env, except for
containers named ``fail-*`` (it raises) and ``slow-*`` (it never answers):
what the tests assert on is what the real containerd sent and did.

``PluginProcess`` starts and stops it from a test, its log in a file, and
polls for its log lines (a plugin runs in its own process so that a test
can kill it the way a node loses it).  ``serve_until_sigterm`` is the
process's main loop, shared with ``tests.nri_daemon_support``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import pytest
import trio

from mokka.simulators.nri import model
from mokka.simulators.nri.connection import run_plugin

#: The plugin's name and index as containerd lists it (``10-mokka-test``).
NAME, INDEX = "mokka-test", "10"


@attrs.define(eq=False)
class PluginProcess:
    """A ``python -m tests.nri_support`` of the test's own."""

    socket: Path
    base: Path
    args: tuple[str, ...] = ()
    _process: subprocess.Popen | None = None

    @property
    def record(self) -> Path:
        return self.base / "created.jsonl"

    @property
    def log(self) -> Path:
        return self.base / "plugin.log"

    def command(self) -> list[str]:
        # -u: each log line reaches the file at once (the test polls it).
        return [sys.executable, "-u", "-m", "tests.nri_support",
                str(self.socket), str(self.record), *self.args]

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        """SIGKILL: the plugin gone without a word, as when its pod is evicted."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=30)
        self._process = None

    def stop(self) -> int | None:
        """SIGTERM (``run_plugin`` cancelled): its exit status, ``None`` if not running."""
        if self._process is None:
            return None
        self._process.send_signal(signal.SIGTERM)
        try:
            return self._process.wait(timeout=30)
        finally:
            self.kill()

    def lines(self, text: str) -> int:
        try:
            return self.log.read_text(errors="replace").count(text)
        except FileNotFoundError:
            return 0

    def wait_for(self, text: str, count: int = 1, timeout: float = 30) -> None:
        """Poll the log until ``text`` appears ``count`` times, or fail the test."""
        deadline = time.monotonic() + timeout
        while self.lines(text) < count:
            if self._process is not None and self._process.poll() is not None:
                pytest.fail(f"the plugin exited ({self._process.returncode}):\n{self.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{text!r} not {count}x in the plugin's log in {timeout}s:\n"
                            f"{self.tail()}")
            time.sleep(0.05)

    def created(self) -> list[dict]:
        try:
            return [json.loads(line) for line in self.record.read_text().splitlines()]
        except FileNotFoundError:
            return []

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def serve_until_sigterm(start: Callable[[trio.Nursery], Awaitable[object]]) -> None:
    """Log to stdout and run what ``start`` starts in a nursery until SIGTERM.

    SIGTERM cancels it as the daemon's teardown does.
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stdout, force=True)

    async def serve() -> None:
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                await start(nursery)
                async for _ in signals:
                    nursery.cancel_scope.cancel(reason="SIGTERM")
                    break

    trio.run(serve)


def _adjustment(args: argparse.Namespace) -> model.Adjustment:
    mounts = tuple(
        model.Mount(destination=dst, source=src, options=("rbind", "ro"))
        for src, _, dst in (spec.partition(":") for spec in args.mount)
    )
    return model.Adjustment(mounts=mounts, env=tuple(args.env))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("socket", type=Path)
    parser.add_argument("record", type=Path)
    parser.add_argument("--mount", action="append", default=[])
    parser.add_argument("--env", action="append", default=[])
    args = parser.parse_args()
    adjustment = _adjustment(args)

    async def on_create(container: model.Container) -> model.Adjustment:
        with args.record.open("a") as record:
            record.write(json.dumps(attrs.asdict(container)) + "\n")
        if container.name.startswith("fail-"):
            raise RuntimeError("the test's policy fails on purpose")
        if container.name.startswith("slow-"):
            await trio.sleep_forever()
        return adjustment

    async def start(nursery: trio.Nursery) -> None:
        await nursery.start(run_plugin, args.socket, NAME, INDEX, on_create)

    serve_until_sigterm(start)
    print("plugin: stopped", flush=True)


if __name__ == "__main__":
    main()
