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
* ``teardown``: from the ``teardown: stopping daemons`` record to the end
  (the revokes, the reset of the runtime overrides, the discards).

A calibration run (no kill) reports how many writes each phase made; a run
then picks its kill point uniformly among them (seeded), or, for teardown,
at every one of them in turn (``every_step``).  The same seed gives the same
plan; the log of every run is kept beside its root, and the write a run was
killed at is named in it.

The roots the runs start from hold what a node holds: a few files of the
user's (``plant_user_files``) and, for the every-step runs, a file of the
user's at *every* path the daemon replaces (``plant_replaced``: found by a
survey run, each backed up and restored by the daemon) and a link at the
overrides lock, which ``mokka ctl`` replaces (``CTL_EDIT`` runs after the
first pass, so that teardown's reset of the runtime overrides has them to
remove).
"""

from __future__ import annotations

import collections
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

from mokka.layout import MOKKA_STATE_DIR, OVERRIDES
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
#: Modules whose functions only carry out a write another function asks for:
#: a step is named after the function asking (``removal._remove``, not ``fsops.unlink``).
_HELPER_MODULES = ("fsops", "private_files", "reader")
_MOKKA = str(ROOT / "mokka") + os.sep


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
    #: ``mokka ctl`` arguments run once the first pass is done, before that SIGTERM.
    ctl_argv: list[str] | None = None
    #: Where the write a run is killed at is written (the log), before the kill.
    kill_note: str | None = None
    #: Kill at the ``kill_at``-th write of this teardown step (``step_of``), not at a write number.
    target_step: str | None = None
    counts: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys((*PHASES, "idle"), 0))
    #: Every write of teardown, in order: its step (``step_of``) and path under the root.
    steps: list[tuple[str, str]] = attrs.field(factory=list)
    step_counts: dict[str, int] = attrs.field(factory=dict)
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
        path = os.fsdecode(path)
        if not path.startswith("/"):
            path = _beneath_dir_fd(event, path, args, self.root)
        if not path.startswith(self.root):
            return
        self.counts[self.phase] += 1
        rel = path[len(self.root):]
        if self.phase == "teardown":
            step = step_of(event, rel, sys._getframe(1))
            self.steps.append((step, rel))
            seen = self.step_counts[step] = self.step_counts.get(step, 0) + 1
            if step == self.target_step and seen == self.kill_at:
                self._kill(f"teardown step {step!r}, occurrence {seen}: {rel}")
        if self.phase == self.target and self.counts[self.phase] == self.kill_at:
            self._kill(f"{self.phase} write {self.kill_at}: {event} {rel}")

    def _kill(self, where: str) -> None:
        if self.kill_note is not None:
            with open(self.kill_note, "a") as note:
                note.write(f"KILLED at {where}\n")
        os.kill(os.getpid(), signal.SIGKILL)

    def on_record(self, record: logging.LogRecord) -> None:
        if record.msg == "reconcile pass %s":
            self.passes += 1
            if self.phase == "first":
                if self.change_path is None:
                    self.phase = "idle"
                    if self.ctl_argv is not None:
                        from mokka.ctl import command as ctl

                        if ctl.main(self.ctl_argv) != 0:
                            raise AssertionError(f"mokka ctl {self.ctl_argv} failed")
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


def _beneath_dir_fd(event: str, path: str, args: tuple, root: str) -> str:
    """A relative path's absolute one: relative to the directory descriptor the event
    names last (``os.remove(name, dir_fd=...)``).  ``open`` names none: the daemon
    opens a relative name only beneath its root (``mokka.state.reader.open_parent``),
    so it is counted there, by its name alone."""
    dir_fd = args[-1] if event != "open" else None
    if isinstance(dir_fd, int) and not isinstance(dir_fd, bool):
        with contextlib.suppress(OSError):
            return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    return os.path.join(root, "...", path)


def step_of(event: str, rel: str, frame) -> str:
    """Which step of teardown a write is: the event, the Mokka function (and line) that
    asked for it, and what kind of path it is; the same step in every run, whatever
    order the concurrent discards interleave in."""
    site = "?"
    while frame is not None:
        filename = frame.f_code.co_filename
        module = Path(filename).stem
        if filename.startswith(_MOKKA) and module not in _HELPER_MODULES:
            site = f"{module}.{frame.f_code.co_name}:{frame.f_lineno}"
            break
        frame = frame.f_back
    return f"{event} {site} {_path_kind(rel)}"


def _path_kind(rel: str) -> str:
    state = MOKKA_STATE_DIR.lstrip("/")
    if rel.startswith(f"{state}/backups/"):
        return "backup record" if rel.endswith(".mode") else "backup"
    if rel.startswith(f"{state}/manifests/"):
        return "manifest " + rel.rpartition("/")[2].partition(".")[2]
    if rel.startswith(state):
        return "state directory"
    if rel.startswith(".mokka-"):
        return "record of parents"
    if rel.endswith(".mokka-tmp"):
        return "temp file"
    name = rel.rpartition("/")[2]
    if name.startswith(OVERRIDES.rpartition("/")[2]):
        return name
    return "node path"


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
                ctl_argv=request.get("ctl_argv"),
                target_step=request.get("target_step"),
                kill_note=request["log"],
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
            Path(request["report"]).write_text(
                json.dumps({"counts": injector.counts, "steps": injector.steps})
            )
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
        result.update(json.loads(Path(report).read_text()))
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


def is_bookkeeping(path: str) -> bool:
    """Mokka's own records (the state directory, the record of its parents)."""
    state = MOKKA_STATE_DIR.lstrip("/")
    return path.startswith((".mokka-", state + "/")) or path == state


def touched_paths(server: Zygote, work: Path) -> dict[str, str]:
    """Every path a ``--once`` pass creates under a root with the usual user files (→ type)."""
    root = work / "node"
    before = planted_root(root)
    once, log = server.daemon(root, work, "--once")
    assert once.get("code") == 0, log.read_text(errors="replace")[-4000:]
    after = snapshot(root)
    touched = {path: after[path][0] for path in sorted(set(after) - set(before))}
    assert server.cleanup(root, log) == 0, log.read_text(errors="replace")[-4000:]
    assert snapshot(root) == before
    return touched


#: The lock of the runtime overrides, which ``mokka ctl`` replaces: a link of
#: the user's stands there in the every-step runs (the file itself must be a
#: regular file for ``mokka ctl`` to edit, and a daemon start resets it).
OVERRIDES_LOCK = OVERRIDES.lstrip("/") + ".lock"


#: Where the driver tree is published: on a node it is the driver container's,
#: and the daemon refuses to replace anything there (``docs/gpudriver.md``),
#: so a file of the user's there would only keep teardown's withdrawal from running.
PUBLISHED_DRIVER = "run/nvidia/driver"


def ctl_edit(root: Path) -> list[str]:
    """A ``mokka ctl`` change under ``root``: it records and writes the overrides file and lock."""
    return ["--root", str(root), "temp", "--gpu", "0", "--celsius", "70"]


def plant_replaced(root: Path, touched: dict[str, str]) -> dict[str, tuple]:
    """``planted_root`` plus a file of the user's at every path the daemon replaces.

    Every file, link and device node a pass writes (``touched_paths``) is
    there before the daemon comes, as on a node set up by hand or by an
    earlier installer (the CDI specs, the driver tree, the NFD feature
    file...), so every one is backed up, replaced, and restored at
    teardown; the overrides lock is a link of the user's.  Its snapshot.
    """
    planted_root(root)
    for path, kind in touched.items():
        if kind == "dir" or is_bookkeeping(path) or path == PUBLISHED_DRIVER:
            continue
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(f"the user's own /{path}\n")
    (root / OVERRIDES_LOCK).parent.mkdir(parents=True, exist_ok=True)
    (root / OVERRIDES_LOCK).symlink_to("the-users-lock")
    return snapshot(root)


@attrs.frozen
class KillRun:
    """One planned kill: which phase, at which write of it (or occurrence of ``step``)."""

    phase: str
    kill_at: int
    #: A teardown step (``step_of``): ``kill_at`` counts its occurrences only.
    step: str | None = None


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
    return _cleaned(server, root, before, run, result, log)


def kill_step_and_clean(
    server: Zygote, work: Path, run: KillRun, touched: dict[str, str]
) -> KillOutcome:
    """One every-step run: every replaced path planted, a ``mokka ctl`` change after the
    first pass, SIGTERM, killed at ``run``'s teardown step; then cleanup, compared."""
    root = work / "node"
    before = plant_replaced(root, touched)
    result, log = server.daemon(
        root, work, stop_after_first=True, ctl_argv=ctl_edit(root),
        target_step=run.step, kill_at=run.kill_at,
    )
    return _cleaned(server, root, before, run, result, log)


def _cleaned(
    server: Zygote, root: Path, before: dict[str, tuple], run: KillRun, result: dict, log: Path
) -> KillOutcome:
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


def teardown_steps(server: Zygote, work: Path, touched: dict[str, str]) -> list[tuple[str, str]]:
    """Every write of an every-step run's teardown, in order (step, path), nothing killed."""
    root = work / "node"
    before = plant_replaced(root, touched)
    result, log = server.daemon(
        root, work, stop_after_first=True, ctl_argv=ctl_edit(root),
        report=str(work / "counts.json"),
    )
    text = log.read_text()
    assert result.get("code") == 0, f"calibration daemon: {result}\n{text[-4000:]}"
    assert snapshot(root) == before, "the calibration daemon did not leave the root as found"
    return [tuple(step) for step in result["steps"]]


def plan_every_step(steps: list[tuple[str, str]]) -> list[KillRun]:
    """A kill at the first and at the last occurrence of every teardown step.

    A step repeats once per path (the restore of each replaced file): its
    first occurrence is a kill with all of that work still to do, its last
    one with all of it done but the step's own last write.
    """
    counts = collections.Counter(step for step, _path in steps)
    return [
        KillRun("teardown", at, step)
        for step in sorted(counts)
        for at in sorted({1, counts[step]})
    ]


if __name__ == "__main__":
    zygote_main()
