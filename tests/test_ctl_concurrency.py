"""``mokka ctl`` calls at once under a node root, and the daemon's reset beside them.

Under a root every call converges two ``Host`` owners (the overrides
file's lock, then the file: ``mokka.ctl.command.change``), and the lock's converge
cannot run under the lock it makes.  Calls at once used to converge it
together: one compacted the owner's manifest while another's temp snapshot
was renamed away, and a call failed with exit 1, its change lost.  Each now
takes its turn on the config directory (``overrides.records_locked``), as
does the daemon's reset of the file at start.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mokka.ctl import command as ctl
from mokka.daemon.command import _reset_overrides
from mokka.layout import CONFIG_DIR, OVERRIDES
from mokka.noderoot.host import File, Host
from mokka.state import overrides
from mokka.state.overrides import MANIFEST_OWNERS, load_overrides
from tests.daemon_support import PROCESS_TIMEOUT, daemon_env
from tests.support import snapshot

#: One writer process: three Xids on its GPU through ``mokka ctl --root``.
WRITER = """
import sys
from mokka import cli
root, gpu = sys.argv[1], sys.argv[2]
for code in (31, 43, 79):
    assert cli.main(["ctl", "xid", "--root", root, "--gpu", gpu, "--code", str(code)]) == 0
"""


@pytest.fixture
def staged(node_root: Path) -> Host:
    """A root as a simulator leaves it: the config directory, recorded by its owner."""
    host = Host(node_root)
    host.converge("gpudriver-config", [File(CONFIG_DIR + "/config.yaml", b"format: 1\n")])
    return host


def test_writers_at_once_lose_no_update_and_leave_no_record_behind(staged: Host) -> None:
    root = staged.root
    before = snapshot(root)
    # Rounds from no records at all: the first calls of each converge the
    # lock's owner together, which is where they used to collide.
    for _ in range(3):
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(gpu)],
                                  env=daemon_env(), stderr=subprocess.PIPE, text=True)
                 for gpu in range(8)]
        results = [(p.wait(timeout=PROCESS_TIMEOUT), p.stderr.read()) for p in procs]
        for proc in procs:
            proc.stderr.close()
        assert [code for code, _ in results] == [0] * 8, [err for _, err in results]
        found = load_overrides(root / OVERRIDES.lstrip("/"))
        assert found is not None
        devices = found.to_mapping()["devices"]
        assert {gpu: [x["code"] for x in devices[str(gpu)]["xids"]] for gpu in range(8)} == {
            gpu: [31, 43, 79] for gpu in range(8)}
        for owner in MANIFEST_OWNERS:
            assert staged.owned(owner)
        # what the daemon does at start: the file, its lock and their records go
        _reset_overrides(root / OVERRIDES.lstrip("/"), staged)
        assert snapshot(root) == before
    staged.discard("gpudriver-config")
    assert os.listdir(root) == []


def _waiting_on(directory: Path) -> bool:
    """Whether ``/proc/locks`` shows a process waiting for a ``flock`` on ``directory``."""
    st = os.stat(directory)
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        # a waiter's line: ``N: -> FLOCK ADVISORY WRITE PID DEV START END``
        if "->" in fields and fields[fields.index("->") + 1] == "FLOCK" and wanted in fields:
            return True
    return False


def test_a_call_takes_its_turn_before_it_records_anything(staged: Host) -> None:
    root = staged.root
    path = root / OVERRIDES.lstrip("/")
    before = snapshot(root)
    with overrides.records_locked(path, root=root) as held:
        assert held
        proc = subprocess.Popen(
            [sys.executable, "-m", "mokka", "ctl", "temp", "--root", str(root), "--gpu", "0",
             "--celsius", "71"], env=daemon_env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + PROCESS_TIMEOUT
            while not _waiting_on(path.parent):
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "mokka ctl never waited for its turn"
                time.sleep(0.01)
            # waiting: neither the lock file nor any record of it exists yet
            assert snapshot(root) == before
        except BaseException:
            proc.kill()
            raise
    output, _ = proc.communicate(timeout=PROCESS_TIMEOUT)
    assert proc.returncode == 0, output
    found = load_overrides(path)
    assert found is not None
    assert found.to_mapping()["devices"]["0"] == {"thermal": {"temperature_gpu_c": 71}}
    for owner in MANIFEST_OWNERS:
        staged.discard(owner)
    assert snapshot(root) == before


def test_the_daemons_reset_does_not_wait_for_a_turn_held_for_good(
    staged: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = staged.root
    path = root / OVERRIDES.lstrip("/")
    before = snapshot(root)
    assert ctl.main(["--root", str(root), "temp", "--gpu", "0", "--celsius", "70"]) == 0
    monkeypatch.setattr(overrides, "RESET_LOCK_TIMEOUT", 0.05)
    with overrides.records_locked(path, root=root), caplog.at_level(logging.WARNING):
        # another process's turn, never given back: the reset goes on after the timeout
        _reset_overrides(path, staged)
    assert f"{path.parent}: still locked after 0.05s" in caplog.text
    assert snapshot(root) == before
