"""Fault injection for real daemon processes: SIGKILL at a chosen write, hostile roots, full disks.

A kill at a random *time* mostly lands in Python's start-up, and a run per
fresh interpreter costs seconds; so the daemons are forked from a *zygote*,
one process that imported Mokka once (``python -m tests.fault_support``).
Each daemon is a real process running the real ``mokka daemon`` code (the
same ``mokka.cli.main``), in a process group of its own, and the zygote is
its subreaper: whatever the daemon started dies and is reaped with it, as in
a pod that is killed.

Where the daemon dies is chosen by *write number*, not by time: an audit hook
in the forked daemon counts every write-like call under the node root
(``open`` for writing, ``mkdir``, ``rename``, ``unlink``, ``rmdir``,
``symlink``, ``chmod``...) per phase of its life, and sends itself SIGKILL at
the chosen one.  The phases are read from the daemon's own log records:

* ``first``: from start-up to the first ``reconcile pass`` record;
* ``change``: the daemon rewrites its profile file (the input an operator
  would change) and this phase runs to the next ``reconcile pass`` record,
  after which the daemon sends itself SIGTERM (without a change, asked
  for, it does so after the first pass);
* ``teardown``: from the ``teardown: stopping daemons`` record to the end.

A calibration run (no kill) reports how many writes each phase made; a run
then picks its kill point uniformly among them (seeded).  The same seed gives
the same plan; the log of every run is kept beside its root.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import random
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs

from tests.support import ROOT, snapshot

#: The phases a kill can be aimed at, in the order a daemon lives them.
PHASES = ("first", "change", "teardown")
#: Bound on one request to the zygote (a whole daemon life plus cleanup).
REQUEST_TIMEOUT = 120
#: Audit events that change the filesystem, and the argument naming the path.
_WRITE_EVENTS = {
    "os.mkdir": 0,
    "os.rename": 0,
    "os.remove": 0,
    "os.rmdir": 0,
    "os.symlink": 1,
    "os.link": 1,
    "os.chmod": 0,
    "os.chown": 0,
    "os.truncate": 0,
    "os.utime": 0,
    "os.mknod": 0,
    "os.mkfifo": 0,
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


# --------------------------------------------------------------------------
# Inside the forked daemon
# --------------------------------------------------------------------------


@attrs.define
class _Injector:
    """Counts the daemon's writes under the root per phase; kills it at the chosen one."""

    root: str
    target: str | None
    kill_at: int
    change_path: str | None
    change_text: str | None
    #: Without a change: SIGTERM after the first pass (a ``--once`` run: never).
    stop_after_first: bool = False
    counts: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys((*PHASES, "idle"), 0))
    phase: str = "first"
    passes: int = 0

    def audit(self, event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if not writing:
                return
        elif event in _WRITE_EVENTS:
            path = args[_WRITE_EVENTS[event]]
        else:
            return
        if not isinstance(path, (str, bytes, os.PathLike)):
            return  # a descriptor: its open was counted
        if not os.fsdecode(path).startswith(self.root):
            return
        self.counts[self.phase] += 1
        if self.phase == self.target and self.counts[self.phase] == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_record(self, record: logging.LogRecord) -> None:
        if record.msg == "reconcile pass %s":
            self.passes += 1
            if self.phase == "first":
                if self.change_path is None:
                    self.phase = "idle"
                    if self.stop_after_first:
                        os.kill(os.getpid(), signal.SIGTERM)
                    return
                # What an operator does: a new profile, written whole and renamed.
                tmp = self.change_path + ".new"
                Path(tmp).write_text(self.change_text or "")
                os.replace(tmp, self.change_path)
                self.phase = "change"
            elif self.phase == "change":
                self.phase = "idle"
                os.kill(os.getpid(), signal.SIGTERM)
        elif isinstance(record.msg, str) and record.msg.startswith("teardown: stopping daemons"):
            self.phase = "teardown"


def _run_child(request: dict) -> None:
    """The forked daemon (or cleanup): never returns."""
    code = 70
    try:
        os.setpgid(0, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        injector = None
        if request.get("root"):
            injector = _Injector(
                root=str(Path(request["root"]).absolute()) + "/",
                target=request.get("target"),
                kill_at=int(request.get("kill_at", 0)),
                change_path=request.get("change_path"),
                change_text=request.get("change_text"),
                stop_after_first=bool(request.get("stop_after_first")),
            )
            factory = logging.getLogRecordFactory()

            def record_factory(*args, **kwargs):
                record = factory(*args, **kwargs)
                injector.on_record(record)
                return record

            logging.setLogRecordFactory(record_factory)
            sys.addaudithook(injector.audit)
        from mokka.cli import main

        code = main(request["argv"])
        if injector is not None and request.get("report"):
            Path(request["report"]).write_text(json.dumps(injector.counts))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _children() -> list[int]:
    """Live children of this process (the subreaper inherits the daemon's orphans)."""
    me = str(os.getpid())
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat_line = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # ``pid (comm) state ppid ...``; comm may hold spaces and parentheses.
        if stat_line.rsplit(")", 1)[1].split()[1] == me:
            found.append(int(entry.name))
    return found


def _serve_one(request: dict) -> dict:
    pid = os.fork()
    if pid == 0:
        _run_child(request)
    _, status = os.waitpid(pid, 0)
    # Everything the daemon started dies with it, and is reaped here.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    while True:
        for child in _children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    result: dict = {"pid": pid}
    if os.WIFSIGNALED(status):
        result["signal"] = os.WTERMSIG(status)
    else:
        result["code"] = os.WEXITSTATUS(status)
    report = request.get("report")
    if report and os.path.exists(report):
        result["counts"] = json.loads(Path(report).read_text())
    return result


def zygote_main() -> None:
    """Import once, then fork one daemon (or cleanup) per request line on stdin."""
    import mokka.cli
    import mokka.daemon.command
    import mokka.state.sources  # noqa: F401  (imported lazily by the daemon)
    from mokka.simulators.registry import load_plugins

    load_plugins()
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_child_subreaper = 36
    libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0)
    out = sys.stdout
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        result = _serve_one(json.loads(line))
        out.write(json.dumps(result) + "\n")
        out.flush()


# --------------------------------------------------------------------------
# The test side
# --------------------------------------------------------------------------


class Zygote:
    """The forking server, driven line by line, every wait bounded."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env.pop("MOKKA_ROOT", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.fault_support"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=env,
            text=True,
        )
        self._read(REQUEST_TIMEOUT)

    def _read(self, timeout: float) -> dict:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise AssertionError(f"the fault-injection zygote did not answer in {timeout}s")
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError("the fault-injection zygote exited")
        return json.loads(line)

    def request(self, **request: object) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._read(REQUEST_TIMEOUT)

    def daemon(
        self, root: Path, work: Path, *extra: str, change: bool = False, **request: object
    ) -> tuple[dict, Path]:
        """``mokka daemon`` on ``root`` from a T4 profile in ``work/input``; the answer and its log.

        ``change``: the daemon rewrites its profile to an L40S one after the
        first pass (the ``change`` phase).  ``request`` carries the rest of
        what a run is asked (``target``/``kill_at``, ``stop_after_first``,
        ``report``); the log is ``work/daemon.log``, kept beside the root.
        """
        profile, changed = profile_files(work / "input")
        log = work / "daemon.log"
        if change:
            request.update(change_path=str(profile), change_text=changed)
        result = self.request(
            argv=daemon_argv(root, profile, *extra), root=str(root), log=str(log), **request
        )
        return result, log

    def cleanup(self, root: Path, log: Path) -> int:
        """``mokka cleanup --root root`` (appending to ``log``); its exit code, -1 if none came."""
        return self.request(argv=["cleanup", "--root", str(root)], log=str(log)).get("code", -1)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.process.stdin:
                self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process.stdout:
            self.process.stdout.close()


@contextlib.contextmanager
def zygote() -> Iterator[Zygote]:
    server = Zygote()
    try:
        yield server
    finally:
        server.close()


def plant_user_files(root: Path) -> None:
    """What a real node root holds before the daemon comes, and must hold after.

    Among them, files at paths the daemon writes itself (so the kills also
    land between a backup and its restore) and a setuid binary of another user.
    """
    (root / "etc").mkdir()
    (root / "etc/hostname").write_text("test-node\n")
    (root / "usr/bin").mkdir(parents=True)
    tool = root / "usr/bin/tool"
    tool.write_text("#!/bin/sh\n")
    os.chown(tool, 65534, 65534)
    os.chmod(tool, 0o4755)
    cdi = root / "var/run/cdi"
    cdi.mkdir(parents=True)
    (cdi / "other-vendor.yaml").write_text("cdiVersion: 0.6.0\nkind: other.com/dev\n")
    smi = root / "usr/bin/nvidia-smi"
    smi.write_text("#!/bin/sh\necho the node's own nvidia-smi\n")
    os.chmod(smi, 0o755)


def planted_root(root: Path) -> dict[str, tuple]:
    """``root`` (made if missing) with the user files planted; its snapshot, what runs leave."""
    root.mkdir(parents=True, exist_ok=True)
    plant_user_files(root)
    return snapshot(root)


@attrs.frozen
class KillRun:
    """One planned kill: which phase, at which write of it."""

    phase: str
    kill_at: int


def plan_kills(seed: int, counts: dict[str, int], runs: int) -> list[KillRun]:
    """``runs`` kill points, the phases in turn, each write of a phase equally likely."""
    rng = random.Random(seed)
    phases = [p for p in PHASES if counts.get(p, 0) > 0]
    return [
        KillRun(phase, rng.randint(1, counts[phase]))
        for phase in (phases[i % len(phases)] for i in range(runs))
    ]


def daemon_argv(root: Path, profile: Path, *extra: str) -> list[str]:
    return [
        "daemon", "--root", str(root), "--profile", str(profile),
        "--node-name", "test-node", "--health-addr", "127.0.0.1:0", *extra,
    ]


def profile_files(directory: Path) -> tuple[Path, str]:
    """A profile file to start from (one T4) and the text an operator changes it to (L40S)."""
    profiles = ROOT / "mokka/state/profiles"
    directory.mkdir(parents=True, exist_ok=True)
    profile = directory / "profile.yaml"
    profile.write_text((profiles / "t4.yaml").read_text())
    return profile, (profiles / "l40s.yaml").read_text()


@attrs.frozen
class KillOutcome:
    """What one kill run and the cleanup after it did, for the report and the assertions."""

    run: KillRun
    killed: bool
    cleanup_code: int
    restored: bool
    log: Path


def kill_and_clean(server: Zygote, work: Path, run: KillRun) -> KillOutcome:
    """One run: plant, daemon killed at ``run``, ``mokka cleanup``, compare byte for byte."""
    root = work / "node"
    before = planted_root(root)
    result, log = server.daemon(root, work, change=True, target=run.phase, kill_at=run.kill_at)
    cleanup_code = server.cleanup(root, log)
    return KillOutcome(
        run=run,
        killed=result.get("signal") == signal.SIGKILL,
        cleanup_code=cleanup_code,
        restored=snapshot(root) == before,
        log=log,
    )


def calibrate(server: Zygote, work: Path) -> dict[str, int]:
    """Writes per phase of a whole life (first pass, change pass, teardown), nothing killed."""
    root = work / "node"
    before = planted_root(root)
    result, log = server.daemon(root, work, change=True, report=str(work / "counts.json"))
    text = log.read_text()
    assert result.get("code") == 0, f"calibration daemon: {result}\n{text[-4000:]}"
    assert snapshot(root) == before, "the calibration daemon did not leave the root as found"
    return result["counts"]


if __name__ == "__main__":
    zygote_main()
