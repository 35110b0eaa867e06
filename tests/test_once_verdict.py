"""``mokka daemon --once`` as a CI gate: its exit status is ``/readyz``'s verdict.

A pass that staged everything but left the node unusable (run without
CAP_MKNOD: device nodes are placeholder files, the CDI specs are not
published) exits 3 and lists the reasons as ``/readyz`` does, once each and
short; a ready node exits 0; ``--log-format json`` prints the summary as one
JSON object.  A root ``--once`` made is gone after ``mokka cleanup`` (or at
once, when there was no state to stage); an unwritable root is one line at
start; the cri simulator names the paths under the node root it looked at
for containerd.

The CAP_MKNOD case runs the real command under ``setpriv --bounding-set
-mknod`` (root without that one capability), the ready one as root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mokka.daemon.oncesummary import EXIT_NOT_READY
from mokka.noderoot.host import Host
from mokka.noderoot.rootmarker import MARK, mark_made, remove_if_emptied
from mokka.simulators.cri.runtime import CONTAINERD_PATHS, RuntimeSetup
from mokka.simulators.cri.settings import CriSettings
from tests.daemon_support import PROCESS_TIMEOUT, daemon_env
from tests.support import require_tool, snapshot

pytestmark = pytest.mark.timeout(240)

ONCE = ("daemon", "--once", "--profile", "t4", "--node-name", "once-node")


def mokka(*argv: str, prefix: tuple[str, ...] = (), cwd: Path | None = None,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "mokka", *argv],
                          env=env or daemon_env(), cwd=cwd, capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT, check=False)


def test_a_node_without_cap_mknod_fails_the_gate_and_a_ready_one_passes(tmp_path: Path):
    assert os.geteuid() == 0, "needs root: the ready half makes real device nodes"
    without_mknod = (require_tool("setpriv"), "--bounding-set", "-mknod")
    before = snapshot(tmp_path)
    root = tmp_path / "node"  # made by --once: cleanup removes it too

    done = mokka(*ONCE, "--root", str(root), prefix=without_mknod, cwd=tmp_path)
    assert done.returncode == EXIT_NOT_READY == 3, done.stdout + done.stderr
    summary = done.stdout[done.stdout.index("generation 1: ok"):].splitlines()
    assert summary[1] == "node not ready:"
    # as /readyz lists it: one line for the simulator, the devices said once
    assert summary[2].startswith(
        "  cri: CDI specs not published: 4 device nodes they name are placeholders "
        "(nvidiactl, nvidia-uvm and 2 more): no CAP_MKNOD (run as root to get real nodes); ")
    assert len(summary) == 4
    assert summary[-1].startswith(f"node root: {root} (remove with: mokka cleanup --root ")

    # the same root, now with CAP_MKNOD: real nodes, published specs, ready
    done = mokka(*ONCE, "--root", str(root), "--log-format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]  # every line is JSON
    verdict = lines[-1]
    assert verdict["ready"] is True
    assert verdict["reasons"] == []
    assert verdict["once"]["outcome"] == "ok"
    assert verdict["once"]["generation"] == 1
    assert verdict["node_root"] == str(root)
    assert verdict["cleanup"] == f"mokka cleanup --root {root}"
    assert "cri" not in verdict["daemons_not_started"]
    assert "fabricmanager" in verdict["daemons_not_started"]

    cleanup = mokka("cleanup", "--root", str(root), cwd=tmp_path)
    assert cleanup.returncode == 0, cleanup.stderr
    assert cleanup.stdout.endswith(f"removed {root} too (made by mokka daemon --once)\n")
    assert snapshot(tmp_path) == before


def test_no_state_to_reconcile_leaves_no_root_and_says_so_as_json(tmp_path: Path):
    root = tmp_path / "node"
    done = mokka("daemon", "--once", "--root", str(root), "--profile",
                 str(tmp_path / "missing.yaml"), "--log-format", "json", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = json.loads(done.stdout.splitlines()[-1])
    assert verdict["ready"] is False
    assert verdict["once"] is None
    assert verdict["reasons"][0].startswith(f"no state to reconcile: {tmp_path}/missing.yaml")
    assert os.listdir(tmp_path) == []


def test_an_unwritable_root_is_one_line_at_start():
    setpriv = require_tool("setpriv")
    # tmp_path's parents are root's 0700: the root goes where nobody may look
    base = Path(tempfile.mkdtemp(prefix="mokka-unwritable-"))
    try:
        os.chmod(base, 0o755)
        root = base / "node"
        root.mkdir(mode=0o755)  # root's: nobody may enter, not write
        done = mokka(*ONCE, "--root", str(root),
                     prefix=(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"),
                     cwd=base)
        assert os.listdir(root) == []
    finally:
        shutil.rmtree(base)
    output = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 1, output
    assert len(output) == 1, output
    assert (f"ERROR mokka.daemon.command cannot write to the node root {root}: Permission "
            "denied (EACCES): uid 65534 may not create files there") in output[0]


def test_a_made_root_goes_only_when_nothing_but_the_mark_is_left(tmp_path: Path):
    kept = tmp_path / "kept"  # the user's: never marked
    kept.mkdir()
    assert not remove_if_emptied(kept)
    assert kept.is_dir()
    made = tmp_path / "made"
    made.mkdir()
    mark_made(made)
    (made / "left").write_text("")
    assert not remove_if_emptied(made)
    assert sorted(os.listdir(made)) == [MARK, "left"]
    (made / "left").unlink()
    assert remove_if_emptied(made)
    assert not made.exists()


def test_no_containerd_names_the_paths_under_the_node_root(tmp_path: Path):
    reason = RuntimeSetup(CriSettings()).leave_alone_reason(Host(tmp_path))
    looked = ", ".join(f"{tmp_path}{path}" for path in CONTAINERD_PATHS)
    assert reason is not None
    assert reason.startswith(f"no containerd on the host's PATH (looked under the node root "
                             f"{tmp_path}: {looked}); ")
