"""What one converge call knows of directories, and what it forgets when it removes one."""

from __future__ import annotations

from pathlib import Path

from mokka.noderoot.convergence import Convergence
from mokka.noderoot.host import Host
from mokka.noderoot.manifest import Manifest
from tests.support import snapshot


def convergence(host: Host) -> Convergence:
    """A converge call's bookkeeping over ``host``, as ``Host.converge`` makes one."""
    return Convergence(
        paths=host.paths,
        manifest=Manifest.load("t", host.state.manifest_dir()),
        dirs_lock=host.dirs_lock,
        disk_turn=host.disk_turn,
        listings=host.listings,
        manifest_dir=host.state.manifest_dir(),
        state_dir=host.state_dir,
        run=host.run,
    )


def test_a_removed_directory_is_forgotten_however_it_was_reached_and_nothing_else(
    host: Host, node_root: Path
):
    (node_root / "run/b/deep").mkdir(parents=True)
    (node_root / "run/bb").mkdir()
    (node_root / "var").mkdir()
    (node_root / "var/run").symlink_to("/run")
    (node_root / "other").mkdir()
    before = snapshot(node_root)
    work = convergence(host)
    work.resolve("/var/run/b/deep/x")
    work.resolve("/run/b/deep/y")
    work.resolve("/run/bb/z")
    work.resolve("/other/w")
    assert {"var/run/b/deep", "run/b/deep", "run/bb", "other"} <= set(work.resolved)
    assert work.resolved["var/run/b"] == ("run", "b")  # reached through the link
    work.forget_directory("/run/b", ["run", "b"])
    assert not {k for k in work.resolved if k.endswith(("run/b", "run/b/deep"))}
    # A sibling whose name starts the same, the link itself and the rest stay known.
    assert {"run", "run/bb", "var", "var/run", "other"} <= set(work.resolved)
    assert snapshot(node_root) == before  # resolving creates nothing
