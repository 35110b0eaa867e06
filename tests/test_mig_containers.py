"""MIG devices as the real container stack sees them: the real ``nvidia-ctk cdi
generate`` (toolkit v1.20.2) lists a node's MIG devices with their capability
nodes, and a container given one MIG device by Mokka's CDI spec runs the real
``nvidia-smi`` 535 and sees its GPU with exactly that MIG device.

One node for the module: an h100 whose GPUs 0 and 1 boot with a declared
layout (a 3g.40gb and two 2g.20gb instances each, docs/mig.md), staged by the
simulators without a daemon, as ``tests/test_cri_podman.py`` stages one; the
library and ``nvidia-smi`` in it are the session's build of the tree.  podman
runs as ``tests.podman_support`` explains; the toolkit runs in a private mount
namespace with the driver root's ``proc/driver`` bound over ``/proc/driver``,
where it reads ``mig-minors`` and the capability files.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trio
import yaml

from mokka import layout
from mokka.noderoot.host import Host
from mokka.simulators.gpudriver import mig_caps
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.gpudriver_support import toolkit_binary
from tests.podman_support import Podman, podman_fixture  # noqa: F401 (the fixture)
from tests.support import require_tool, snapshot
from tests.test_cri_podman import stage_node, teardown
from tests.test_mig_devices import _declaring_profile

pytestmark = pytest.mark.timeout(120)

#: GPUs 0 and 1's layout: NVML orders the 3g instance (id 2, at 4) first,
#: then the 2g ones (ids 3 and 4, at 0 and 2).
LAYOUT = ["3g.40gb", "2x2g.20gb"]
MIG_GPUS = 2


@attrs.frozen
class MigNode:
    root: Path
    state: State

    @property
    def driver_root(self) -> Path:
        return self.root / layout.DRIVER_ROOT.lstrip("/")

    def mig_devices(self, gpu: int) -> list[mig_caps.MigDevice]:
        return mig_caps.mig_devices(self.state.gpu(gpu))


@pytest.fixture(scope="module")
def mig_node(
    tmp_path_factory: pytest.TempPathFactory, native: Path
) -> Iterator[MigNode]:
    """The staged node (driver root, fabric manager, CDI specs), torn down after
    the module, leaving its root as it was found."""
    base = tmp_path_factory.mktemp("mig-node")
    root = base / "node"
    root.mkdir()
    host = Host(root)
    state = compile_profile(_declaring_profile(base, LAYOUT, gpus=MIG_GPUS), node_name="node-a")
    before = snapshot(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MOKKA_NATIVE_DIR", str(native))

        async def stage():
            with trio.fail_after(60):
                node = await stage_node(host, state)
                await node.cri.apply(host, state)
                return node

        staged = trio.run(stage)
        try:
            yield MigNode(root, state)
        finally:
            async def remove() -> None:
                with trio.fail_after(60):
                    await teardown(host, staged)

            trio.run(remove)
    assert snapshot(root) == before


def test_the_node_holds_the_declared_mig_devices(mig_node: MigNode) -> None:
    """What the checks below rely on: each declared instance has its two
    capability nodes in the driver root."""
    for gpu in range(MIG_GPUS):
        devices = mig_node.mig_devices(gpu)
        assert [(d.gi, d.ci) for d in devices] == [(2, 0), (3, 0), (4, 0)]
        for device in devices:
            for cap in (device.gi_cap, device.ci_cap):
                node = mig_node.driver_root / f"dev/nvidia-caps/nvidia-cap{cap.minor}"
                assert node.exists(), node
    assert mig_node.mig_devices(MIG_GPUS) == []


def _generate(node: MigNode, output: Path) -> subprocess.CompletedProcess[str]:
    """The real ``nvidia-ctk cdi generate`` on the node's driver root, in a private
    mount namespace where the driver root's ``proc/driver`` is ``/proc/driver``."""
    ctk = [str(toolkit_binary("nvidia-ctk")), "cdi", "generate",
           "--driver-root", str(node.driver_root),
           "--nvidia-cdi-hook-path", str(toolkit_binary("nvidia-cdi-hook")),
           "--output", str(output)]
    script = (f"mount --bind {shlex.quote(str(node.driver_root / 'proc/driver'))} /proc/driver"
              f" && exec {shlex.join(ctk)}")
    return subprocess.run(
        [require_tool("unshare"), "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True, text=True, timeout=60, check=False,
    )


def test_nvidia_ctk_cdi_generate_lists_the_mig_devices(mig_node: MigNode, tmp_path: Path) -> None:
    """``<gpu>:<mig>`` and ``MIG-`` entries for every MIG device, each with its
    GPU's node and its GPU and compute instances' capability nodes, as
    Mokka's own spec lists them."""
    output = tmp_path / "nvidia.yaml"
    result = _generate(mig_node, output)
    assert result.returncode == 0, result.stderr
    spec = yaml.safe_load(output.read_text())
    listed = {d["name"]: sorted(n["path"] for n in d["containerEdits"]["deviceNodes"])
              for d in spec["devices"]}
    expected = {}
    for gpu in range(MIG_GPUS):
        for index, device in enumerate(mig_node.mig_devices(gpu)):
            nodes = sorted([f"/dev/nvidia{mig_node.state.gpu(gpu).minor}",
                            f"/dev/nvidia-caps/nvidia-cap{device.gi_cap.minor}",
                            f"/dev/nvidia-caps/nvidia-cap{device.ci_cap.minor}"])
            expected[f"{gpu}:{index}"] = expected[device.uuid] = nodes
    assert {name: nodes for name, nodes in listed.items() if name in expected} == expected
    # A GPU in MIG mode is listed by its MIG devices only; the others whole.
    assert not {"0", "1", mig_node.state.gpu(0).uuid} & set(listed)
    assert {"2", "7", mig_node.state.gpu(7).uuid} <= set(listed)
    # Mokka's own spec names the same devices with the same nodes.
    own = yaml.safe_load((mig_node.root / layout.CDI_DIR.lstrip("/") / "nvidia.yaml").read_text())
    own_nodes = {d["name"]: sorted(n["path"] for n in d["containerEdits"]["deviceNodes"])
                 for d in own["devices"]}
    assert {name: own_nodes.get(name) for name in expected} == expected


#: ``nvidia-smi -L``'s lines: a GPU, and a MIG device under it.
GPU_LINE = re.compile(r"^GPU (\d+): .* \(UUID: (GPU-[0-9a-f-]+)\)$")
MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9a-f-]+)\)$")


@pytest.mark.parametrize("by", ["index", "uuid"])
def test_a_container_given_one_mig_device_sees_exactly_it(
    mig_node: MigNode, podman: Podman, by: str
) -> None:
    """``--device nvidia.com/gpu=1:2`` (or its ``MIG-`` UUID): GPU 1 alone, with
    the third MIG device alone, numbered 0, as in a container on a real MIG
    node; its nodes are the GPU's and that device's two capability nodes."""
    device = mig_node.mig_devices(1)[2]
    name = "1:2" if by == "index" else device.uuid
    result = podman.container(f"nvidia.com/gpu={name}",
                              "ls /dev/nvidia-caps; nvidia-smi -L", mig_node.root)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert sorted(lines[:2]) == sorted(
        [f"nvidia-cap{device.gi_cap.minor}", f"nvidia-cap{device.ci_cap.minor}"]), result.stdout
    gpu_line, mig_line, *rest = lines[2:]
    assert rest == [], result.stdout
    gpu = GPU_LINE.match(gpu_line)
    assert gpu is not None, gpu_line
    assert gpu.groups() == ("0", mig_node.state.gpu(1).uuid), gpu_line
    mig = MIG_LINE.match(mig_line)
    assert mig is not None, mig_line
    assert mig.groups() == ("2g.20gb", "0", device.uuid), mig_line
