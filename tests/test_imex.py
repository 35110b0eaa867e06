"""The imex simulator: channel devices, the /proc/devices overlay, the capability
file, and nvidia-imex from a pinned archive (a directory, or a real download from
an HTTP server on 127.0.0.1), with teardown back to the exact starting tree."""

from __future__ import annotations

import argparse
import hashlib
import http.server
import io
import os
import stat
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trio

from mokka import layout
from mokka.errors import SpecError
from mokka.noderoot.host import Host
from mokka.simulators import registry
from mokka.simulators.base import Simulator
from mokka.simulators.gpudriver import PLUGIN as GPUDRIVER_PLUGIN
from mokka.simulators.gpudriver import GpuDriverSettings
from mokka.simulators.imex import PLUGIN, ImexSettings, ImexSimulator, procdevices
from mokka.simulators.imex.archive import ArchiveError
from mokka.simulators.imex.channels import CAPABILITY_FILE, CHANNEL_DIR
from mokka.simulators.imex.simulator import IMEX_BIN, IMEX_CTL_BIN, IMEX_REAL_BIN, SHIM
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.support import snapshot

FAKE_IMEX = b'#!/bin/sh\necho "nvidia-imex.real $*"\n'
FAKE_IMEX_CTL = b'#!/bin/sh\necho "nvidia-imex-ctl $*"\n'
ARCHIVE_NAME = "nvidia-imex-linux-x86_64-580.65.06-archive.tar.gz"


def make_state(*, fabric_attached: bool = True, gates: dict[str, bool] | None = None) -> State:
    """The built-in gb200 profile (fabric-attached: IMEX on by default), or h100 (not)."""
    return compile_profile("gb200" if fabric_attached else "h100", node_name="node-a",
                           feature_gates=gates)


def build_archive(path: Path, members: dict[str, bytes] | None = None) -> str:
    """A tar.gz laid out like NVIDIA's (``<top>/bin/...``); returns its sha256."""
    if members is None:
        members = {"nvidia-imex": FAKE_IMEX, "nvidia-imex-ctl": FAKE_IMEX_CTL}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"nvidia-imex-linux-x86_64-580.65.06-archive/bin/{name}")
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def files_outside_bookkeeping(root: Path) -> dict[str, tuple]:
    """The snapshot without directories and without the host's manifests (var/lib/mokka)."""
    return {
        k: v for k, v in snapshot(root).items()
        if v[0] != "dir" and not k.startswith(("var/lib/mokka", ".mokka-created-parents"))
    }


def mtimes(root: Path) -> dict[str, int]:
    """Modification times of everything staged (the host's own bookkeeping aside)."""
    return {
        str(p.relative_to(root)): os.lstat(p).st_mtime_ns for p in root.rglob("*")
        if not str(p.relative_to(root)).startswith(("var/lib/mokka", ".mokka-created-parents"))
    }


async def run(argv: list[str]) -> str:
    """Run a staged program for real; its stdout."""
    with trio.fail_after(30):
        result = await trio.run_process(argv, capture_stdout=True)
    return result.stdout.decode()


def rel(node_path: str) -> str:
    return node_path.lstrip("/")


def expected_overlay(base: str, channel_major: int = 235, caps_major: int = 236) -> str:
    head, block = base.split("\nBlock devices:", 1)
    return (head.rstrip("\n") + f"\n{channel_major:3d} nvidia-caps-imex-channels\n"
            f"{caps_major:3d} nvidia-caps\n\nBlock devices:" + block)


# ---- staging without binaries ----------------------------------------------


async def test_stage_on_empty_root_gives_exactly_the_documented_files(
    host: Host, node_root: Path
) -> None:
    before = snapshot(node_root)
    sim = ImexSimulator()
    await sim.stage(host, make_state())

    files = files_outside_bookkeeping(node_root)
    channels = {rel(f"{CHANNEL_DIR}/channel{i}"): ("dev", 0o666, 235, i) for i in range(2048)}
    assert files == {
        **channels,
        rel(CAPABILITY_FILE): (
            "file", 0o444, b"DeviceFileMinor: 512\nDeviceFileMode: 438\nDeviceFileModify: 0\n"),
        rel(layout.IMEX_PROC_DEVICES): (
            "file", 0o444, expected_overlay(procdevices.SAMPLE.read_text()).encode()),
    }
    assert sim.readiness.ready
    assert "no nvidia-imex binaries" in sim.readiness.reason
    assert "--imex-archive-dir" in sim.readiness.reason

    await sim.discard(host)
    assert snapshot(node_root) == before
    assert not sim.readiness.ready


async def test_stage_twice_changes_nothing(host: Host, node_root: Path) -> None:
    before = snapshot(node_root)
    sim = ImexSimulator(settings=ImexSettings(channel_count=16))
    await sim.stage(host, make_state())
    first = mtimes(node_root)
    staged = snapshot(node_root)
    await sim.stage(host, make_state())
    assert mtimes(node_root) == first
    assert snapshot(node_root) == staged
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_fewer_channels_remove_the_extra_nodes(host: Host, node_root: Path) -> None:
    before = snapshot(node_root)
    await ImexSimulator(settings=ImexSettings(channel_count=8)).stage(host, make_state())
    sim = ImexSimulator(settings=ImexSettings(channel_count=4))
    await sim.stage(host, make_state())
    names = sorted(p.name for p in (node_root / rel(CHANNEL_DIR)).iterdir())
    assert names == ["channel0", "channel1", "channel2", "channel3"]
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_auto_is_off_for_a_profile_without_a_fabric(host: Host, node_root: Path) -> None:
    before = snapshot(node_root)
    sim = ImexSimulator()
    await sim.stage(host, make_state(fabric_attached=False))
    assert snapshot(node_root) == before
    assert sim.readiness.ready
    assert "not fabric-attached" in sim.readiness.reason


async def test_on_forces_imex_and_off_removes_it(host: Host, node_root: Path) -> None:
    before = snapshot(node_root)
    forced = ImexSimulator(settings=ImexSettings(mode="on", channel_count=2))
    await forced.stage(host, make_state(fabric_attached=False))
    assert (node_root / rel(CHANNEL_DIR) / "channel1").exists()
    # A later pass with IMEX off converges everything away.
    off = ImexSimulator(settings=ImexSettings(mode="off", channel_count=2))
    await off.stage(host, make_state())
    assert snapshot(node_root) == before
    assert "--imex off" in off.readiness.reason


async def test_the_hosts_proc_devices_is_the_base_on_a_real_root(
    host: Host, node_root: Path
) -> None:
    proc = node_root / "proc"
    proc.mkdir()
    host_text = ("Character devices:\n  1 mem\n509 nvidia-caps-imex-channels\n510 nvidia-caps\n"
                 "511 nvidia-frontend\n\nBlock devices:\n  8 sd\n")
    (proc / "devices").write_text(host_text)
    before = snapshot(node_root)
    sim = ImexSimulator(settings=ImexSettings(channel_count=1))
    await sim.stage(host, make_state())
    assert (node_root / rel(layout.IMEX_PROC_DEVICES)).read_text() == (
        "Character devices:\n  1 mem\n511 nvidia-frontend\n235 nvidia-caps-imex-channels\n"
        "236 nvidia-caps\n\nBlock devices:\n  8 sd\n"
    )
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_a_proc_devices_that_is_not_text_fails_the_stage_before_any_write(
    host: Host, node_root: Path
) -> None:
    (node_root / "proc").mkdir()
    (node_root / "proc" / "devices").write_bytes(b"Character devices:\n\xff\xfe 1 mem\n")
    before = snapshot(node_root)
    sim = ImexSimulator(settings=ImexSettings(channel_count=1))
    with pytest.raises(SpecError, match=r"devices: not text \(invalid start byte at byte 19\)"):
        await sim.stage(host, make_state())
    assert snapshot(node_root) == before
    assert not sim.readiness.ready
    assert "not text" in sim.readiness.reason


async def test_a_taken_major_fails_the_stage_before_any_write(host: Host, node_root: Path) -> None:
    (node_root / "proc").mkdir()
    (node_root / "proc" / "devices").write_text(
        "Character devices:\n235 drm_dp_aux\n\nBlock devices:\n  8 sd\n")
    before = snapshot(node_root)
    sim = ImexSimulator(settings=ImexSettings(channel_count=1))
    with pytest.raises(
        SpecError, match=r"line 2: character major 235 is already taken by 'drm_dp_aux'"
    ):
        await sim.stage(host, make_state())
    assert snapshot(node_root) == before
    assert not sim.readiness.ready
    assert "drm_dp_aux" in sim.readiness.reason


# ---- the overlay rules ------------------------------------------------------


def base(text: str) -> procdevices.BaseText:
    return procdevices.BaseText(text, "/proc/devices")


def overlay_of_sample() -> str:
    sample = base(procdevices.SAMPLE.read_text())
    return procdevices.overlay(sample, channel_major=235, caps_major=236)


def test_the_consumers_regex_finds_both_names_in_the_overlay() -> None:
    text = overlay_of_sample()
    channels = procdevices.consumer_pattern("nvidia-caps-imex-channels").search(text)
    caps = procdevices.consumer_pattern("nvidia-caps").search(text)
    assert channels is not None
    assert channels.group(1) == "235"
    assert caps is not None
    assert caps.group(1) == "236"
    # The block section is untouched and still last.
    assert text.endswith("253 device-mapper\n254 mdp\n259 blkext\n")


def test_the_overlay_is_idempotent() -> None:
    once = overlay_of_sample()
    twice = procdevices.overlay(base(once), channel_major=235, caps_major=236)
    assert twice == once
    assert once.count("nvidia-caps-imex-channels") == 1


def test_the_overlay_replaces_an_old_major() -> None:
    earlier = overlay_of_sample()
    moved = procdevices.overlay(base(earlier), channel_major=600, caps_major=601)
    assert "235 nvidia-caps-imex-channels" not in moved
    assert procdevices.consumer_pattern("nvidia-caps-imex-channels").search(moved).group(1) == "600"
    assert procdevices.consumer_pattern("nvidia-caps").search(moved).group(1) == "601"


@pytest.mark.parametrize(
    ("text", "majors", "message"),
    [
        ("Character devices:\n236 foo bar\n\nBlock devices:\n", (235, 236),
         "/proc/devices: line 2: character major 236 is already taken by 'foo bar', "
         "expected --nvidia-caps-major to name a free major"),
        ("Character devices:\n  1 mem\n\nBlock devices:\n", (235, 235),
         "both 235, expected two distinct majors"),
        ("Character devices:\n  1 mem\n\nBlock devices:\n", (0, 236),
         "--imex-channel-major: 0, expected a character major in 1..4095"),
        ("Character devices:\n  1 mem\n\nBlock devices:\n", (235, 4096),
         "--nvidia-caps-major: 4096, expected a character major in 1..4095"),
        ("  1 mem\n", (235, 236), "/proc/devices: no 'Character devices:' line"),
        ("Character devices:\n  1 mem\n", (235, 236), "no 'Block devices:' line after"),
        ("Character devices:\nmem\n\nBlock devices:\n", (235, 236),
         "line 2: 'mem' is not a device entry"),
    ],
)
def test_the_overlay_rejects_bad_majors_and_bad_files(
    text: str, majors: tuple[int, int], message: str
) -> None:
    with pytest.raises(SpecError) as info:
        procdevices.overlay(base(text), channel_major=majors[0], caps_major=majors[1])
    assert message in str(info.value)


# ---- the pinned archive from a directory -------------------------------------


async def test_a_pinned_archive_installs_the_binaries_and_the_shim_runs_the_real_one(
    host: Host, node_root: Path, tmp_path: Path
) -> None:
    archive_dir = tmp_path / "imex-archive"
    archive_dir.mkdir()
    sha = build_archive(archive_dir / ARCHIVE_NAME)
    before = snapshot(node_root)
    sim = ImexSimulator(settings=ImexSettings(channel_count=1, archive_dir=archive_dir,
                                              archive_sha256=sha))
    await sim.stage(host, make_state())

    files = files_outside_bookkeeping(node_root)
    assert files[rel(IMEX_REAL_BIN)] == ("file", 0o755, FAKE_IMEX)
    assert files[rel(IMEX_CTL_BIN)] == ("file", 0o755, FAKE_IMEX_CTL)
    assert files[rel(IMEX_BIN)] == ("file", 0o755, SHIM.encode())
    assert sim.readiness.ready
    assert str(archive_dir / ARCHIVE_NAME) in sim.readiness.reason
    # The shim really execs the real binary beside it, adding --nogpu.
    shim = node_root / rel(IMEX_BIN)
    out = await run([str(shim), "-c", "/etc/nvidia-imex/config.cfg"])
    assert out == "nvidia-imex.real --nogpu -c /etc/nvidia-imex/config.cfg\n"
    assert await run([str(node_root / rel(IMEX_CTL_BIN)), "-q"]) == "nvidia-imex-ctl -q\n"

    await sim.stage(host, make_state())  # unchanged archive: nothing rewritten
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_a_checksum_mismatch_installs_nothing(
    host: Host, node_root: Path, tmp_path: Path
) -> None:
    archive_dir = tmp_path / "imex-archive"
    archive_dir.mkdir()
    build_archive(archive_dir / ARCHIVE_NAME)
    before = snapshot(node_root)
    sim = ImexSimulator(settings=ImexSettings(channel_count=1, archive_dir=archive_dir,
                                              archive_sha256="0" * 64))
    with pytest.raises(
        ArchiveError, match=r"sha256 [0-9a-f]{64}, expected 0{64}.*nothing was installed"
    ):
        await sim.stage(host, make_state())
    assert snapshot(node_root) == before
    assert not sim.readiness.ready


async def test_a_mismatch_after_a_good_stage_leaves_the_earlier_install_whole(
    host: Host, node_root: Path, tmp_path: Path
) -> None:
    archive_dir = tmp_path / "imex-archive"
    archive_dir.mkdir()
    sha = build_archive(archive_dir / ARCHIVE_NAME)
    before = snapshot(node_root)
    settings = ImexSettings(channel_count=1, archive_dir=archive_dir, archive_sha256=sha)
    await ImexSimulator(settings=settings).stage(host, make_state())
    staged = snapshot(node_root)
    # The volume now holds a different archive under the same name.
    build_archive(archive_dir / ARCHIVE_NAME, {"nvidia-imex": b"other", "nvidia-imex-ctl": b"x"})
    sim = ImexSimulator(settings=settings)
    with pytest.raises(ArchiveError):
        await sim.stage(host, make_state())
    assert snapshot(node_root) == staged
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_without_an_archive_the_node_stays_ready_without_binaries(
    host: Host, node_root: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "imex-archive"
    empty.mkdir()
    before = snapshot(node_root)
    sim = ImexSimulator(settings=ImexSettings(channel_count=1, archive_dir=empty,
                                              archive_sha256="a" * 64))
    await sim.stage(host, make_state())
    assert not (node_root / rel(IMEX_BIN)).exists()
    assert (node_root / rel(CHANNEL_DIR) / "channel0").exists()
    assert sim.readiness.ready
    reason = sim.readiness.reason
    assert f"no IMEX archive in {empty} and the IMEXDownload feature gate is off" in reason
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_an_unpinned_archive_is_refused(host: Host, node_root: Path, tmp_path: Path) -> None:
    archive_dir = tmp_path / "imex-archive"
    archive_dir.mkdir()
    build_archive(archive_dir / ARCHIVE_NAME)
    sim = ImexSimulator(settings=ImexSettings(channel_count=1, archive_dir=archive_dir))
    await sim.stage(host, make_state())
    assert not (node_root / rel(IMEX_REAL_BIN)).exists()
    assert sim.readiness.ready
    assert "refusing an archive without --imex-archive-sha256" in sim.readiness.reason
    await sim.discard(host)


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ({"nvidia-imex": FAKE_IMEX},
         "0 regular files named 'nvidia-imex-ctl', expected exactly one"),
        (None, None),
    ],
)
async def test_an_archive_without_both_binaries_is_an_error(
    host: Host, node_root: Path, tmp_path: Path, members: dict | None, message: str | None
) -> None:
    archive_dir = tmp_path / "imex-archive"
    archive_dir.mkdir()
    if members is None:
        # Not a tar archive at all.
        data = b"not an archive"
        (archive_dir / ARCHIVE_NAME).write_bytes(data)
        sha, message = hashlib.sha256(data).hexdigest(), "not a readable tar.gz/tar.xz archive"
    else:
        sha = build_archive(archive_dir / ARCHIVE_NAME, members)
    before = snapshot(node_root)
    sim = ImexSimulator(settings=ImexSettings(channel_count=1, archive_dir=archive_dir,
                                              archive_sha256=sha))
    with pytest.raises(ArchiveError, match=message):
        await sim.stage(host, make_state())
    assert snapshot(node_root) == before


async def test_two_archives_without_a_url_naming_one_are_ambiguous(
    host: Host, node_root: Path, tmp_path: Path
) -> None:
    archive_dir = tmp_path / "imex-archive"
    archive_dir.mkdir()
    sha = build_archive(archive_dir / "a.tar.gz")
    build_archive(archive_dir / "b.tar.xz")
    with pytest.raises(ArchiveError, match=r"several IMEX archives \(a.tar.gz, b.tar.xz\)"):
        await ImexSimulator(settings=ImexSettings(
            channel_count=1, archive_dir=archive_dir, archive_sha256=sha)).stage(host, make_state())
    # The URL's file name picks one.
    sim = ImexSimulator(settings=ImexSettings(
        channel_count=1, archive_dir=archive_dir, archive_sha256=sha,
        archive_url="https://example.invalid/imex/a.tar.gz"))
    await sim.stage(host, make_state())
    assert (node_root / rel(IMEX_REAL_BIN)).read_bytes() == FAKE_IMEX
    await sim.discard(host)


# ---- the download ------------------------------------------------------------


@attrs.define
class ArchiveServer:
    """A real HTTP server on 127.0.0.1 serving one file; counts the requests it gets."""

    url: str
    requests: list[str]


@pytest.fixture
def archive_server(tmp_path: Path) -> Iterator[tuple[ArchiveServer, str]]:
    served = tmp_path / "served"
    (served / "redist").mkdir(parents=True)
    sha = build_archive(served / "redist" / ARCHIVE_NAME)
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

        def log_message(self, format, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        yield ArchiveServer(f"http://127.0.0.1:{port}/redist/{ARCHIVE_NAME}", requests), sha
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


async def test_a_download_is_verified_cached_installed_and_discarded(
    host: Host, node_root: Path, archive_server: tuple[ArchiveServer, str]
) -> None:
    server, sha = archive_server
    before = snapshot(node_root)
    settings = ImexSettings(channel_count=1, archive_url=server.url, archive_sha256=sha)
    state = make_state(gates={"IMEXDownload": True})
    sim = ImexSimulator(settings=settings)
    await sim.stage(host, state)

    assert server.requests == [f"/redist/{ARCHIVE_NAME}"]
    cached = node_root / rel(layout.CACHE_DIR) / ARCHIVE_NAME
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == sha
    assert (node_root / rel(IMEX_REAL_BIN)).read_bytes() == FAKE_IMEX
    assert await run([str(node_root / rel(IMEX_BIN))]) == "nvidia-imex.real --nogpu\n"

    # A later pass, and a fresh process, use the cache instead of the network.
    await sim.stage(host, state)
    await ImexSimulator(settings=settings).stage(host, state)
    assert len(server.requests) == 1

    await ImexSimulator(settings=settings).discard(host)
    assert snapshot(node_root) == before


async def test_turning_the_gate_off_drops_the_cache_and_the_binaries(
    host: Host, node_root: Path, archive_server: tuple[ArchiveServer, str]
) -> None:
    server, sha = archive_server
    before = snapshot(node_root)
    settings = ImexSettings(channel_count=1, archive_url=server.url, archive_sha256=sha)
    sim = ImexSimulator(settings=settings)
    await sim.stage(host, make_state(gates={"IMEXDownload": True}))
    await sim.stage(host, make_state(gates={"IMEXDownload": False}))
    assert not (node_root / rel(layout.CACHE_DIR)).exists()
    assert not (node_root / rel(IMEX_BIN)).exists()
    assert (node_root / rel(CHANNEL_DIR) / "channel0").exists()
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_a_download_with_the_wrong_checksum_installs_nothing(
    host: Host, node_root: Path, archive_server: tuple[ArchiveServer, str]
) -> None:
    server, _ = archive_server
    before = snapshot(node_root)
    sim = ImexSimulator(settings=ImexSettings(channel_count=1, archive_url=server.url,
                                              archive_sha256="f" * 64))
    with pytest.raises(ArchiveError, match=f"{server.url}: sha256 .* expected f{{64}}"):
        await sim.stage(host, make_state(gates={"IMEXDownload": True}))
    assert len(server.requests) == 1
    assert snapshot(node_root) == before


async def test_a_download_without_a_pin_is_refused(
    host: Host, node_root: Path, archive_server: tuple[ArchiveServer, str]
) -> None:
    server, _ = archive_server
    sim = ImexSimulator(settings=ImexSettings(channel_count=1, archive_url=server.url))
    await sim.stage(host, make_state(gates={"IMEXDownload": True}))
    assert server.requests == []
    assert not (node_root / rel(layout.CACHE_DIR)).exists()
    assert sim.readiness.ready
    assert "refused: no --imex-archive-sha256 pin" in sim.readiness.reason
    await sim.discard(host)


async def test_a_download_that_fails_is_a_retryable_error(host: Host, node_root: Path) -> None:
    # A port nobody listens on: bind, read the port, close.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    before = snapshot(node_root)
    sim = ImexSimulator(settings=ImexSettings(
        channel_count=1, archive_url=f"http://127.0.0.1:{port}/{ARCHIVE_NAME}",
        archive_sha256="a" * 64))
    with pytest.raises(ArchiveError, match="download failed"):
        await sim.stage(host, make_state(gates={"IMEXDownload": True}))
    assert snapshot(node_root) == before


# ---- settings and registration ------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    PLUGIN.add_arguments(parser)
    # --nvidia-caps-major is the gpudriver's flag; the overlay announces the same major.
    GPUDRIVER_PLUGIN.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_build_the_settings() -> None:
    sim = PLUGIN.build(parse(
        "--imex", "on", "--imex-channels", "64", "--imex-channel-major", "500",
        "--nvidia-caps-major", "501", "--imex-archive-dir", "/imex",
        "--imex-archive-url", "https://example.invalid/x/imex.tar.xz",
        "--imex-archive-sha256", "AB" * 32,
    ))
    assert isinstance(sim, Simulator)
    assert sim.settings == ImexSettings(
        mode="on", channel_count=64, channel_major=500, caps_major=501,
        archive_dir=Path("/imex"), archive_url="https://example.invalid/x/imex.tar.xz",
        archive_sha256="ab" * 32,
    )
    assert sim.settings.archive_name == "imex.tar.xz"
    assert PLUGIN.build(parse()).settings == ImexSettings()
    # The UVM major it keeps clear of is the gpudriver's, flag and default.
    assert PLUGIN.build(parse("--uvm-major", "499")).settings.uvm_major == 499
    assert ImexSettings().uvm_major == GpuDriverSettings().uvm_major
    assert "mokka.simulators.imex" in registry.PLUGIN_MODULES


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--imex-channels", "0"), "--imex-channels: 0, expected 1..1048576"),
        (("--imex-channel-major", "4096"),
         "--imex-channel-major: 4096, expected a character major"),
        (("--nvidia-caps-major", "235"), "both 235, expected two distinct majors"),
        # 195 is the NVIDIA driver's static major: channel<i> would be /dev/nvidia<i>.
        (("--imex-channel-major", "195"),
         "--imex-channel-major: 195, expected a major other than 195 (NVIDIA's own"),
        # nvidia-uvm's major (the gpudriver's flag): channel0/1 would be nvidia-uvm(-tools).
        (("--imex-channel-major", "510"),
         "--imex-channel-major and --uvm-major: both 510, expected two distinct majors"),
        (("--imex-archive-sha256", "abc"), "--imex-archive-sha256: 'abc', expected 64 hexadecimal"),
        (("--imex-archive-url", "file:///etc/passwd"), "expected an http:// or https:// URL"),
        (("--imex-archive-url", "https://example.invalid/"), "has no file name in its path"),
    ],
)
def test_bad_flags_are_clear_errors(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(SpecError) as info:
        PLUGIN.build(parse(*argv))
    assert message in str(info.value)


def test_the_channel_nodes_are_real_character_devices(node_root: Path) -> None:
    # Guard for the exact-file test above: this suite runs as root (CAP_MKNOD),
    # so placeholders would be a broken environment, not a pass.
    probe = node_root / "probe"
    os.mknod(probe, stat.S_IFCHR | 0o600, os.makedev(235, 0))
    assert stat.S_ISCHR(os.lstat(probe).st_mode)
