"""The node root (``mokka.noderoot.host``): confinement, converging, manifests, backups, devices."""

from __future__ import annotations

import argparse
import errno
import os
import re
import socket
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import mokka.noderoot.convergence
import mokka.noderoot.fsops
import mokka.noderoot.host
import mokka.noderoot.manifest
import mokka.noderoot.removal
import mokka.noderoot.shared_dirs
import mokka.noderoot.statedir
from mokka.errors import HostFaultError, HostPathError, PassSuperseded
from mokka.layout import MOKKA_MANIFESTS
from mokka.noderoot.host import (
    GIVE_WAY,
    CharDevice,
    ConvergeReport,
    CopyOf,
    Directory,
    File,
    Host,
    Symlink,
)
from mokka.noderoot.manifest import Manifest
from tests.support import ROOT, GiveWayAfter, journal, snapshot


def files(n: int, prefix: str = "/var/lib/nvml-mock/driver/dev/nvidia") -> list[File]:
    return [File(f"{prefix}{i}", f"device {i}\n") for i in range(n)]


# ---- confinement ----------------------------------------------------------


@pytest.mark.parametrize("path", ["../etc/passwd", "/var/../../etc/passwd", "a/b/../../../x"])
def test_dotdot_is_refused(host: Host, node_root: Path, path: str):
    with pytest.raises(HostPathError, match=r"'\.\.' is not allowed"):
        host.resolve(path)
    with pytest.raises(HostPathError):
        host.converge("t", [File(path, "x")])
    assert snapshot(node_root) == {}


def test_nul_byte_is_refused(host: Host):
    with pytest.raises(HostPathError, match="NUL"):
        host.resolve("/etc/pass\x00wd")


def test_relative_symlink_climbing_out_is_refused(host: Host, node_root: Path, tmp_path: Path):
    (node_root / "var").mkdir()
    (node_root / "var" / "escape").symlink_to("../../..")
    before = snapshot(node_root)
    outside_before = sorted(os.listdir(tmp_path.parent))
    with pytest.raises(HostPathError, match="climbs above the node root"):
        host.resolve("/var/escape/pwned")
    with pytest.raises(HostPathError):
        host.converge("t", [File("/var/escape/pwned", "x")])
    assert not (node_root / "var/escape/pwned").exists()
    assert sorted(os.listdir(tmp_path.parent)) == outside_before
    host.discard("t")
    assert snapshot(node_root) == before


def test_absolute_symlink_is_rerooted_inside(host: Host, node_root: Path, tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not yours\n")
    outside_before = snapshot(outside)
    # A planted link to an absolute path: on the node it means <root>/<that path>.
    (node_root / "etc").symlink_to(outside)
    inside = node_root / str(outside).lstrip("/")
    inside.mkdir(parents=True)
    before = snapshot(node_root)

    assert host.resolve("/etc/cfg") == inside / "cfg"
    report = host.converge("t", [File("/etc/cfg", "mine\n"), Directory("/etc/sub")])
    assert (inside / "cfg").read_text() == "mine\n"
    assert (inside / "sub").is_dir()
    assert "/etc/cfg" in report.created
    assert snapshot(outside) == outside_before
    host.discard("t")
    assert snapshot(node_root) == before
    assert snapshot(outside) == outside_before


def test_dangling_absolute_symlink_fails_cleanly(host: Host, node_root: Path, tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (node_root / "etc").symlink_to(outside)  # re-rooted target does not exist under the root
    before = snapshot(node_root)
    with pytest.raises(HostPathError, match="/etc"):
        host.converge("t", [File("/etc/cfg", "mine\n")])
    assert snapshot(outside) == {}
    assert host.owned("t") == {}
    host.discard("t")
    assert snapshot(node_root) == before


def test_last_component_symlink_is_replaced_not_followed(
    host: Host, node_root: Path, tmp_path: Path
):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    (node_root / "etc").mkdir()
    (node_root / "etc" / "cfg").symlink_to(outside)
    before = snapshot(node_root)
    host.converge("t", [File("/etc/cfg", "mine\n")])
    assert outside.read_text() == "precious\n"
    assert (node_root / "etc/cfg").read_text() == "mine\n"
    assert not (node_root / "etc/cfg").is_symlink()
    host.discard("t")
    assert snapshot(node_root) == before
    assert os.readlink(node_root / "etc/cfg") == str(outside)


# ---- convergence ------------------------------------------------------------


def test_stage_twice_rewrites_nothing(host: Host, node_root: Path, tmp_path: Path):
    source = tmp_path / "libfake.so"
    source.write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
    wanted = [
        *files(4),
        CopyOf("/var/lib/nvml-mock/driver/usr/lib64/libnvidia-ml.so.1", source),
        Symlink("/var/lib/nvml-mock/driver/usr/lib64/libnvidia-ml.so", "libnvidia-ml.so.1"),
        Directory("/var/lib/nvml-mock/driver/config", mode=0o750),
    ]
    first = host.converge("gpudriver", wanted)
    assert first.changed
    assert len(first.created) > len(wanted)
    # Mokka's own bookkeeping (the manifest) may be rewritten; the node's files may not.
    bookkeeping = node_root / "var/lib/mokka"
    stats = {p: os.lstat(p) for p in node_root.rglob("*") if bookkeeping not in (p, *p.parents)}
    second = host.converge("gpudriver", wanted)
    assert not second.changed
    for path, st in stats.items():
        again = os.lstat(path)
        assert (again.st_ino, again.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), path
    host.discard("gpudriver")
    assert snapshot(node_root) == {}


def test_a_cold_converge_looks_only_where_something_could_be(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """Paths in directories the call made are written without a look first (nothing can
    be there: the call holds the disk turn from ``mkdir`` to ``commit``); a path in a
    directory that was there is still looked at, and what it finds is backed up."""
    (node_root / "etc").mkdir()
    (node_root / "etc/foreign").write_text("theirs\n")
    before = snapshot(node_root)
    looked: list[str] = []
    real_lstat = mokka.noderoot.fsops.lstat_or_none

    def counting(path):
        looked.append(str(path))
        return real_lstat(path)

    monkeypatch.setattr(mokka.noderoot.fsops, "lstat_or_none", counting)
    wanted = [
        *files(3, "/sys/class/fresh/a/dev"),
        Symlink("/sys/class/fresh/a/link", "dev0"),
        CharDevice("/dev/fresh/node0", major=195, minor=0),
        File("/etc/foreign", "ours\n"),
        File("/etc/new", "ours\n"),
    ]
    report = host.converge("t", wanted)
    root = str(node_root)
    assert sorted(p[len(root):] for p in looked) == ["/etc/foreign", "/etc/new"]
    assert (node_root / "etc/foreign").read_text() == "ours\n"
    assert (node_root / "sys/class/fresh/a/dev2").read_text() == "device 2\n"
    assert os.readlink(node_root / "sys/class/fresh/a/link") == "dev0"
    assert "/sys/class/fresh" in report.created
    monkeypatch.setattr(mokka.noderoot.fsops, "lstat_or_none", real_lstat)
    # The same files again (nothing changed), then gone: the foreign file comes back.
    assert not host.converge("t", wanted).changed
    host.discard("t")
    assert snapshot(node_root) == before


def test_a_path_too_long_to_exist_never_blocks_its_removal(host: Host, node_root: Path):
    """A name over the filesystem's limit fails its creation after the journal noted it
    (a path is recorded before it is made); discard must find nothing there rather than
    fail on it in every later cleanup, and the rest of the owner goes as usual."""
    before = snapshot(node_root)
    too_long = "/opt/lib/libnvidia-ml.so." + "0" * 300
    wanted = [File("/opt/lib/kept", "x\n"), File(too_long, "y\n"),
              Symlink("/opt/lib/link." + "1" * 300, "kept")]
    with pytest.raises((HostFaultError, HostPathError, OSError)) as info:
        host.converge("t", wanted)
    assert "File name too long" in str(info.value)
    recorded = (node_root / MOKKA_MANIFESTS.lstrip("/") / "t.journal").read_text()
    assert f'"path":"{too_long}"' in recorded  # noted before its creation failed
    host.discard("t")
    assert snapshot(node_root) == before
    # and again: nothing is left to fail on
    host.discard("t")
    assert snapshot(node_root) == before


def test_content_and_mode_changes_are_rewritten(host: Host, node_root: Path):
    host.converge("t", [File("/etc/a", "one\n")])
    report = host.converge("t", [File("/etc/a", "two\n", mode=0o600)])
    assert report.updated == ("/etc/a",)
    assert (node_root / "etc/a").read_text() == "two\n"
    assert stat.S_IMODE(os.stat(node_root / "etc/a").st_mode) == 0o600
    host.discard("t")
    assert snapshot(node_root) == {}


def test_convergence_removes_what_is_no_longer_wanted(host: Host, node_root: Path):
    host.converge("gpudriver", files(8))
    report = host.converge("gpudriver", files(4))
    removed = {f"/var/lib/nvml-mock/driver/dev/nvidia{i}" for i in range(4, 8)}
    assert set(report.removed) == removed
    dev = node_root / "var/lib/nvml-mock/driver/dev"
    assert sorted(p.name for p in dev.iterdir()) == [f"nvidia{i}" for i in range(4)]
    # Moving everything elsewhere removes the now empty directories too.
    host.converge("gpudriver", [File("/opt/other", "x")])
    assert not (node_root / "var/lib/nvml-mock").exists()
    host.discard("gpudriver")
    assert snapshot(node_root) == {}


def test_foreign_files_in_our_directories_are_left_alone(host: Host, node_root: Path):
    host.converge("t", [File("/etc/mokka/a", "x")])
    (node_root / "etc/mokka/theirs").write_text("someone else's\n")
    host.discard("t")
    assert snapshot(node_root) == {
        "etc": ("dir", 0o755),
        "etc/mokka": ("dir", 0o755),
        "etc/mokka/theirs": ("file", 0o644, b"someone else's\n"),
    }


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_shared_parent_directories_go_with_the_last_owner(host: Host, node_root: Path, order):
    host.converge("a", [File("/var/lib/nvml-mock/a/x", "1")])
    host.converge("b", [File("/var/lib/nvml-mock/b/x", "2")])
    first, second = order
    host.discard(first)
    assert (node_root / f"var/lib/nvml-mock/{second}/x").exists()
    host.discard(second)
    assert snapshot(node_root) == {}


# ---- backups ----------------------------------------------------------------


def test_overwritten_files_are_restored_on_discard(host: Host, node_root: Path):
    (node_root / "etc/containerd").mkdir(parents=True)
    config = node_root / "etc/containerd/config.toml"
    config.write_text("version = 2\n")
    os.chmod(config, 0o600)
    (node_root / "usr/bin").mkdir(parents=True)
    (node_root / "usr/bin/nvidia-ctk").symlink_to("/opt/real/nvidia-ctk")
    before = snapshot(node_root)

    host.converge(
        "cri",
        [
            File("/etc/containerd/config.toml", "mocked\n"),
            Symlink("/usr/bin/nvidia-ctk", "/usr/local/nvidia/toolkit/nvidia-ctk"),
        ],
    )
    assert config.read_text() == "mocked\n"
    assert os.readlink(node_root / "usr/bin/nvidia-ctk") == "/usr/local/nvidia/toolkit/nvidia-ctk"
    # Converging again must not back up our own content over the original.
    host.converge("cri", [File("/etc/containerd/config.toml", "mocked again\n")])
    host.discard("cri")
    assert snapshot(node_root) == before


def test_identical_foreign_file_is_adopted_untouched(host: Host, node_root: Path):
    (node_root / "etc").mkdir()
    (node_root / "etc/same").write_text("same\n")
    before = snapshot(node_root)
    report = host.converge("t", [File("/etc/same", "same\n")])
    assert not report.changed
    host.discard("t")
    assert snapshot(node_root) == before


# ---- devices ----------------------------------------------------------------


def _may_mknod(directory: Path) -> bool:
    """Whether this process may make a device node (CAP_MKNOD), asked of the kernel."""
    probe = directory / "mknod-probe"
    try:
        os.mknod(probe, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        return False
    probe.unlink()
    return True


def test_real_char_device_when_permitted(host: Host, node_root: Path, tmp_path: Path):
    """A device node where the kernel lets this process make one (root, CI), the
    placeholder and a degraded report only where it does not; never a placeholder
    reported as a device, nor a device reported as degraded."""
    may_mknod = _may_mknod(tmp_path)
    report = host.converge("t", [CharDevice("/dev/nvidia0", 195, 0)])
    st = os.lstat(node_root / "dev/nvidia0")
    if may_mknod:
        assert report.degraded == ()
        assert stat.S_ISCHR(st.st_mode)
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, 0)
        assert stat.S_IMODE(st.st_mode) == 0o666
    else:
        assert len(report.degraded) == 1
        assert "no CAP_MKNOD" in report.degraded[0]
        assert stat.S_ISREG(st.st_mode)
        assert (node_root / "dev/nvidia0").read_text() == (
            "mokka placeholder for character device 195:0\n")
    assert report.created == ("/dev", "/dev/nvidia0")
    host.discard("t")
    assert snapshot(node_root) == {}


def test_placeholder_device_when_mknod_is_not_permitted(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    def no_mknod(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "mknod", no_mknod)
    monkeypatch.setattr(mokka.noderoot.fsops, "_MKNOD_PROBE", None)
    report = host.converge("t", [CharDevice("/dev/nvidiactl", 195, 255)])
    placeholder = node_root / "dev/nvidiactl"
    assert placeholder.is_file()
    assert placeholder.read_text() == "mokka placeholder for character device 195:255\n"
    assert report.created == ("/dev", "/dev/nvidiactl")
    assert len(report.degraded) == 1
    assert "no CAP_MKNOD" in report.degraded[0]
    mtime = placeholder.stat().st_mtime_ns
    again = host.converge("t", [CharDevice("/dev/nvidiactl", 195, 255)])
    assert not again.changed
    assert again.degraded == report.degraded
    assert placeholder.stat().st_mtime_ns == mtime
    host.discard("t")
    assert snapshot(node_root) == {}


# ---- manifests survive a killed process -------------------------------------

_KILLED = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {repo!r})
    from mokka.noderoot.host import File, Host

    kill_at = int(sys.argv[2])
    calls = 0
    real_replace = os.replace

    def replace(src, dst):
        global calls
        calls += 1
        if calls == kill_at:
            os._exit(9)  # killed mid-batch: the temp file exists, the rename never happens
        real_replace(src, dst)

    os.replace = replace
    host = Host(sys.argv[1])
    host.converge("gpudriver-dev", [
        File(f"/var/lib/nvml-mock/driver/dev/nvidia{{i}}", f"gpu {{i}}\\n") for i in range(40)
    ] + [File("/etc/pre-existing.conf", "ours\\n")])
    os._exit(9)  # killed after the batch, before any discard
    """
)


@pytest.mark.parametrize("kill_at", [1, 20, 41, 10_000])
def test_a_fresh_host_discards_what_a_killed_process_created(
    node_root: Path, tmp_path: Path, kill_at
):
    (node_root / "etc").mkdir()
    (node_root / "etc/pre-existing.conf").write_text("theirs\n")
    before = snapshot(node_root)
    script = tmp_path / "killed.py"
    script.write_text(_KILLED.format(repo=str(ROOT)))
    done = subprocess.run([sys.executable, str(script), str(node_root), str(kill_at)], timeout=60)
    assert done.returncode == 9
    assert snapshot(node_root) != before
    report = Host(node_root).discard("gpudriver-dev")
    assert report.removed
    assert snapshot(node_root) == before


def test_discard_all_finds_every_owner(node_root: Path):
    host = Host(node_root)
    host.converge("a", files(2, "/a/f"))
    host.converge("b", files(2, "/b/f"))
    report = Host(node_root).discard_all()
    assert set(report.removed) >= {"/a/f0", "/a/f1", "/b/f0", "/b/f1"}
    assert snapshot(node_root) == {}


# ---- path spellings ----------------------------------------------------------


def test_a_double_leading_slash_is_the_root_like_any_other(host: Host, node_root: Path):
    # POSIX lets ``//`` stand for something else, and ``PurePosixPath`` keeps it
    # as a root of its own; under the node root it must be plain ``/``.
    (node_root / "var").mkdir()
    (node_root / "var" / "run").symlink_to("//var/lib")  # a host-absolute target
    before = snapshot(node_root)
    assert host.resolve("//var/x") == node_root / "var/x"
    assert host.resolve("//var/run/cdi") == node_root / "var/lib/cdi"
    host.converge("t", [File("//var/a/f", "x\n"), File("/var/a/g", "y\n")])
    assert host.owned("t") == {"/var/a": "dir", "/var/a/f": "file", "/var/a/g": "file"}
    # The same file under its other spelling is the same path: kept, not removed.
    host.converge("t", [File("/var/a/f", "x\n"), File("/var/a/g", "y\n")])
    assert (node_root / "var/a/f").read_text() == "x\n"
    assert host.owned("t") == {"/var/a": "dir", "/var/a/f": "file", "/var/a/g": "file"}
    host.discard("t")
    assert snapshot(node_root) == before


def test_a_file_on_the_way_is_not_an_exception_of_resolve(host: Host, node_root: Path):
    (node_root / "etc").mkdir()
    (node_root / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    before = snapshot(node_root)
    assert host.resolve("/etc/hosts/x/y", follow_last=True) == node_root / "etc/hosts/x/y"
    assert host.exists("/etc/hosts/x") is False
    assert host.exists("/etc/hosts/x/y") is False
    with pytest.raises(HostPathError, match="/etc/hosts: exists and is not a directory"):
        host.converge("t", [File("/etc/hosts/x/y", "z")])
    host.discard("t")
    assert snapshot(node_root) == before


# ---- concurrent owners ---------------------------------------------------------


def test_a_parent_removed_by_another_owner_mid_converge_is_made_again(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """Owner ``a`` leaves the shared directory empty and removes it just as
    ``b`` is about to write into it; ``b``'s converge must still succeed."""
    before = snapshot(node_root)
    host.converge("a", [File("/d/shared/a", "a\n")])
    real_place = mokka.noderoot.convergence.Convergence.place
    raced: list[str] = []

    def place(self, art, norm):
        # ``b`` has just made sure of its parents; ``a`` now discards, which
        # removes the (still empty for ``b``) shared directory and ``/d``.
        if self.manifest.owner == "b" and not raced:
            raced.append(norm)
            host.discard("a")
        return real_place(self, art, norm)

    monkeypatch.setattr(mokka.noderoot.convergence.Convergence, "place", place)
    report = host.converge("b", [File("/d/shared/b", "b\n")])
    assert raced == ["/d/shared/b"]
    assert (node_root / "d/shared/b").read_text() == "b\n"
    assert not (node_root / "d/shared/a").exists()
    assert host.owned("b") == {"/d": "dir", "/d/shared": "dir", "/d/shared/b": "file"}
    assert "/d/shared/b" in report.created
    host.discard("b")
    assert snapshot(node_root) == before


def test_sharing_and_forgetting_a_directory_never_interleave(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """The race two owners had: ``b`` finds ``/d`` there and asks whether ``a``
    lists it, while ``a`` removes it (or fails to, not empty) and forgets it;
    both can then forget a directory that stays.  Both decisions are made
    under the host's one directory lock; checked at the two points, every time.
    """
    before = snapshot(node_root)
    checked: list[str] = []
    real_lists = mokka.noderoot.shared_dirs.OwnerListings.lists
    real_rmdir = mokka.noderoot.removal._rmdir

    def lists(self, directory, owner, key):
        assert host.dirs_lock.locked(), f"shared-directory check of {key} outside the lock"
        checked.append(f"share {key}")
        return real_lists(self, directory, owner, key)

    real_listed = mokka.noderoot.shared_dirs.OwnerListings.listed

    def listed(self, directory, exclude):
        assert host.dirs_lock.locked(), "reading every owner's directories outside the lock"
        checked.append(f"listed by owners but {exclude}")
        return real_listed(self, directory, exclude)

    def rmdir(norm, real):
        assert host.dirs_lock.locked(), f"rmdir of {norm} outside the lock"
        checked.append(f"rmdir {norm}")
        return real_rmdir(norm, real)

    monkeypatch.setattr(mokka.noderoot.shared_dirs.OwnerListings, "lists", lists)
    monkeypatch.setattr(mokka.noderoot.shared_dirs.OwnerListings, "listed", listed)
    monkeypatch.setattr(mokka.noderoot.removal, "_rmdir", rmdir)
    host.converge("a", [File("/d/a", "a")])
    host.converge("b", [File("/d/b", "b")])
    host.discard("a")
    assert (node_root / "d").is_dir()  # b still records it: the last owner out removes it
    host.discard("b")
    assert checked == ["share /d", "listed by owners but a", "listed by owners but b", "rmdir /d"]
    assert snapshot(node_root) == before


def test_an_empty_directory_another_owner_wants_outlives_its_maker(host: Host, node_root: Path):
    """The fabric manager's marker makes ``fabric-state`` as its parent; the stage owner
    wants that very directory, empty (the CDI spec mounts it).  Taking the marker
    down must leave the directory to the last owner that records it."""
    before = snapshot(node_root)
    host.converge("marker", [File("/state/ready", "")])
    host.converge("stage", [Directory("/state")])
    host.discard("marker")
    assert (node_root / "state").is_dir()
    assert os.listdir(node_root / "state") == []
    # and the stage owner, converging again, finds it where it left it
    assert host.converge("stage", [Directory("/state")]).created == ()
    host.discard("stage")
    assert snapshot(node_root) == before


def test_a_share_noted_during_a_removal_is_seen_by_it(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """A removal reads the other owners' directories once, and again after another
    converge of this process noted one: here ``b`` shares ``/y`` while ``a`` is
    removing ``/x`` (as ``b``'s converge would, under the lock, between two of
    ``a``'s directories), and ``a`` must then leave ``/y`` to ``b``."""
    before = snapshot(node_root)
    host.converge("a", [Directory("/x"), Directory("/y")])
    manifests = node_root / "var/lib/mokka/manifests"
    real_rmdir = mokka.noderoot.removal._rmdir

    def rmdir(norm, real):
        if norm == "/x":
            journal(manifests, "b", {"op": "add", "path": "/y", "kind": "dir"})
            host.listings.notes += 1
        return real_rmdir(norm, real)

    monkeypatch.setattr(mokka.noderoot.removal, "_rmdir", rmdir)
    host.discard("a")
    assert not (node_root / "x").exists()
    assert (node_root / "y").is_dir()
    assert host.owned("b") == {"/y": "dir"}
    monkeypatch.setattr(mokka.noderoot.removal, "_rmdir", real_rmdir)
    host.discard("b")
    assert snapshot(node_root) == before


@pytest.mark.parametrize("round_", range(3))
def test_owners_sharing_parents_converge_concurrently_without_errors(
    node_root: Path, round_: int
):
    """Two owners grow and shrink into the same directories from two threads,
    as the simulators of one Stage wave do; none of their converges may fail,
    and once both are discarded no shared parent may be left behind.

    Both threads start each step together (a barrier), so every step is a
    real overlap of one owner's "share or create" with the other's "remove
    and forget", not two threads that happen to be scheduled one after the
    other; 3 rounds of 300 overlapping steps, in and out of phase.
    """
    host = Host(node_root)
    before = snapshot(node_root)
    errors: list[str] = []
    steps = 300
    barrier = threading.Barrier(2, timeout=60)

    def churn(owner: str) -> None:
        for i in range(steps):
            barrier.wait()
            # Out of phase on odd rounds: one grows while the other shrinks.
            grow = (i + (owner == "y" and round_ % 2)) % 2
            wanted = [File(f"/d/a/{owner}", "x"), Directory(f"/d/b/{owner}")] if grow else []
            try:
                host.converge(owner, wanted)
            except Exception as exc:  # every failure is the finding
                errors.append(f"{owner}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=churn, args=(owner,)) for owner in ("x", "y")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    host.discard("x")
    host.discard("y")
    assert snapshot(node_root) == before


# ---- the journal -----------------------------------------------------------------


def test_a_torn_journal_line_does_not_swallow_the_next_record(host: Host, node_root: Path):
    """A process killed mid-write leaves half a line; the next process's first
    record must not be glued to it (and skipped with it when the journal is read)."""
    before = snapshot(node_root)
    host.converge("t", [File("/a/first", "1")])
    directory = host._manifest_dir()
    (directory / "t.json").unlink()
    (directory / "t.journal").write_text(
        '{"op":"add","path":"/a","kind":"dir"}\n{"op":"add","path":"/a/first","kind":"file"}\n'
        '{"op":"add","pa'
    )
    manifest = Manifest.load("t", directory)
    manifest.note("add", "/a/second", "file")
    manifest.close()  # killed before compaction: the journal is all there is
    (node_root / "a" / "second").write_text("2")
    assert Manifest.load("t", directory).entries == {
        "/a": "dir", "/a/first": "file", "/a/second": "file"}
    host.discard("t")
    assert snapshot(node_root) == before


# ---- discard is best effort --------------------------------------------------------


def test_one_path_that_cannot_go_does_not_keep_the_rest(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    before = snapshot(node_root)
    host.converge("t", [File("/a/x", "1"), File("/b/deep/y", "2"), File("/c/z", "3")])
    real_unlink = mokka.noderoot.fsops.unlink

    def unlink(path: str | Path) -> None:
        if os.path.basename(path) == "y":
            raise PermissionError(1, "Operation not permitted", str(path))
        real_unlink(path)

    monkeypatch.setattr(mokka.noderoot.fsops, "unlink", unlink)
    with pytest.raises(HostPathError, match=r"could not remove /b/deep/y \(Operation not "
                       r"permitted\); kept in the manifest for the next try"):
        host.discard("t")
    # Everything else went; the failed file and its parents are still recorded.
    assert not (node_root / "a").exists()
    assert not (node_root / "c").exists()
    assert host.owned("t") == {"/b": "dir", "/b/deep": "dir", "/b/deep/y": "file"}
    monkeypatch.setattr(mokka.noderoot.fsops, "unlink", real_unlink)
    host.discard("t")  # the next try (a later teardown, `mokka cleanup`) finishes the job
    assert snapshot(node_root) == before


def test_a_file_replaced_by_a_directory_is_left_and_forgotten(host: Host, node_root: Path):
    host.converge("t", [File("/a/x", "1"), File("/b/y", "2"), File("/c/z", "3")])
    (node_root / "b/y").unlink()
    (node_root / "b/y").mkdir()
    (node_root / "b/y/theirs").write_text("not ours\n")
    with pytest.raises(HostPathError, match="b/y: a directory is in the way"):
        host.converge("t", [File("/a/x", "1"), File("/b/y", "2"), File("/c/z", "3")])
    assert sorted(os.listdir(node_root / "b")) == ["y"]  # and no temp file beside it
    host.discard("t")
    assert host.owned("t") == {}
    assert snapshot(node_root) == {
        "b": ("dir", 0o755), "b/y": ("dir", 0o755),
        "b/y/theirs": ("file", 0o644, b"not ours\n")}


# ---- what a replaced entry was -------------------------------------------------------


def test_a_fifo_we_replaced_comes_back_as_a_fifo(host: Host, node_root: Path):
    (node_root / "run").mkdir()
    os.mkfifo(node_root / "run/pipe", 0o620)
    os.chmod(node_root / "run/pipe", 0o620)
    before = snapshot(node_root)
    host.converge("t", [File("/run/pipe", "ours\n")])
    assert (node_root / "run/pipe").read_text() == "ours\n"
    host.discard("t")
    assert stat.S_ISFIFO(os.lstat(node_root / "run/pipe").st_mode)
    assert snapshot(node_root) == before


def test_a_socket_in_the_way_is_refused(host: Host, node_root: Path):
    (node_root / "run").mkdir()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(node_root / "run/sock"))
        before = snapshot(node_root)
        with pytest.raises(HostPathError, match="/run/sock: a socket is in the way"):
            host.converge("t", [File("/run/sock", "ours\n")])
        host.discard("t")
        assert snapshot(node_root) == before


def test_the_mknod_probe_writes_only_under_the_root(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    made: list[str] = []
    real_mknod = os.mknod

    def mknod(path, *args, **kwargs):
        made.append(str(path))
        return real_mknod(path, *args, **kwargs)

    monkeypatch.setattr(os, "mknod", mknod)
    monkeypatch.setattr(mokka.noderoot.fsops, "_MKNOD_PROBE", None)
    # A placeholder from an earlier run without CAP_MKNOD: asking whether it
    # still fits is what runs the probe.
    (node_root / "dev").mkdir()
    (node_root / "dev/nvidiactl").write_text("mokka placeholder for character device 195:255\n")
    before = snapshot(node_root)
    host.converge("t", [CharDevice("/dev/nvidiactl", 195, 255)])
    assert mokka.noderoot.fsops._MKNOD_PROBE is not None
    assert made
    assert [p for p in made if not p.startswith(f"{node_root}/")] == []
    host.discard("t")
    assert snapshot(node_root) == before


def test_cleanup_tries_every_owner_and_says_what_is_left(
    node_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    from mokka.daemon.command import run_cleanup_command

    host = Host(node_root)
    host.converge("a", [File("/a/stuck", "1")])
    host.converge("b", [File("/b/f", "2")])
    real_unlink = mokka.noderoot.fsops.unlink

    def unlink(path: str | Path) -> None:
        if os.path.basename(path) == "stuck":
            raise PermissionError(1, "Operation not permitted", str(path))
        real_unlink(path)

    monkeypatch.setattr(mokka.noderoot.fsops, "unlink", unlink)
    assert run_cleanup_command(argparse.Namespace(root=str(node_root))) == 1
    assert capsys.readouterr().err == (
        "mokka cleanup: error: a: could not remove /a/stuck (Operation not permitted); "
        "kept in the manifest for the next try\n")
    assert not (node_root / "b").exists()  # the owner after the stuck one was discarded
    assert Host(node_root).owned("a") == {"/a": "dir", "/a/stuck": "file"}
    monkeypatch.setattr(mokka.noderoot.fsops, "unlink", real_unlink)
    assert run_cleanup_command(argparse.Namespace(root=str(node_root))) == 0
    assert snapshot(node_root) == {}


# ---- expected faults ---------------------------------------------------------------


def test_a_full_disk_is_one_host_fault_naming_the_path(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """ENOSPC from a data write (which names no file) says which path it was,
    as a ``HostFaultError``; the temp file is gone and a discard removes the rest."""
    before = snapshot(node_root)
    real_write_data = mokka.noderoot.fsops.write_all

    def write_data(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(mokka.noderoot.fsops, "write_all", write_data)
    with pytest.raises(HostFaultError) as caught:
        host.converge("t", [File("/opt/big/blob", "x" * 100)])
    assert str(caught.value) == (
        "t: /opt/big/blob: No space left on device (ENOSPC): "
        "the filesystem holding the node root is full"
    )
    assert not list((node_root / "opt/big").iterdir())  # no temp file left
    monkeypatch.setattr(mokka.noderoot.fsops, "write_all", real_write_data)
    host.discard("t")
    assert snapshot(node_root) == before


def test_a_vanished_root_is_one_host_fault(tmp_path: Path):
    root = tmp_path / "gone"
    root.mkdir()
    host = Host(root)
    root.rmdir()
    with pytest.raises(HostFaultError, match=rf"^t: the node root {re.escape(str(root))} is gone$"):
        host.converge("t", [File("/a", "a")])
    assert host.discard("t").removed == ()
    assert not root.exists()


def test_discarding_what_was_never_written_writes_nothing(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """A teardown on a root the daemon never wrote to (read-only, closed, or
    simply untouched) must not create the state directory to find that out:
    on a read-only root that mkdir is the EROFS teardown failed with."""
    (node_root / "etc").mkdir()
    before = snapshot(node_root)

    def read_only(path, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    for module in (mokka.noderoot.statedir.os, mokka.noderoot.manifest.os,
                   mokka.noderoot.convergence.os):
        monkeypatch.setattr(module, "mkdir", read_only)
    assert host.discard("t") == ConvergeReport()
    assert host.discard_all() == ConvergeReport()
    assert snapshot(node_root) == before


def test_a_symlinked_state_directory_and_var_run_are_removed_at_their_targets(
    host: Host, node_root: Path
):
    """``var/run -> /run`` and ``var/lib/mokka -> /data/mokka``: the directories
    made at the link targets are recorded there, and go again on discard."""
    (node_root / "run").mkdir()
    (node_root / "data").mkdir()
    (node_root / "var/lib").mkdir(parents=True)
    (node_root / "var/run").symlink_to("/run")
    (node_root / "var/lib/mokka").symlink_to("/data/mokka")
    before = snapshot(node_root)
    host.converge("t", [File("/var/run/cdi/spec.yaml", "x"), Directory("/var/run/nvidia")])
    assert (node_root / "run/cdi/spec.yaml").read_text() == "x"
    assert (node_root / "data/mokka/manifests/t.json").is_file()
    assert host.owned("t") == {
        "/run/cdi": "dir", "/var/run/cdi/spec.yaml": "file", "/run/nvidia": "dir",
    }
    host.discard("t")
    assert snapshot(node_root) == before


def test_narrowing_through_a_link_keeps_the_real_parents_of_what_stays(
    host: Host, node_root: Path
):
    """Stale directories recorded at a link's target (``/run/...`` for ``/var/run/...``)
    go when nothing wanted lies beneath them, and stay while something does, also
    when the wanted path is found exactly as the last converge left it."""
    (node_root / "run").mkdir()
    (node_root / "var").mkdir()
    (node_root / "var/run").symlink_to("/run")
    before = snapshot(node_root)
    both = [File("/var/run/a/deep/kept", "k"), File("/var/run/b/deep/gone", "g"),
            Directory("/var/run/a/empty")]
    host.converge("t", both)
    assert {"/run/a", "/run/a/deep", "/run/b", "/run/b/deep"} <= set(host.owned("t"))
    report = host.converge("t", [both[0]])
    assert set(report.removed) == {"/var/run/b/deep/gone", "/run/b/deep", "/run/b",
                                   "/run/a/empty"}
    assert (node_root / "run/a/deep/kept").read_text() == "k"
    assert not (node_root / "run/b").exists()
    assert set(host.owned("t")) == {"/run/a", "/run/a/deep", "/var/run/a/deep/kept"}
    host.discard("t")
    assert snapshot(node_root) == before


# ---- the drift check of a pass that changes nothing ------------------------------


def test_an_unchanged_converge_reads_no_manifest_and_writes_nothing(
    host: Host, node_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    source = tmp_path / "libfake.so"
    source.write_bytes(b"\x7fELF fake")
    wanted = [
        *files(3),
        Symlink("/var/lib/nvml-mock/driver/dev/link", "nvidia0"),
        CopyOf("/usr/lib/libfake.so", source),
        Directory("/etc/empty", 0o750),
    ]
    host.converge("t", wanted)
    before = snapshot(node_root)
    loads: list[str] = []
    real_load = Manifest.load.__func__

    def counting_load(cls, owner: str, directory: Path, snapshots=None) -> Manifest:
        loads.append(owner)
        return real_load(cls, owner, directory, snapshots)

    monkeypatch.setattr(Manifest, "load", classmethod(counting_load))
    for _ in range(3):
        assert host.converge("t", list(wanted)) == ConvergeReport()
    assert loads == []
    assert snapshot(node_root) == before
    # A different set of artifacts is a full converge again.
    assert host.converge("t", wanted[:-1]).removed == ("/etc/empty", "/etc")
    assert loads == ["t"]
    host.discard("t")
    assert snapshot(node_root) == {}


@pytest.mark.parametrize(
    "drift",
    ["content", "deleted", "chmod", "replaced", "parent-renamed", "source-changed"],
)
def test_drift_since_the_last_converge_is_put_right(
    host: Host, node_root: Path, tmp_path: Path, drift: str, monkeypatch: pytest.MonkeyPatch
):
    """Whatever changed after a converge, the next one with the same artifacts
    is a full converge (the signature check must not take a changed node for a
    settled one), which puts it right."""
    source = tmp_path / "libfake.so"
    source.write_bytes(b"version 1")
    wanted = [*files(2), CopyOf("/usr/lib/libfake.so", source)]
    host.converge("t", wanted)
    converged = snapshot(node_root)
    dev = node_root / "var/lib/nvml-mock/driver/dev"
    victim = dev / "nvidia1"
    if drift == "content":
        # Same size, same mtime: only the change time gives it away.
        st = os.stat(victim)
        victim.write_bytes(b"tampered!")
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif drift == "deleted":
        victim.unlink()
    elif drift == "chmod":
        victim.chmod(0o600)
    elif drift == "replaced":
        victim.unlink()
        victim.symlink_to("nvidia0")
    elif drift == "parent-renamed":
        # The directory moved away and a link to it put in its place: the
        # files are where they were through the link, but not as placed.
        moved = dev.with_name("dev.moved")
        dev.rename(moved)
        dev.symlink_to("dev.moved")
    else:
        source.write_bytes(b"version 2")
    loads: list[str] = []
    real_load = Manifest.load.__func__
    monkeypatch.setattr(Manifest, "load", classmethod(
        lambda cls, owner, directory, snapshots=None:
        loads.append(owner) or real_load(cls, owner, directory, snapshots)
    ))
    report = host.converge("t", wanted)
    assert loads == ["t"]
    # Through the link the files are as placed: a full converge, nothing to change.
    assert report.changed == (drift != "parent-renamed")
    if drift == "source-changed":
        assert (node_root / "usr/lib/libfake.so").read_bytes() == b"version 2"
    elif drift != "parent-renamed":
        assert snapshot(node_root) == converged
    host.discard("t")


def _placed_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Node paths ``Convergence.place`` looks at from now on (those not skipped as unchanged)."""
    seen: list[str] = []
    real_place = mokka.noderoot.convergence.Convergence.place

    def place(self, art, norm: str) -> None:
        seen.append(norm)
        real_place(self, art, norm)

    monkeypatch.setattr(mokka.noderoot.convergence.Convergence, "place", place)
    return seen


def test_a_changed_converge_skips_only_what_is_exactly_as_it_left_it(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """A converge with one artifact more looks again only at the new path and at
    the one someone changed meanwhile; the untouched ones keep their inodes."""
    prefix = "/var/lib/nvml-mock/driver/dev/nvidia"
    host.converge("t", files(3))
    dev = node_root / prefix.lstrip("/")
    inodes = {i: os.lstat(f"{dev}{i}").st_ino for i in range(3)}
    victim = Path(f"{dev}1")
    st = os.stat(victim)
    victim.write_bytes(b"tampered\n")  # same size as "device 1\n"
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    seen = _placed_paths(monkeypatch)
    report = host.converge("t", files(4))
    assert seen == [f"{prefix}1", f"{prefix}3"]
    assert (report.created, report.updated) == ((f"{prefix}3",), (f"{prefix}1",))
    assert victim.read_bytes() == b"device 1\n"
    assert os.lstat(f"{dev}0").st_ino == inodes[0]
    assert os.lstat(f"{dev}2").st_ino == inodes[2]
    host.discard("t")
    assert snapshot(node_root) == {}


def superseded(host: Host, owner: str, artifacts: list, after: int) -> None:
    """``host.converge`` given way to a newer input after ``after`` paths."""
    token = GIVE_WAY.set(GiveWayAfter(after))
    try:
        with pytest.raises(PassSuperseded):
            host.converge(owner, artifacts)
    finally:
        GIVE_WAY.reset(token)


def test_a_superseded_converge_leaves_the_last_good_record_to_start_from(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """The next converge still skips what is exactly as the last good one left it, and
    what the interrupted one made in between is found by the manifest, not missed."""
    prefix = "/var/lib/nvml-mock/driver/dev/nvidia"
    host.converge("t", files(3))
    # The fourth path's directories are made (and journaled) at once, its file
    # only at the batch's commit, which the newer input never lets come.
    superseded(host, "t", [*files(3), File("/opt/new/x", "x\n"), *files(5)[3:]], after=4)
    assert (node_root / "opt/new").is_dir()
    assert not (node_root / "opt/new/x").exists()
    # Its record was held for the commit too: what was never made is not recorded.
    assert {"/opt", "/opt/new"} <= set(host.owned("t"))
    assert "/opt/new/x" not in host.owned("t")
    seen = _placed_paths(monkeypatch)
    # The last good record's very artifacts: none of them placed again, yet
    # the node is not taken as unchanged (the journal moved the bookkeeping
    # signature), so what the interrupted converge made is removed.
    report = host.converge("t", files(3))
    assert seen == []
    assert report.removed == ("/opt/new", "/opt")  # as journaled
    assert not (node_root / "opt").exists()
    superseded(host, "t", files(6), after=3)
    host.converge("t", files(6))
    assert seen == [f"{prefix}3", f"{prefix}4", f"{prefix}5"]
    host.discard("t")
    assert snapshot(node_root) == {}


def test_a_converge_failed_by_a_full_disk_leaves_the_last_good_record_too(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """The same as a superseded one, for a fault: a disk filling up half way."""
    host.converge("t", files(3))
    real_write_all = mokka.noderoot.fsops.write_all

    def full_disk(fd: int, data: bytes) -> None:
        if data == b"x\n":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_all(fd, data)

    monkeypatch.setattr(mokka.noderoot.fsops, "write_all", full_disk)
    with pytest.raises(HostFaultError, match="ENOSPC"):
        host.converge("t", [*files(3), File("/opt/new/x", "x\n")])
    monkeypatch.setattr(mokka.noderoot.fsops, "write_all", real_write_all)
    assert (node_root / "opt/new").is_dir()
    seen = _placed_paths(monkeypatch)
    report = host.converge("t", files(3))
    assert seen == []
    assert report.removed == ("/opt/new/x", "/opt/new", "/opt")
    host.discard("t")
    assert snapshot(node_root) == {}


def test_a_directory_swapped_for_a_link_to_it_is_looked_at_again(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """Through the link every file still has its signature: only the check that
    each directory above is the same one (not a link) sends them back to ``place``."""
    prefix = "/var/lib/nvml-mock/driver/dev/nvidia"
    host.converge("t", files(2))
    dev = node_root / "var/lib/nvml-mock/driver/dev"
    dev.rename(dev.with_name("dev.moved"))
    dev.symlink_to("dev.moved")
    seen = _placed_paths(monkeypatch)
    host.converge("t", files(3))
    assert seen == [f"{prefix}0", f"{prefix}1", f"{prefix}2"]
    host.discard("t")


# ---- durability ------------------------------------------------------------------------


@pytest.mark.parametrize(("count", "syncs"), [(1, ["file"]), (4, ["file"] * 4), (5, ["fs"])])
def test_no_file_is_renamed_into_place_before_its_data_is_synced(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch, count: int, syncs: list[str]
):
    """A small batch syncs each of its files, a larger one the filesystem once; either
    way, before the first rename exposes any of them (docs/operations.md, power loss)."""
    events: list[str] = []
    real_replace = os.replace
    monkeypatch.setattr(mokka.noderoot.fsops, "sync_file", lambda path: events.append("file"))
    monkeypatch.setattr(mokka.noderoot.fsops, "sync_filesystem", lambda root: events.append("fs"))

    def replace(src, dst, *args, **kwargs):
        if ".mokka-tmp" in os.fspath(src):
            events.append("rename")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(mokka.noderoot.convergence.os, "replace", replace)
    host.converge("t", files(count))
    assert events == [*syncs, *["rename"] * count]
    assert [(node_root / f.path.lstrip("/")).read_text() for f in files(count)] == [
        f"device {i}\n" for i in range(count)]
    host.discard("t")
