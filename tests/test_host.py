"""The node root (``mokka.host``): confinement, convergence, manifests, backups, devices."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mokka.convergence
from mokka.errors import HostPathError
from mokka.host import CharDevice, CopyOf, Directory, File, Host, Symlink
from tests.support import ROOT, snapshot


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


def test_real_char_device_when_permitted(host: Host, node_root: Path):
    report = host.converge("t", [CharDevice("/dev/nvidia0", 195, 0)])
    st = os.lstat(node_root / "dev/nvidia0")
    if not report.degraded:  # we are root here (CI too); the placeholder path is tested below
        assert stat.S_ISCHR(st.st_mode)
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, 0)
        assert stat.S_IMODE(st.st_mode) == 0o666
    host.discard("t")
    assert snapshot(node_root) == {}


def test_placeholder_device_when_mknod_is_not_permitted(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    def no_mknod(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "mknod", no_mknod)
    monkeypatch.setattr(mokka.convergence, "_MKNOD_PROBE", None)
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
    from mokka.host import File, Host

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
