"""A directory the daemon recorded that something is mounted on (a bind mount a killed
process left) is detached and removed by discard, whatever filesystem the mount is from."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import mokka.noderoot.fsops
from mokka.noderoot.host import Directory, File, Host
from tests.support import require_tool, snapshot

MOUNT_TIMEOUT = 30


def _mount_table_names(path: Path) -> bool:
    return mokka.noderoot.fsops.mounted_on(path)


@pytest.fixture
def bound(node_root: Path):
    """Bind mounts within the node root (the same filesystem), undone at the end."""
    require_tool("mount")
    mounts: list[Path] = []

    def bind(source: Path, target: Path) -> None:
        done = subprocess.run(["mount", "--bind", str(source), str(target)],
                              capture_output=True, text=True, timeout=MOUNT_TIMEOUT)
        if done.returncode != 0:
            pytest.fail(f"mount --bind failed (the tests need root): {done.stderr.strip()}")
        mounts.append(target)

    yield bind
    for target in mounts:
        if target.exists() and _mount_table_names(target):
            subprocess.run(["umount", "--lazy", str(target)], capture_output=True,
                           timeout=MOUNT_TIMEOUT)


def test_a_same_filesystem_bind_mount_left_on_a_recorded_directory_is_detached(
    host: Host, node_root: Path, bound
):
    before = snapshot(node_root)
    host.converge("t", [Directory("/run/nvidia/driver"), File("/var/src/f", "x\n")])
    target = node_root / "run/nvidia/driver"
    bound(node_root / "var/src", target)
    assert (target / "f").read_text() == "x\n"
    assert _mount_table_names(target)
    host.discard("t")
    assert not target.exists()
    assert not _mount_table_names(target)
    assert snapshot(node_root) == before


def test_the_mount_table_knows_a_bind_mount_that_ismount_does_not(node_root: Path, bound):
    (node_root / "a").mkdir()
    (node_root / "b").mkdir()
    bound(node_root / "a", node_root / "b")
    assert mokka.noderoot.fsops.mounted_on(node_root / "b")
    assert not mokka.noderoot.fsops.mounted_on(node_root / "a")
