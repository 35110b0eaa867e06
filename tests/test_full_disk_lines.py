"""A full disk, as the operator reads it: each failure names its owner once and a real file.

A ``write`` that fails for want of space names no file (unlike an
``open``), so the first converge on a full disk, whose first write is
Mokka's own bookkeeping, was reported as ``t: ?: No space left on
device``; the gpudriver simulator then named each owner twice.  Here on a
real tmpfs whose data blocks are all taken (inodes are left: files can be
created, not written), as on a node whose disk filled up.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mokka.ctl import command as ctl
from mokka.ctl import records as ctl_records
from mokka.errors import HostFaultError, StageError
from mokka.layout import CONFIG_DIR, OVERRIDES
from mokka.noderoot.faults import owner_line
from mokka.noderoot.host import File, Host
from mokka.simulators.gpudriver import _converge_all
from mokka.state.overrides import MANIFEST_OWNERS
from tests.support import require_tool, snapshot

FULL = r"No space left on device \(ENOSPC\): the filesystem holding the node root is full"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A node root on a 1 MiB tmpfs, and the file ``filler`` beside it that takes every block."""
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run([require_tool("mount"), "-t", "tmpfs", "-o", "size=1m,mode=755",
                           "tmpfs", str(mount)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    try:
        (mount / "node").mkdir()
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], capture_output=True, timeout=30)


def fill(disk: Path) -> None:
    done = subprocess.run(["dd", "if=/dev/zero", f"of={disk / 'filler'}", "bs=64k"],
                          capture_output=True, text=True, timeout=30)
    assert "No space left on device" in done.stderr, done.stderr
    assert os.statvfs(disk).f_bavail == 0


def test_the_first_converge_on_a_full_disk_names_the_bookkeeping_file(disk: Path) -> None:
    host = Host(disk / "node")
    fill(disk)
    with pytest.raises(HostFaultError) as caught:
        host.converge("t", [File("/etc/x", "x\n")])
    message = str(caught.value)
    # the record of the directories the state directory needed (a file of the root's own)
    assert re.fullmatch(rf"t: /\S*mokka\S*: {FULL}", message), message
    (disk / "filler").unlink()
    host.discard("t")
    assert os.listdir(disk / "node") == []


def test_a_journal_that_cannot_grow_is_named(disk: Path) -> None:
    host = Host(disk / "node")
    host.converge("t", [File("/etc/a", "a\n")])
    before = snapshot(disk / "node")
    fill(disk)
    with pytest.raises(HostFaultError) as caught:
        host.converge("t", [File("/etc/a", "a\n"), File("/etc/b", "b\n")])
    message = str(caught.value)
    # the journal's write failed, before any file of /etc/b existed
    assert re.fullmatch(rf"t: /var/lib/mokka/\S+/t\.journal: {FULL}", message), message
    (disk / "filler").unlink()
    assert host.converge("t", [File("/etc/a", "a\n")]).removed == ()
    assert snapshot(disk / "node") == before
    host.discard("t")
    assert os.listdir(disk / "node") == []


async def test_the_driver_names_each_failed_owner_once(disk: Path) -> None:
    host = Host(disk / "node")
    host.converge("first", [File("/etc/a", "a\n")])  # the state directory exists
    fill(disk)
    batches = {"one": [File("/etc/one", "1\n")], "two": [File("/etc/two", "2\n")]}
    with pytest.raises(StageError) as caught:
        await _converge_all(host, batches)
    message = str(caught.value)
    assert message.startswith("gpudriver: "), message
    for owner in batches:
        assert message.count(f"{owner}: ") == 1, message
    assert ": ?:" not in message
    (disk / "filler").unlink()
    for owner in (*batches, "first"):
        host.discard(owner)
    assert os.listdir(disk / "node") == []


def test_owner_line_names_the_owner_once() -> None:
    assert owner_line("t", HostFaultError("t: /x: full")) == "t: /x: full"
    assert owner_line("t", OSError("disk")) == "t: disk"
    assert owner_line("t", ValueError("tt: other")) == "t: tt: other"


def test_a_recorded_overrides_file_that_cannot_be_rewritten_is_named(
    disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``mokka ctl`` on a full disk, once its files are recorded (``overrides.replace_text``)."""
    root = disk / "node"
    host = Host(root)
    host.converge("gpudriver-config", [File(CONFIG_DIR + "/config.yaml", b"format: 1\n")])
    assert ctl.main(["temp", "--root", str(root), "--gpu", "0", "--celsius", "60"]) == 0
    assert ctl_records.already_recorded(root)
    before = snapshot(root)
    fill(disk)
    capsys.readouterr()
    assert ctl.main(["temp", "--root", str(root), "--gpu", "0", "--celsius", "61"]) == 1
    path = root / OVERRIDES.lstrip("/")
    assert capsys.readouterr().err == f"mokka ctl: error: {path}: No space left on device\n"
    assert snapshot(root) == before  # the old file whole, and no temp file beside it
    (disk / "filler").unlink()
    for owner in (*MANIFEST_OWNERS, "gpudriver-config"):
        host.discard(owner)
    assert os.listdir(root) == []
