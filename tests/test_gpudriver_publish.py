"""The gpudriver simulator's Apply: the driver tree published at /run/nvidia/driver
as a relative symlink, and as a real bind mount inside an unshared mount
namespace (we run as root; CI does too), and revoked again, also by a fresh
process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from mokka import native as native_build
from mokka.errors import ApplyError
from mokka.noderoot.host import Host
from mokka.simulators.gpudriver import GpuDriverSettings, GpuDriverSimulator
from mokka.simulators.gpudriver import publish as publishing
from tests.gpudriver_support import (
    DRIVER,
    LIB_BYTES,
    SMI_BYTES,
    UNSHARE,
    make_state,
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


async def test_bind_publish_in_a_mount_namespace_and_revoke_from_a_fresh_process(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings, tmp_path: Path
) -> None:
    require_tool("unshare")
    require_tool("findmnt")
    state = make_state(2)
    sim = GpuDriverSimulator(settings=settings)
    await sim.stage(host, state)
    staged = snapshot(node_root)
    apply1, apply2, revoke = run_steps(
        node_root, state, tmp_path, ["apply-bind", "apply-bind", "revoke"], prefix=UNSHARE
    )
    target = str(node_root / "run/nvidia/driver")
    source = str(node_root / "var/lib/nvml-mock/driver")
    assert apply1["calls"] == [["mount", "--bind", source, target]]
    assert apply1["mounted"]
    assert not apply1["islink"]
    assert apply1["findmnt"] == [{"target": target}]
    assert apply1["version"].startswith("NVRM version: NVIDIA UNIX")
    assert apply2["calls"] == []  # already mounted: nothing to do
    assert revoke["calls"] == [["umount", target]]
    assert not revoke["mounted"]
    assert revoke["findmnt"] == []
    assert revoke["version"] is None
    assert snapshot(node_root) == staged  # the mountpoint is gone with the revoke
    await sim.discard(host)
    assert snapshot(node_root) == {}


async def test_a_busy_bind_mount_is_detached_lazily(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings, tmp_path: Path
) -> None:
    require_tool("unshare")
    state = make_state(1)
    sim = GpuDriverSimulator(settings=settings)
    await sim.stage(host, state)
    _, revoke = run_steps(node_root, state, tmp_path, ["apply-bind", "revoke-busy"], prefix=UNSHARE)
    target = str(node_root / "run/nvidia/driver")
    assert revoke["calls"] == [["umount", target], ["umount", "--lazy", target]]
    assert revoke["held"].startswith("NVRM version")  # the open file kept working
    assert not revoke["mounted"]
    await sim.discard(host)
    assert snapshot(node_root) == {}


async def test_switching_from_bind_to_symlink_unmounts_first(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings, tmp_path: Path
) -> None:
    require_tool("unshare")
    state = make_state(1)
    sim = GpuDriverSimulator(settings=settings)
    await sim.stage(host, state)
    _, to_symlink, revoke = run_steps(
        node_root, state, tmp_path, ["apply-bind", "apply-symlink", "revoke"], prefix=UNSHARE
    )
    target = str(node_root / "run/nvidia/driver")
    assert to_symlink["calls"] == [["umount", target]]
    assert to_symlink["islink"]
    assert not to_symlink["mounted"]
    assert to_symlink["version"].startswith("NVRM version")  # served through the link
    assert revoke["calls"] == []
    assert not revoke["islink"]
    await sim.discard(host)
    assert snapshot(node_root) == {}


async def test_symlink_publish_is_relative_and_resolves_to_the_driver_root(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    sim = GpuDriverSimulator(settings=settings)
    await sim.stage(host, make_state())
    await sim.apply(host, make_state())
    link = node_root / "run/nvidia/driver"
    assert os.readlink(link) == "../../var/lib/nvml-mock/driver"
    assert link.resolve() == (node_root / "var/lib/nvml-mock/driver").resolve()
    # What the GPU Operator validator runs: the library and nvidia-smi through the link.
    assert (link / "usr/lib64/libnvidia-ml.so.1").read_bytes() == LIB_BYTES
    assert (link / "usr/bin/nvidia-smi").read_bytes() == SMI_BYTES
    first = os.lstat(link).st_ino
    await sim.apply(host, make_state())
    assert os.lstat(link).st_ino == first  # unchanged: not replaced again
    await teardown(sim, host)
    assert snapshot(node_root) == {}


async def test_publish_refuses_a_run_nvidia_driver_it_did_not_create(
    host: Host, node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    (node_root / "run/nvidia/driver").mkdir(parents=True)
    before = snapshot(node_root)
    sim = GpuDriverSimulator(settings=settings)
    await sim.stage(host, make_state(1))
    with pytest.raises(ApplyError, match=r"run/nvidia/driver exists and was not created by Mokka"):
        await sim.apply(host, make_state(1))
    assert not sim.readiness.ready
    assert sim.readiness.reason.startswith("publishing /run/nvidia/driver failed: ")
    assert sim.readiness.reason.endswith("refusing to publish over it")
    await teardown(sim, host)
    assert snapshot(node_root) == before


async def test_apply_before_stage_fails_clearly(
    host: Host, node_root: Path, settings: GpuDriverSettings
) -> None:
    sim = GpuDriverSimulator(settings=settings)
    with pytest.raises(ApplyError, match=r"driver does not exist: nothing staged to publish"):
        await sim.apply(host, make_state(1))
    assert snapshot(node_root) == {}


@attrs.define
class FailingMount:
    calls: list[list[str]] = attrs.Factory(list)

    def run(self, argv, **kwargs):
        self.calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 32, "", "mount: permission denied")


async def test_a_failing_mount_is_an_apply_error_naming_the_command(
    node_root: Path, native: Path, settings: GpuDriverSettings
) -> None:
    runner = FailingMount()
    host = Host(node_root, runner=runner)
    sim = GpuDriverSimulator(settings=attrs.evolve(settings, publish="bind"))
    await sim.stage(host, make_state(1))
    with pytest.raises(ApplyError, match=r"mount --bind .* failed \(exit 32\): mount: permission"):
        await sim.apply(host, make_state(1))
    assert runner.calls[0][:2] == ["mount", "--bind"]
    await teardown(sim, host)
    assert snapshot(node_root) == {}


def test_auto_publish_binds_only_on_a_real_host_root_with_cap_sys_admin(tmp_path: Path) -> None:
    assert publishing.resolve_mode("auto", Path("/host"), True) == "bind"
    assert publishing.resolve_mode("auto", Path("/"), True) == "bind"
    assert publishing.resolve_mode("auto", Path("/host"), False) == "symlink"
    assert publishing.resolve_mode("auto", tmp_path, True) == "symlink"
    assert publishing.resolve_mode("bind", tmp_path, False) == "bind"
    assert publishing.resolve_mode("symlink", Path("/host"), True) == "symlink"
    sim = GpuDriverSimulator(settings=GpuDriverSettings(), can_mount=True)
    assert sim.publish_mode(Host(tmp_path)) == "symlink"
    assert sim.publish_mode(Host("/host")) == "bind"


def test_cap_sys_admin_is_read_from_the_effective_set(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t0000000000200000\n")  # bit 21 only
    assert publishing.has_cap_sys_admin(status)
    status.write_text("Name:\tx\nCapEff:\t00000000001fffff\n")  # bits 0..20
    assert not publishing.has_cap_sys_admin(status)


def test_mountinfo_escapes_are_decoded(tmp_path: Path) -> None:
    where = tmp_path / "with space"
    where.mkdir()
    mountinfo = tmp_path / "mountinfo"
    escaped = str(where).replace(" ", "\\040")
    mountinfo.write_text(f"36 35 98:0 /src {escaped} rw,noatime master:1 - ext3 /dev/root rw\n")
    assert publishing.is_mountpoint(where, mountinfo)
    assert not publishing.is_mountpoint(tmp_path, mountinfo)




async def test_the_gpu_operator_validator_command_runs_through_the_published_tree(
    host: Host, node_root: Path, tmp_path: Path
) -> None:
    # The real built mock library and the real nvidia-smi 535, run the way the
    # GPU Operator validator runs them: LD_LIBRARY_PATH=/run/nvidia/driver/usr/lib64
    # /run/nvidia/driver/usr/bin/nvidia-smi.  pynvml (NVIDIA's own bindings)
    # loads the same library by SONAME.
    library = native_build.artifact(native_build.NVML_LIBRARY)  # fails clearly when not built
    smi = real_nvidia_smi()
    sim = GpuDriverSimulator(
        settings=GpuDriverSettings(nvidia_smi_binary=smi, publish="symlink")
    )
    published = node_root / "run/nvidia/driver"
    env = dict(os.environ, LD_LIBRARY_PATH=str(published / "usr/lib64"))

    async def run(*argv: str) -> list[str]:
        with trio.fail_after(60):  # a bound, not a timing assertion
            result = await trio.run_process(
                list(argv), env=env, capture_stdout=True, capture_stderr=True, check=False
            )
        output = result.stdout.decode() + result.stderr.decode()
        assert result.returncode == 0, output
        return result.stdout.decode().splitlines()

    smi_path = str(published / "usr/bin/nvidia-smi")

    for gpus in (8, 4):  # the shrunken node must show only what is staged
        state = make_state(gpus)
        await sim.stage(host, state)
        await sim.apply(host, state)
        assert sim.readiness.ready, sim.readiness.reason
        listed = await run(smi_path, "-L")
        assert listed == [f"GPU {g.index}: {g.name} (UUID: {g.uuid})" for g in state.gpus]
        rows = await run(smi_path, "--query-gpu=driver_version,pci.bus_id", "--format=csv,noheader")
        assert rows == [f"{DRIVER}, {g.nvml_bus_id}" for g in state.gpus]
    assert (published / "usr/lib64/libnvidia-ml.so.1").read_bytes() == library.read_bytes()

    probe = (
        "import pynvml; pynvml.nvmlInit(); "
        "print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlSystemGetDriverVersion()); "
        "pynvml.nvmlShutdown()"
    )
    assert " ".join(await run(sys.executable, "-c", probe)).split() == ["4", DRIVER]

    await sim.revoke(host)
    await sim.discard(host)
    assert snapshot(node_root) == {}
