"""The gpudriver simulator's Stage: the driver tree on an empty node root, its
convergence, readiness, and teardown back to the exact starting tree."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import platform
import re
import stat
from pathlib import Path

import attrs
import pytest

from mokka import layout
from mokka.errors import NativeArtifactMissing, SpecError
from mokka.noderoot.host import Host
from mokka.simulators import registry
from mokka.simulators.base import Applier, Simulator
from mokka.simulators.gpudriver import OWNERS, PLUGIN, GpuDriverSettings, GpuDriverSimulator
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.simulators.gpudriver.procfs import render_version
from tests.gpudriver_support import (
    CUDA_BYTES,
    DRIVER,
    LIB_BYTES,
    SMI_BYTES,
    expected_tree,
    make_state,
    mtimes,
    node_paths,
    run_steps,
    symlink_settings,
    teardown,
    use_native_stand_ins,
)
from tests.support import real_nvidia_smi, require_tool, snapshot


@pytest.fixture
def native(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return use_native_stand_ins(tmp_path, monkeypatch)


@pytest.fixture
def settings(tmp_path: Path) -> GpuDriverSettings:
    return symlink_settings(tmp_path)


# --------------------------------------------------------------------------
# Stage
# --------------------------------------------------------------------------


async def test_stage_on_empty_root_gives_exactly_the_documented_tree(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    before = snapshot(node_root)
    state = make_state()
    sim = GpuDriverSimulator(settings=settings)
    await sim.stage(host, state)

    assert node_paths(node_root) == expected_tree()
    tree = snapshot(node_root)
    drv = "var/lib/nvml-mock/driver"
    for i in range(8):
        assert tree[f"{drv}/dev/nvidia{i}"] == ("dev", 0o666, 195, i)
    assert tree[f"{drv}/dev/nvidiactl"] == ("dev", 0o666, 195, 255)
    assert tree[f"{drv}/dev/nvidia-modeset"] == ("dev", 0o666, 195, 254)
    assert tree[f"{drv}/dev/nvidia-uvm"] == ("dev", 0o666, 510, 0)
    assert tree[f"{drv}/dev/nvidia-uvm-tools"] == ("dev", 0o666, 510, 1)
    assert tree[f"{drv}/dev/nvidia-caps/nvidia-cap1"] == ("dev", 0o400, 236, 1)
    assert tree[f"{drv}/dev/nvidia-caps/nvidia-cap2"] == ("dev", 0o444, 236, 2)

    lib = f"{drv}/usr/lib64"
    assert tree[f"{lib}/libnvidia-ml.so.{DRIVER}"] == ("file", 0o755, LIB_BYTES)
    assert tree[f"{lib}/libnvidia-ml.so.1"] == ("link", f"libnvidia-ml.so.{DRIVER}")
    assert tree[f"{lib}/libnvidia-ml.so"] == ("link", "libnvidia-ml.so.1")
    assert (node_root / lib / "libnvidia-ml.so").read_bytes() == LIB_BYTES
    assert tree[f"{lib}/libcuda.so.{DRIVER}"] == ("file", 0o755, CUDA_BYTES)
    assert tree[f"{lib}/libcuda.so.1"] == ("link", f"libcuda.so.{DRIVER}")
    assert tree[f"{lib}/libcuda.so"] == ("link", "libcuda.so.1")
    assert (node_root / lib / "libcuda.so").read_bytes() == CUDA_BYTES
    assert tree[f"{drv}/usr/bin/nvidia-smi"] == ("file", 0o755, SMI_BYTES)

    proc = f"{drv}/proc/driver/nvidia"
    version = tree[f"{proc}/version"]
    assert version[:2] == ("file", 0o444)
    assert version[2].decode() == (
        f"NVRM version: NVIDIA UNIX {platform.machine()} Kernel Module  {DRIVER}  "
        "Thu Jan  1 00:00:00 UTC 2026\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    params = tree[f"{proc}/params"][2].decode().splitlines()
    assert params[:5] == [
        "EnableMSI: 1",
        "NVreg_DeviceFileGID: 0",
        "NVreg_DeviceFileMode: 438",
        "NVreg_DeviceFileUID: 0",
        "NVreg_ModifyDeviceFiles: 1",
    ]
    assert "ModifyDeviceFiles: 1" in params  # what libnvidia-container parses
    assert all(": " in line for line in params)
    assert tree[f"{proc}/capabilities/mig/config"] == (
        "file",
        0o444,
        b"DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n",
    )
    assert tree[f"{proc}/capabilities/mig/monitor"] == (
        "file",
        0o444,
        b"DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
    )
    assert tree["var/lib/nvml-mock/sys/module/nvidia/version"] == (
        "file",
        0o444,
        f"{DRIVER}\n".encode(),
    )
    # the settings' default: the engine config asks for each GPU's idle signature
    assert tree[f"{drv}/config/config.yaml"] == (
        "file",
        0o644,
        render_engine_config(state, idle_signature=True).encode(),
    )
    # Each batch is its own owner, so the batches could run concurrently.
    assert all(host.owned(owner) for owner in OWNERS)

    await teardown(sim, host)
    assert snapshot(node_root) == before


async def test_device_nodes_follow_the_profile_minor_numbers(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    # Minor numbers follow bus order on real nodes, which need not be index order.
    state = make_state(4, minors=(3, 1, 0, 2))
    sim = GpuDriverSimulator(settings=attrs.evolve(settings, uvm_major=234, caps_major=241))
    await sim.stage(host, state)
    tree = snapshot(node_root)
    dev = "var/lib/nvml-mock/driver/dev"
    assert {p for p in tree if p.startswith(f"{dev}/nvidia") and p[len(dev) + 7 :].isdigit()} == {
        f"{dev}/nvidia{m}" for m in range(4)
    }
    assert tree[f"{dev}/nvidia3"] == ("dev", 0o666, 195, 3)
    assert tree[f"{dev}/nvidia-uvm"] == ("dev", 0o666, 234, 0)
    assert tree[f"{dev}/nvidia-uvm-tools"] == ("dev", 0o666, 234, 1)
    assert tree[f"{dev}/nvidia-caps/nvidia-cap2"] == ("dev", 0o444, 241, 2)
    await teardown(sim, host)
    assert snapshot(node_root) == {}


async def test_a_gpu_minor_of_a_control_node_fails_before_anything_is_written(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    """195:254 is ``nvidia-modeset`` and 195:255 ``nvidiactl``: a GPU on either
    would be the same device as the control node (the driver's GPU minors end
    at 253), and a container given that GPU would be given that node too."""
    sim = GpuDriverSimulator(settings=settings)
    for minor, node in ((254, "nvidia-modeset"), (255, "nvidiactl")):
        with pytest.raises(SpecError) as info:
            await sim.stage(host, make_state(2, minors=(0, minor)))
        text = str(info.value)
        assert f"devices[index=1].minor_number: {minor} is {node}'s minor" in text, text
        assert "expected 0..253" in text
        assert not sim.readiness.ready
        assert snapshot(node_root) == {}
    # 253, the last GPU minor, is fine.
    await sim.stage(host, make_state(2, minors=(0, 253)))
    assert snapshot(node_root)["var/lib/nvml-mock/driver/dev/nvidia253"] == ("dev", 0o666, 195, 253)
    await teardown(sim, host)
    assert snapshot(node_root) == {}


async def test_stage_twice_rewrites_nothing(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    sim = GpuDriverSimulator(settings=settings)
    state = make_state()
    await sim.stage(host, state)
    first = mtimes(node_root)
    await sim.stage(host, state)
    assert mtimes(node_root) == first
    await teardown(sim, host)
    assert snapshot(node_root) == {}


async def test_shrinking_to_four_gpus_removes_the_extra_nodes(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    sim = GpuDriverSimulator(settings=settings)
    await sim.stage(host, make_state(8))
    await sim.stage(host, make_state(4))
    assert node_paths(node_root) == expected_tree(range(4))
    # And back up again: the nodes return.
    await sim.stage(host, make_state(8))
    assert node_paths(node_root) == expected_tree(range(8))
    await teardown(sim, host)
    assert snapshot(node_root) == {}


async def test_a_new_driver_version_replaces_the_versioned_library(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    sim = GpuDriverSimulator(settings=settings)
    await sim.stage(host, make_state(2))
    await sim.stage(host, make_state(2, driver="595.91.07"))
    lib = node_root / "var/lib/nvml-mock/driver/usr/lib64"
    assert sorted(p.name for p in lib.iterdir()) == [
        "libcuda.so",
        "libcuda.so.1",
        "libcuda.so.595.91.07",
        "libnvidia-ml.so",
        "libnvidia-ml.so.1",
        "libnvidia-ml.so.595.91.07",
    ]
    assert os.readlink(lib / "libnvidia-ml.so.1") == "libnvidia-ml.so.595.91.07"
    assert os.readlink(lib / "libcuda.so.1") == "libcuda.so.595.91.07"
    assert (node_root / "var/lib/nvml-mock/sys/module/nvidia/version").read_text() == "595.91.07\n"
    await teardown(sim, host)
    assert snapshot(node_root) == {}


async def test_stage_without_the_built_library_fails_as_not_built(
    host: Host,
    node_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: GpuDriverSettings,
) -> None:
    empty = tmp_path / "empty-native"
    empty.mkdir()
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(empty))
    sim = GpuDriverSimulator(settings=settings)
    with pytest.raises(NativeArtifactMissing, match=r"'libnvidia-ml\.so\.1' not built"):
        await sim.stage(host, make_state())
    assert not sim.readiness.ready
    assert "not built" in sim.readiness.reason
    # Nothing was half-staged: the failure is found before any write.
    assert snapshot(node_root) == {}
    await sim.discard(host)
    assert snapshot(node_root) == {}


async def test_without_the_built_cuda_stub_the_rest_is_staged_and_not_ready(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    # NVML clients need no libcuda: a missing stub is a readiness reason, not
    # a stage failure; once built, the next pass stages it.
    stub = native / "libcuda.so.1"
    stub.unlink()
    sim = GpuDriverSimulator(settings=settings, can_mount=False)
    await sim.stage(host, make_state())
    await sim.apply(host, make_state())
    lib = "var/lib/nvml-mock/driver/usr/lib64"
    assert node_paths(node_root) == expected_tree() - {
        f"{lib}/libcuda.so.{DRIVER}", f"{lib}/libcuda.so.1", f"{lib}/libcuda.so"
    } | {"run", "run/nvidia", "run/nvidia/driver"}
    assert not sim.readiness.ready
    assert re.fullmatch(r"CUDA stub not staged: native artifact 'libcuda\.so\.1' not built.*",
                        sim.readiness.reason)
    stub.write_bytes(CUDA_BYTES)
    await sim.stage(host, make_state())
    assert (node_root / lib / "libcuda.so").read_bytes() == CUDA_BYTES
    assert sim.readiness.ready, sim.readiness.reason
    await teardown(sim, host)
    assert snapshot(node_root) == {}


async def test_existing_files_on_a_used_node_are_restored_byte_for_byte(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    # A node where an older mock left a version file and /run already exists.
    proc = node_root / "var/lib/nvml-mock/driver/proc/driver/nvidia"
    proc.mkdir(parents=True)
    (proc / "version").write_text("NVRM version: left by someone else\n")
    os.chmod(proc / "version", 0o600)
    (node_root / "run").mkdir()
    before = snapshot(node_root)
    sim = GpuDriverSimulator(settings=settings)
    await sim.stage(host, make_state(2))
    await sim.apply(host, make_state(2))
    assert (proc / "version").read_text().startswith("NVRM version: NVIDIA UNIX")
    await teardown(sim, host)
    assert snapshot(node_root) == before


async def test_a_fresh_process_can_discard_and_revoke(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    sim = GpuDriverSimulator(settings=settings)
    await sim.stage(host, make_state())
    await sim.apply(host, make_state())
    # A new daemon process after a crash: no memory of what was staged.
    fresh_host = Host(node_root)
    await teardown(GpuDriverSimulator(settings=settings), fresh_host)
    assert snapshot(node_root) == {}


# --------------------------------------------------------------------------
# nvidia-smi choice and readiness
# --------------------------------------------------------------------------


async def test_the_images_real_nvidia_smi_is_preferred(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    real = real_nvidia_smi()
    sim = GpuDriverSimulator(settings=attrs.evolve(settings, nvidia_smi_binary=real))
    await sim.stage(host, make_state(1))
    staged = node_root / "var/lib/nvml-mock/driver/usr/bin/nvidia-smi"
    assert staged.read_bytes() == real.read_bytes()
    assert staged.read_bytes()[:4] == b"\x7fELF"
    assert stat.S_IMODE(staged.stat().st_mode) == 0o755
    await sim.apply(host, make_state(1))
    assert sim.readiness.ready
    assert f"real nvidia-smi from --nvidia-smi-binary {real}" in sim.readiness.reason
    await teardown(sim, host)
    assert snapshot(node_root) == {}


async def test_an_installed_real_nvidia_smi_beats_the_fallback(
    host: Host,
    node_root: Path,
    native: Path,
    settings: GpuDriverSettings,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A local run on a machine with Debian's nvidia-smi stages NVIDIA's binary.

    Debian's /usr/bin/nvidia-smi is an alternatives link to the ELF; the
    link here points at the real 535 binary the same way.
    """
    real = real_nvidia_smi()
    installed = tmp_path / "usr" / "bin" / "nvidia-smi"
    installed.parent.mkdir(parents=True)
    installed.symlink_to(real)
    assert not settings.nvidia_smi_binary.exists()
    sim = GpuDriverSimulator(settings=attrs.evolve(settings, installed_nvidia_smi=installed))
    with caplog.at_level(logging.INFO, logger="mokka"):
        await sim.stage(host, make_state(1))
    staged = node_root / "var/lib/nvml-mock/driver/usr/bin/nvidia-smi"
    assert staged.read_bytes() == real.read_bytes()
    assert not staged.is_symlink()
    await sim.apply(host, make_state(1))
    said = f"real nvidia-smi installed at {installed} ({settings.nvidia_smi_binary} is absent)"
    assert sim.readiness.ready
    assert said in sim.readiness.reason
    # The stage's log line (INFO on the first pass: it changed the node) says it too.
    assert [r for r in caplog.records if said in r.getMessage()]
    await teardown(sim, host)
    assert snapshot(node_root) == {}


@pytest.mark.parametrize(
    "content",
    [b'#!/bin/sh\nexec /usr/lib/nvidia/current/nvidia-smi "$@"\n', SMI_BYTES],
    ids=["wrapper-script", "the-fallback-itself"],
)
async def test_an_installed_nvidia_smi_that_is_not_nvidias_is_passed_over(
    host: Host,
    node_root: Path,
    native: Path,
    settings: GpuDriverSettings,
    tmp_path: Path,
    content: bytes,
) -> None:
    installed = tmp_path / "usr" / "bin" / "nvidia-smi"
    installed.parent.mkdir(parents=True)
    installed.write_bytes(content)
    sim = GpuDriverSimulator(settings=attrs.evolve(settings, installed_nvidia_smi=installed))
    await sim.stage(host, make_state(1))
    await sim.apply(host, make_state(1))
    staged = node_root / "var/lib/nvml-mock/driver/usr/bin/nvidia-smi"
    assert staged.read_bytes() == SMI_BYTES
    assert f"fallback nvidia-smi from {native / 'nvidia-smi'}" in sim.readiness.reason
    assert f"{installed} is not NVIDIA's nvidia-smi" in sim.readiness.reason
    await teardown(sim, host)
    assert snapshot(node_root) == {}


async def test_the_images_nvidia_smi_beats_an_installed_one(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings, tmp_path: Path
) -> None:
    image = tmp_path / "image-smi"
    image.write_bytes(b"\x7fELF the image's patched nvidia-smi\n")
    installed = tmp_path / "usr" / "bin" / "nvidia-smi"
    installed.parent.mkdir(parents=True)
    installed.symlink_to(real_nvidia_smi())
    sim = GpuDriverSimulator(
        settings=attrs.evolve(settings, nvidia_smi_binary=image, installed_nvidia_smi=installed)
    )
    await sim.stage(host, make_state(1))
    staged = node_root / "var/lib/nvml-mock/driver/usr/bin/nvidia-smi"
    assert staged.read_bytes() == image.read_bytes()
    await sim.discard(host)
    assert snapshot(node_root) == {}


async def test_without_any_nvidia_smi_stage_succeeds_but_is_not_ready(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    sim = GpuDriverSimulator(settings=settings)
    await sim.stage(host, make_state(2))
    await sim.apply(host, make_state(2))
    assert sim.readiness.ready
    (native / "nvidia-smi").unlink()
    await sim.stage(host, make_state(2))
    assert not host.exists(f"{layout.DRIVER_BIN}/nvidia-smi")
    published = {"run", "run/nvidia", "run/nvidia/driver"}
    assert node_paths(node_root) == expected_tree(range(2), smi=False) | published
    assert not sim.readiness.ready
    assert sim.readiness.reason.startswith("no nvidia-smi available")
    await teardown(sim, host)
    assert snapshot(node_root) == {}


async def test_readiness_follows_stage_apply_and_revoke(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    sim = GpuDriverSimulator(settings=settings)
    assert sim.readiness.reason == "driver tree not staged"
    await sim.stage(host, make_state())
    assert not sim.readiness.ready
    assert sim.readiness.reason == "driver tree not published at /run/nvidia/driver"
    await sim.apply(host, make_state())
    assert sim.readiness.ready
    assert "driver 580.105.08, 8 GPU(s), fallback nvidia-smi from " in sim.readiness.reason
    assert f"{settings.installed_nvidia_smi} does not exist), symlink" in sim.readiness.reason
    await sim.revoke(host)
    assert not sim.readiness.ready
    await sim.discard(host)
    assert sim.readiness.reason == "driver tree not staged"
    assert snapshot(node_root) == {}


async def test_without_cap_mknod_devices_are_placeholders_and_not_ready(
    host: Host, node_root: Path, native: Path, tmp_path: Path
) -> None:
    require_tool("setpriv")
    state = make_state(1)
    # Root without CAP_MKNOD in its bounding set loses it across exec.
    (stage,) = run_steps(
        node_root, state, tmp_path, ["stage"], prefix=["setpriv", "--bounding-set", "-mknod"]
    )
    ready, reason = stage["readiness"]
    assert not ready
    assert "no CAP_MKNOD" in reason
    assert "195:0" in reason
    node = node_root / "var/lib/nvml-mock/driver/dev/nvidia0"
    assert stat.S_ISREG(node.lstat().st_mode)
    # A process that may mknod replaces the placeholders with real nodes.
    sim = GpuDriverSimulator(settings=GpuDriverSettings(nvidia_smi_binary="/nonexistent"))
    await sim.stage(host, state)
    assert stat.S_ISCHR(node.lstat().st_mode)
    await sim.discard(host)
    assert snapshot(node_root) == {}


# --------------------------------------------------------------------------
# Plugin, flags, settings
# --------------------------------------------------------------------------


MODULE = "mokka.simulators.gpudriver"


def test_plugin_is_registered_and_builds_from_flags(tmp_path: Path) -> None:
    assert MODULE in registry.PLUGIN_MODULES
    # Loaded the way the registry loads it (by module name, attribute PLUGIN).
    assert importlib.import_module(MODULE).PLUGIN is PLUGIN
    parser = argparse.ArgumentParser()
    PLUGIN.add_arguments(parser)
    args = parser.parse_args(
        [
            "--uvm-major",
            "236",
            "--nvidia-caps-major",
            "239",
            "--nvidia-smi-binary",
            str(tmp_path / "smi"),
            "--driver-publish",
            "bind",
            "--installed-nvidia-smi",
            str(tmp_path / "installed"),
            "--idle-signature",
            "off",
        ]
    )
    sim = PLUGIN.build(args)
    assert isinstance(sim, Simulator)
    assert isinstance(sim, Applier)
    assert sim.name == "gpudriver"
    assert sim.settings == GpuDriverSettings(
        uvm_major=236,
        caps_major=239,
        nvidia_smi_binary=tmp_path / "smi",
        installed_nvidia_smi=tmp_path / "installed",
        publish="bind",
        idle_signature=False,
    )
    defaults = PLUGIN.build(parser.parse_args([])).settings
    assert defaults == GpuDriverSettings()
    assert defaults.nvidia_smi_binary == Path("/usr/local/lib/mokka/nvidia-smi")
    assert defaults.installed_nvidia_smi == Path("/usr/bin/nvidia-smi")
    assert (defaults.uvm_major, defaults.caps_major, defaults.publish) == (510, 236, "auto")
    assert defaults.idle_signature is True  # a running node looks alive by default


def test_invalid_settings_name_the_field_and_what_was_expected() -> None:
    with pytest.raises(SpecError, match=r"uvm_major: got 195, expected a character major in 1"):
        GpuDriverSettings(uvm_major=195)
    with pytest.raises(SpecError, match=r"caps_major: got 0, expected"):
        GpuDriverSettings(caps_major=0)
    with pytest.raises(SpecError, match=r"publish: got 'mount', expected one of auto, bind, sym"):
        GpuDriverSettings(publish="mount")
    with pytest.raises(SpecError, match=r"idle_signature: got 'on', expected true or false"):
        GpuDriverSettings(idle_signature="on")
    # nvidia-uvm-tools (uvm:1) and nvidia-cap1 (caps:1) would be one device.
    with pytest.raises(SpecError, match=r"uvm_major and caps_major: both 236, expected two dis"):
        GpuDriverSettings(uvm_major=236)


def test_version_banner_names_the_machine_architecture() -> None:
    assert render_version("580.173.02", "aarch64").splitlines()[0] == (
        "NVRM version: NVIDIA UNIX aarch64 Kernel Module  580.173.02  Thu Jan  1 00:00:00 UTC 2026"
    )
