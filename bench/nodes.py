"""Real daemons for the benchmarks: start them, watch them, read what they cost.

A benchmark measures the product as a node runs it: ``python -m mokka
daemon`` in its own process, on a scratch root, with its log in a file (so a
full pipe never stalls it and reading the log costs it nothing).  Every
flag the figures depend on is passed explicitly: the root, ``--node-name``
and ``--health-addr 127.0.0.1:<port>`` (a free loopback port chosen here).

Timing uses the daemon's own log timestamps where it can: the
``reconcile pass ok generation=N`` line is stamped (UTC, milliseconds) when
the pass finished, so polling the file adds nothing to the figure.

Costs come from ``/proc``: CPU seconds from ``stat`` (the whole thread
group), context switches summed over ``task/*/status``, PSS from
``smaps_rollup`` (a process and its descendants).
"""

from __future__ import annotations

import datetime
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: A log record's timestamp, e.g. ``2026-12-01T15:02:21.263Z``.
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z")
#: A finished pass: generation and outcome.
PASS_OK = re.compile(r"reconcile pass ok generation=(\d+)")
#: What the teardown took and how many failures it reported.
TEARDOWN = re.compile(r"teardown finished duration_s=([\d.]+) failures=(\d+)")


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (all held open while choosing, so none repeats)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def env() -> dict[str, str]:
    """The environment of a child process: this checkout importable, no inherited root.

    Bytecode is used as an installed package's would be: a development
    shell's ``PYTHONDONTWRITEBYTECODE`` would otherwise bill compiling every
    module to every process measured (see ``warm_bytecode``).
    """
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), out.get("PYTHONPATH")]))
    for name in ("MOKKA_ROOT", "NODE_NAME", "PYTHONDONTWRITEBYTECODE"):
        out.pop(name, None)
    return out


def timed_process(cmd: list[str], *, timeout: float, env: dict[str, str] | None = None,
                  stdout: int | None = subprocess.DEVNULL) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of one process run to completion (it must exit 0).

    Waited for with a blocking ``wait4``, never ``subprocess.run(timeout=...)``:
    with a timeout, ``Popen.wait`` polls with sleeps growing to 50 ms, and
    the figure would end at the next poll (a 9 ms ``tar -x`` read as 15.5
    ms).  A timer kills a process that hangs.
    """
    started = time.perf_counter()
    process = subprocess.Popen(cmd, env=env, stdout=stdout)
    watchdog = threading.Timer(timeout, process.kill)
    watchdog.start()
    try:
        _pid, status, usage = os.wait4(process.pid, 0)
    finally:
        watchdog.cancel()
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, cmd)
    return wall, usage.ru_utime + usage.ru_stime


def warm_bytecode() -> None:
    """Compile the package's bytecode (into its ``__pycache__``) before anything is timed."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "mokka")],
                   check=True, env=env(), timeout=600, stdout=subprocess.DEVNULL)


def mokka_command() -> list[str]:
    """The ``mokka`` console script beside this interpreter (what a user runs), else ``-m``."""
    script = Path(sys.executable).with_name("mokka")
    return [str(script)] if script.exists() else [sys.executable, "-m", "mokka"]


@dataclass
class Daemon:
    """One ``mokka daemon`` process on its own root, port and node name."""

    root: Path
    port: int
    name: str
    log: Path
    process: subprocess.Popen
    started: float = field(default_factory=time.time)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes] | None:
        """(status, body) of ``GET path``, or None while nothing answers."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        except OSError:
            return None
        finally:
            connection.close()

    def readyz(self) -> dict | None:
        answer = self.get("/readyz")
        return json.loads(answer[1]) if answer else None

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise SystemExit(f"daemon {self.name} exited with {self.process.returncode}:\n"
                             + self.log_text()[-3000:])


def start(root: Path, name: str, *extra: str, work: Path | None = None,
          port: int | None = None, environ: dict[str, str] | None = None) -> Daemon:
    """Start ``mokka daemon`` on ``root`` (created), logging to ``<work>/<name>.log``.

    ``environ`` adds to (or overrides) ``env()``.
    """
    root.mkdir(parents=True, exist_ok=True)
    work = work or root.parent
    port = port or free_ports(1)[0]
    log = work / f"{name}.log"
    argv = [*mokka_command(), "daemon", "--root", str(root), "--node-name", name,
            "--health-addr", f"127.0.0.1:{port}", *extra]
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=work,
                                   env={**env(), **(environ or {})}, start_new_session=True)
    return Daemon(root=root, port=port, name=name, log=log, process=process)


def wait_ready(daemons: list[Daemon], timeout: float, poll: float = 0.1) -> dict[str, float]:
    """Seconds from each daemon's start until its ``/readyz`` answered 200.

    A daemon is asked only once its log shows a good pass, before which it
    cannot be ready: each answer costs it about 0.65 ms of CPU, and asking
    a starting fleet of 100 every 0.25 s from the start took some 5 s of
    CPU from the very start being measured (and as much again here).
    """
    ready: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(ready) < len(daemons):
        for daemon in daemons:
            if daemon.name in ready:
                continue
            daemon.check_alive()
            if not PASS_OK.search(daemon.log_text()):
                continue
            answer = daemon.get("/readyz", timeout=10)
            if answer and answer[0] == 200:
                ready[daemon.name] = time.time() - daemon.started
        if time.monotonic() > deadline:
            missing = [d.name for d in daemons if d.name not in ready]
            raise SystemExit(f"not ready after {timeout:.0f} s: {', '.join(missing[:10])}")
        time.sleep(poll)
    return ready


def log_stamp(line: str) -> float | None:
    """A log line's own timestamp as epoch seconds."""
    match = _STAMP.match(line)
    if not match:
        return None
    moment = datetime.datetime.fromisoformat(match[1]).replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def pass_finished(daemon: Daemon, generation: int) -> float | None:
    """When the daemon logged a successful pass of ``generation`` (epoch seconds), if it has."""
    for line in daemon.log_text().splitlines():
        match = PASS_OK.search(line)
        if match and int(match[1]) == generation:
            return log_stamp(line)
    return None


def wait_pass(daemons: list[Daemon], generation: int, timeout: float,
              poll: float = 0.005) -> dict[str, float]:
    """Epoch second each daemon finished a good pass of ``generation``."""
    done: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(done) < len(daemons):
        for daemon in daemons:
            if daemon.name not in done:
                stamp = pass_finished(daemon, generation)
                if stamp is not None:
                    done[daemon.name] = stamp
                else:
                    daemon.check_alive()
        if time.monotonic() > deadline:
            missing = [d.name for d in daemons if d.name not in done]
            raise SystemExit(f"generation {generation} not converged after {timeout:.0f} s "
                             f"on {', '.join(missing[:10])}")
        if len(done) < len(daemons):
            time.sleep(poll)
    return done


def stop(daemons: list[Daemon], timeout: float) -> dict[str, tuple[int | None, float]]:
    """SIGTERM every daemon at once; (exit code, seconds until it exited) each.

    A daemon still running after ``timeout`` is killed (exit code None).
    """
    sent = time.monotonic()
    for daemon in daemons:
        if daemon.process.poll() is None:
            daemon.process.send_signal(signal.SIGTERM)
    out: dict[str, tuple[int | None, float]] = {}
    while len(out) < len(daemons):
        for daemon in daemons:
            if daemon.name not in out and daemon.process.poll() is not None:
                out[daemon.name] = (daemon.process.returncode, time.monotonic() - sent)
        if time.monotonic() - sent > timeout:
            for daemon in daemons:
                if daemon.name not in out:
                    os.killpg(daemon.pid, signal.SIGKILL)
                    daemon.process.wait()
                    out[daemon.name] = (None, time.monotonic() - sent)
        time.sleep(0.02)
    return out


def teardown_report(daemon: Daemon) -> tuple[float, int] | None:
    """(duration, failures) of the teardown the daemon logged, if it logged one."""
    matches = TEARDOWN.findall(daemon.log_text())
    return (float(matches[-1][0]), int(matches[-1][1])) if matches else None


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the whole process (every thread, living or exited)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_switches(pid: int) -> dict[int, int]:
    """Voluntary + involuntary context switches of each living thread, by thread id."""
    out: dict[int, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
        except FileNotFoundError:
            continue  # the thread exited between listing and reading
        out[int(task.name)] = sum(
            int(line.split()[1]) for line in text.splitlines()
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))
    return out


def switches_between(before: dict[int, int], after: dict[int, int]) -> int:
    """Context switches between two ``thread_switches`` readings.

    Per thread, so a worker thread that exits inside the window does not
    make the sum go backwards (its last switches are lost, a few at most);
    a thread born inside the window counts from zero.
    """
    return sum(count - before.get(tid, 0) for tid, count in after.items())


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def pss_kib(pid: int, *, tree: bool = True) -> int:
    """Proportional set size in KiB, of ``pid`` and (``tree``) its descendants."""
    total = 0
    for member in descendants(pid) if tree else [pid]:
        try:
            text = Path(f"/proc/{member}/smaps_rollup").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        match = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
        total += int(match[1]) if match else 0
    return total


def bare_trio() -> subprocess.Popen:
    """The floor process for idle cost and memory: an interpreter with trio, waiting forever."""
    return subprocess.Popen(
        [sys.executable, "-c", "import trio; trio.run(trio.sleep_forever)"], env=env())


def save_file(path: Path, text: str) -> float:
    """An editor's save (a sibling renamed over ``path``); the epoch second of the rename."""
    tmp = path.with_name(f".{path.name}.swp")
    tmp.write_text(text)
    stamp = time.time()
    os.rename(tmp, path)
    return stamp


def files_left(root: Path) -> int:
    return sum(1 for _ in root.rglob("*")) if root.exists() else 0


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
