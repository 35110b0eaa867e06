"""The published CDI specs in a real CDI consumer: podman (Debian 4.3) with runc.

``tests.podman_support`` explains how podman runs here (a throwaway mount
namespace showing the staged node at its host paths) and builds the image.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import attrs
import pytest

from mokka import native
from mokka.errors import ApplyError, NativeArtifactMissing
from mokka.noderoot.host import Host
from mokka.simulators.cri import CriSimulator
from mokka.simulators.fabricmanager import FabricManagerSimulator
from mokka.simulators.gpudriver import GpuDriverSettings, GpuDriverSimulator
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.cri_support import fake_settings
from tests.podman_support import IMAGE, Podman, podman_fixture  # noqa: F401 (the fixture)
from tests.support import ROOT, real_nvidia_smi, snapshot


def h100() -> State:
    return compile_profile("h100", node_name="node-a")


@pytest.fixture
def stand_in_native(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A native build holding a stand-in library (the device checks need no NVML)."""
    directory = tmp_path / "native"
    directory.mkdir()
    (directory / native.NVML_LIBRARY).write_bytes(b"\x7fELF stand-in for the mock NVML library\n")
    (directory / native.FALLBACK_NVIDIA_SMI).write_bytes(b"#!/bin/sh\n")
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(directory))
    return directory


@attrs.frozen
class Node:
    """The simulators whose files the specs name, staged; cri built but not applied."""

    driver: GpuDriverSimulator
    fabric: FabricManagerSimulator
    cri: CriSimulator


async def stage_node(host: Host, state: State) -> Node:
    """gpudriver (real nvidia-smi) and the fabric manager stage; cri stages."""
    node = Node(
        driver=GpuDriverSimulator(
            settings=GpuDriverSettings(nvidia_smi_binary=real_nvidia_smi(), publish="symlink")
        ),
        fabric=FabricManagerSimulator(),
        # Runtime setup off; host commands point at the stand-ins, never the machine's.
        cri=CriSimulator(fake_settings(container_runtime=False)),
    )
    await node.driver.stage(host, state)
    await node.fabric.stage(host, state)
    await node.cri.stage(host, state)
    return node


async def teardown(host: Host, node: Node) -> None:
    await node.cri.revoke(host)
    for simulator in (node.cri, node.fabric, node.driver):
        await simulator.discard(host)


def device_numbers(listing: str) -> dict[str, tuple[int, int]]:
    """``ls -ln`` lines of character devices: name -> (major, minor)."""
    numbers = {}
    for line in listing.splitlines():
        fields = line.split()
        if line.startswith("c") and len(fields) >= 10:
            numbers[fields[-1]] = (int(fields[4].rstrip(",")), int(fields[5]))
    return numbers


def nvidia_nodes(listing: str) -> list[str]:
    return sorted(name for name in listing.split() if name.startswith("nvidia"))


async def test_container_gets_exactly_the_requested_gpu(
    podman: Podman, host: Host, node_root: Path, stand_in_native: Path
) -> None:
    before = snapshot(node_root)
    state = h100()
    node = await stage_node(host, state)
    await node.cri.apply(host, state)
    minor = state.gpu(1).minor
    controls = ["nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]

    result = podman.container("nvidia.com/gpu=1", "ls /dev", node_root)
    assert result.returncode == 0, result.stderr
    assert nvidia_nodes(result.stdout) == sorted([f"nvidia{minor}", *controls])

    # Each node inside the container is a character device with the staged
    # node's numbers (a name alone would pass with a regular file).
    result = podman.container("nvidia.com/gpu=1", "ls -ln /dev", node_root)
    assert result.returncode == 0, result.stderr
    inside = device_numbers(result.stdout)
    assert inside[f"nvidia{minor}"] == (195, minor)
    assert inside["nvidiactl"] == (195, 255)
    dev_dir = node_root / "var/lib/nvml-mock/driver/dev"
    for name in [f"nvidia{minor}", *controls]:
        staged = os.stat(dev_dir / name)
        assert stat.S_ISCHR(staged.st_mode), f"{name} was staged as a placeholder"
        assert inside[name] == (os.major(staged.st_rdev), os.minor(staged.st_rdev)), name

    # The UUID entry names the same GPU.
    result = podman.container(f"nvidia.com/gpu={state.gpu(1).uuid}", "ls /dev", node_root)
    assert result.returncode == 0, result.stderr
    assert nvidia_nodes(result.stdout) == sorted([f"nvidia{minor}", *controls])

    result = podman.container("nvidia.com/gpu=all", "ls /dev", node_root)
    assert result.returncode == 0, result.stderr
    every = [f"nvidia{g.minor}" for g in state.gpus]
    assert nvidia_nodes(result.stdout) == sorted([*every, *controls])

    # The NRI plugin's kind carries device nodes only: no library, no env.
    result = podman.container(
        "mokka.nvidia.com/gpu=1", "ls /dev; ls /usr/lib64; echo env=$MOCK_NVML_CONFIG", node_root
    )
    assert result.returncode == 0, result.stderr
    assert nvidia_nodes(result.stdout) == sorted([f"nvidia{minor}", *controls])
    assert "libnvidia-ml.so.1" not in result.stdout
    assert "env=\n" in result.stdout

    # Mounts and env of the full kind: the engine config is where the env says.
    result = podman.container(
        "nvidia.com/gpu=0",
        'cat "$MOCK_NVML_CONFIG" > /dev/null && echo config-ok; ls /usr/lib64 /usr/bin; '
        "ls -d /var/lib/nvml-mock/fabric-state",
        node_root,
    )
    assert result.returncode == 0, result.stderr
    assert "config-ok" in result.stdout
    assert "libnvidia-ml.so.1" in result.stdout
    assert "nvidia-smi" in result.stdout
    assert "/var/lib/nvml-mock/fabric-state" in result.stdout

    await teardown(host, node)
    assert snapshot(node_root) == before
    # Revoked: podman no longer knows the kind.
    result = podman.container("nvidia.com/gpu=1", "true", node_root)
    assert result.returncode != 0
    assert "unresolvable CDI devices nvidia.com/gpu=1" in result.stderr


async def test_spec_for_a_missing_device_node_is_never_published(
    podman: Podman, host: Host, node_root: Path, stand_in_native: Path
) -> None:
    before = snapshot(node_root)
    state = h100()
    node = await stage_node(host, state)
    os.unlink(node_root / f"var/lib/nvml-mock/driver/dev/nvidia{state.gpu(1).minor}")
    with pytest.raises(ApplyError, match=r"nvidia1 does not exist"):
        await node.cri.apply(host, state)
    assert not (node_root / "var/run/cdi").exists()
    result = podman.container("nvidia.com/gpu=0", "true", node_root)
    assert result.returncode != 0
    assert "unresolvable CDI devices nvidia.com/gpu=0" in result.stderr

    await teardown(host, node)
    assert snapshot(node_root) == before


async def test_nvidia_smi_in_the_container_lists_only_its_gpu(
    podman: Podman, host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real nvidia-smi 535 with the mock NVML library, both injected by the spec."""
    try:
        native.artifact(native.NVML_LIBRARY)
    except NativeArtifactMissing as exc:
        pytest.fail(f"{exc}; build it with: .venv/bin/python native/build.py {ROOT}/mokka/_native")
    before = snapshot(node_root)
    state = h100()
    node = await stage_node(host, state)
    await node.cri.apply(host, state)

    result = podman.container("nvidia.com/gpu=1", "nvidia-smi -L", node_root)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    assert state.gpu(1).uuid in lines[0]

    result = podman.container("nvidia.com/gpu=all", "nvidia-smi -L", node_root)
    assert result.returncode == 0, result.stdout + result.stderr
    listed = result.stdout.strip().splitlines()
    assert len(listed) == len(state.gpus)
    for gpu, line in zip(state.gpus, listed, strict=True):
        assert gpu.uuid in line

    await teardown(host, node)
    assert snapshot(node_root) == before
