"""Faults the daemon must survive, on real daemon processes: kills, hostile roots, sick filesystems.

* SIGKILL at seeded random writes of the first pass, of a change pass and of
  teardown, each followed by ``mokka cleanup`` and a byte-for-byte comparison
  with the root as it was (user files planted first, some at paths the
  daemon overwrites, one setuid binary of another user);
* SIGKILL at every step of teardown (the reset of the runtime overrides
  included), on a root with a file of the user's at every path the daemon
  replaces: each one backed up, and each kill landing somewhere between a
  backup and the end of its restore;
* a hostile root: a symlink planted at every path the daemon touches,
  pointing out of the root into sentinel directories that must stay as they
  were (absolute links, which the host re-roots, and relative ones climbing
  out, which it refuses);
* a full disk (a small tmpfs), a read-only root (a read-only bind mount), a
  root the daemon's user may not enter (mode 000, run as ``nobody``): one
  clear line per fault, never a traceback, and the node left as it was.

``tests.fault_support`` explains the kill machinery; ``bench/soak_kill.py``
runs many more kills than CI does here.  Mounting and changing users need
root: without it these tests fail saying so.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fault_support import (
    OVERRIDES_LOCK,
    PHASES,
    PUBLISHED_DRIVER,
    KillOutcome,
    Zygote,
    calibrate,
    is_bookkeeping,
    kill_and_clean,
    kill_step_and_clean,
    plan_every_step,
    plan_kills,
    planted_root,
    teardown_steps,
    touched_paths,
    zygote,
)
from tests.support import ROOT, require_tool, snapshot

#: The seed of the kill plan (set ``MOKKA_KILL_SEED`` to replay another plan).
SEED = int(os.environ.get("MOKKA_KILL_SEED", "20261201"))
#: Kills per CI run, spread over the three phases.
KILL_RUNS = 51
#: A tmpfs that holds the planted files and some, not all, of a one-GPU node.
FULL_DISK_SIZE = "200k"


@pytest.fixture(scope="module")
def server() -> Iterator[Zygote]:
    if os.geteuid() != 0:
        pytest.fail("the fault-injection tests mount filesystems and change users: run as root")
    with zygote() as server:
        yield server


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def _describe(bad: list[KillOutcome]) -> str:
    return f"seed {SEED} (replay with MOKKA_KILL_SEED={SEED}):\n" + "\n\n".join(
        f"killed in {o.run.phase} at {o.run.step or 'write'} {o.run.kill_at} (killed={o.killed}): "
        f"cleanup exit {o.cleanup_code}, root restored: {o.restored}; log {o.log}:\n{_tail(o.log)}"
        for o in bad
    )


# ---- SIGKILL anywhere ------------------------------------------------------------


def test_a_kill_at_any_write_is_undone_by_cleanup_byte_for_byte(server: Zygote, tmp_path: Path):
    counts = calibrate(server, tmp_path / "calibration")
    assert all(counts[phase] > 10 for phase in PHASES), counts
    outcomes = [
        kill_and_clean(server, tmp_path / f"run{i:02}", run)
        for i, run in enumerate(plan_kills(SEED, counts, KILL_RUNS))
    ]
    bad = [o for o in outcomes if o.cleanup_code != 0 or not o.restored]
    assert bad == [], _describe(bad)
    # A phase may write a little less in one run than in the calibration
    # (threads interleave), so the last write of a phase is not always met.
    missed = [o for o in outcomes if not o.killed]
    assert len(missed) <= KILL_RUNS // 10, _describe(missed)


def test_a_kill_at_every_step_of_teardown_loses_no_file_of_the_users(
    server: Zygote, tmp_path: Path
):
    """Every path the daemon replaces holds a file of the user's (and the
    overrides lock a link), so teardown restores each from its backup; a kill
    at the first and at the last occurrence of each of its steps (``step_of``:
    the restore's writes, the journal's, the backups' removal, the reset of
    the runtime overrides, the state directory's removal), then ``mokka
    cleanup``: the root is byte for byte as it was, and cleanup says so."""
    touched = touched_paths(server, tmp_path / "survey")
    replaced = [p for p, kind in touched.items() if kind != "dir" and not is_bookkeeping(p)]
    assert len(replaced) > 40, touched
    steps = teardown_steps(server, tmp_path / "calibration", touched)
    restored = {path for step, path in steps if step.startswith("open backups.restore")}
    # Every replaced file was backed up and came back, but for the node's own
    # kernel log (used as it is) and the driver's mount point (not planted).
    assert set(replaced) - restored == {"dev/kmsg", PUBLISHED_DRIVER}, restored
    plan = plan_every_step(steps)
    reset = [run for run in plan if "overrides." in run.step]
    assert {run.step.split()[-1] for run in reset} >= {"overrides.yaml", "overrides.yaml.lock"}
    assert len(plan) < 80, plan  # each run is a whole daemon life: keep the test short
    outcomes = [
        kill_step_and_clean(server, tmp_path / f"step{i:02}", run, touched)
        for i, run in enumerate(plan)
    ]
    bad = [o for o in outcomes if not o.killed or o.cleanup_code != 0 or not o.restored]
    assert bad == [], _describe(bad)
    assert (tmp_path / "step00/node" / OVERRIDES_LOCK).is_symlink()


# ---- hostile roots -----------------------------------------------------------------


def _once_and_cleanup(server: Zygote, root: Path, work: Path) -> tuple[int, int, Path]:
    once, log = server.daemon(root, work, "--once")
    return once.get("code", -1), server.cleanup(root, log), log


def _stop_after_first_pass(server: Zygote, root: Path, work: Path) -> tuple[int, str]:
    result, log = server.daemon(root, work, stop_after_first=True)
    return result.get("code", -1), log.read_text(errors="replace")


@pytest.mark.parametrize("links", ["absolute", "relative"])
def test_symlinks_planted_at_every_path_reach_nothing_outside_the_root(
    server: Zygote, tmp_path: Path, links: str
):
    """One run per depth: every path of that depth the daemon touches is a
    symlink to a sentinel directory outside the root (the directories above
    them real ones).  Absolute links are re-rooted (they name paths inside
    the root), relative ones that climb out are refused; either way the
    sentinels stay as they were and ``mokka cleanup`` restores the root."""
    touched = touched_paths(server, tmp_path / "survey")
    depth = {path: path.count("/") + 1 for path in touched}
    assert len(touched) > 50, touched
    failures: list[str] = []
    for level in range(1, max(depth.values()) + 1):
        work = tmp_path / f"depth{level:02}"
        root = work / "node"
        sentinel = work / "sentinel"
        planted_root(root)
        for path in touched:
            if depth[path] == level and (root / path).parent.is_dir():
                flat = path.replace("/", "__")
                (sentinel / flat).mkdir(parents=True)
                (sentinel / flat / "keep").write_text(f"sentinel for {path}\n")
                if links == "absolute":
                    target = str(sentinel / flat)
                else:
                    target = "../" * level + f"sentinel/{flat}"
                (root / path).symlink_to(target)
            elif depth[path] < level and touched[path] == "dir" and not is_bookkeeping(path):
                # Above the links: real directories, as a node would have them.
                (root / path).mkdir(parents=True, exist_ok=True)
        planted_bookkeeping = any(
            is_bookkeeping(path) and (root / path).is_symlink() for path in touched
        )
        before, guarded = snapshot(root), snapshot(sentinel)
        _, cleanup, log = _once_and_cleanup(server, root, work)
        text = log.read_text(errors="replace")
        problems = []
        if snapshot(sentinel) != guarded:
            problems.append("a sentinel outside the root changed")
        if snapshot(root) != before:
            problems.append("the root is not as it was")
        refused = re.search(r"Mokka bookkeeping is not|climbs above the node root", text)
        if planted_bookkeeping:
            # A link where Mokka keeps its own records: followed inside the
            # root (absolute), or refused loudly.
            if cleanup != 0 and not (cleanup == 1 and refused):
                problems.append(f"cleanup exited {cleanup} without saying what it refused")
        elif cleanup != 0:
            problems.append(f"cleanup exited {cleanup}")
        if "Traceback" in text:
            problems.append("a traceback was logged")
        if problems:
            failures.append(f"depth {level}: {'; '.join(problems)}; log {log}:\n{_tail(log)}")
    assert failures == [], "\n\n".join(failures)


def test_symlinked_var_run_and_state_directory_are_torn_down(server: Zygote, tmp_path: Path):
    """``var/run -> /run`` (as on every host) and the state directory on
    another disk (``var/lib/mokka -> /data/mokka``): what the daemon created
    at the link targets goes at teardown."""
    root = tmp_path / "node"
    (root / "run").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "var/lib").mkdir(parents=True)
    (root / "var/run").symlink_to("/run")
    (root / "var/lib/mokka").symlink_to("/data/mokka")
    plant_user_files_beside = root / "etc"
    plant_user_files_beside.mkdir()
    (root / "etc/hostname").write_text("test-node\n")
    before = snapshot(root)
    code, text = _stop_after_first_pass(server, root, tmp_path)
    assert code == 0, text
    assert "reconcile pass ok generation=1" in text, text
    assert "Traceback" not in text, text
    assert snapshot(root) == before


# ---- sick filesystems ---------------------------------------------------------------


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.fail(f"mount {' '.join(args)} failed (the tests need root): {done.stderr.strip()}")


@contextlib.contextmanager
def _mounted(*args: str, at: Path) -> Iterator[None]:
    require_tool("mount")
    _mount(*args, str(at))
    try:
        yield
    finally:
        subprocess.run(["umount", "--lazy", str(at)], capture_output=True, timeout=30)


@contextlib.contextmanager
def _planted_full_disk(root: Path) -> Iterator[dict[str, tuple]]:
    """``root`` a tmpfs of ``FULL_DISK_SIZE`` with the user files planted, while the block runs.

    Yields the planted snapshot; compare with it inside the block, before the tmpfs goes.
    """
    root.mkdir()
    with _mounted("-t", "tmpfs", "-o", f"size={FULL_DISK_SIZE},mode=755", "tmpfs", at=root):
        yield planted_root(root)


def test_a_full_disk_is_one_line_per_fault_and_teardown_removes_what_was_written(
    server: Zygote, tmp_path: Path
):
    root = tmp_path / "node"
    with _planted_full_disk(root) as before:
        code, log = _stop_after_first_pass(server, root, tmp_path)
        after = snapshot(root)
    assert "reconcile pass stage-failed generation=1" in log, log
    assert re.search(r"stage of \S+ failed: \S+: .*No space left on device \(ENOSPC\)", log), log
    # every failure names a file, and its owner once (tests/test_full_disk_lines.py)
    assert ": ?: " not in log, log
    assert not re.search(r"\b([\w-]+): \1: ", log), log
    assert "Traceback" not in log, log
    assert "failed unexpectedly" not in log, log
    assert code == 0, log
    assert re.search(r"teardown finished .*failures=0", log), log
    assert after == before


def test_a_read_only_root_is_one_line_per_fault_and_tears_down_with_exit_0(
    server: Zygote, tmp_path: Path
):
    root = tmp_path / "node"
    before = planted_root(root)
    with _mounted("--bind", str(root), at=root):
        _mount("-o", "remount,bind,ro", str(root))
        code, log = _stop_after_first_pass(server, root, tmp_path / "daemon")
        once, cleanup, cleanup_log = _once_and_cleanup(server, root, tmp_path / "once")
    assert "reconcile pass stage-failed generation=1" in log, log
    assert re.search(r"stage of \S+ failed: \S+: .*Read-only file system \(EROFS\)", log), log
    assert "Traceback" not in log, log
    assert code == 0, log
    assert re.search(r"teardown finished .*failures=0", log), log
    assert (once, cleanup) == (1, 0), _tail(cleanup_log)
    assert "Traceback" not in cleanup_log.read_text()
    assert snapshot(root) == before


def test_a_root_the_user_may_not_enter_is_one_line_and_exit_1(tmp_path: Path):
    """Mode 000, the daemon run as ``nobody``: it says so in one line, at start."""
    setpriv = require_tool("setpriv")
    # tmp_path's parents are root's 0700: the test root goes where nobody may look.
    base = Path(tempfile.mkdtemp(prefix="mokka-closed-"))
    try:
        os.chmod(base, 0o755)
        root = base / "node"
        root.mkdir(mode=0o000)
        os.chmod(root, 0o000)
        as_nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
        command = [
            *as_nobody, sys.executable, "-m", "mokka", "daemon", "--root", str(root),
            "--profile", "t4", "--node-name", "test-node", "--health-addr", "127.0.0.1:0",
        ]
        daemon = subprocess.run(
            command, capture_output=True, text=True, timeout=120, env=env, cwd="/", check=False
        )
        cleanup = subprocess.run(
            [*as_nobody, sys.executable, "-m", "mokka", "cleanup", "--root", str(root)],
            capture_output=True, text=True, timeout=120, env=env, cwd="/", check=False,
        )
        assert os.listdir(root) == []
    finally:
        os.chmod(base / "node", 0o755)
        shutil.rmtree(base)
    output = daemon.stdout + daemon.stderr
    assert daemon.returncode == 1, output
    assert "Traceback" not in output, output
    assert re.search(
        rf"ERROR .*cannot open the node root {re.escape(str(root))}: Permission denied \(EACCES\)",
        output,
    ), output
    cleanup_output = cleanup.stdout + cleanup.stderr
    assert "Traceback" not in cleanup_output, cleanup_output
    assert cleanup.returncode == 1, cleanup_output
    assert "Permission denied" in cleanup_output, cleanup_output


def test_sigkill_leaves_nothing_cleanup_cannot_remove_even_on_a_full_disk(
    server: Zygote, tmp_path: Path
):
    """A kill in the first pass on a full disk: ``mokka cleanup`` still restores the root."""
    root = tmp_path / "node"
    with _planted_full_disk(root) as before:
        result, log = server.daemon(root, tmp_path, target="first", kill_at=60)
        cleanup = server.cleanup(root, log)
        after = snapshot(root)
    assert result.get("signal") == signal.SIGKILL, _tail(log)
    assert cleanup == 0, _tail(log)
    assert after == before
