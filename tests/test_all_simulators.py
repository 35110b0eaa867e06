"""Every registered simulator together, on every built-in profile.

The per-simulator suites prove each surface; this one proves the set: the
simulators the daemon really builds (from the daemon's own argument parser,
default flags) stage and apply a whole node under a root that sits inside a
sandbox, never write a byte outside that root, and teardown (revoke, then
discard) leaves the sandbox exactly as it was.  It also checks that nothing a
hostile profile says can point a write outside the root: the compiler
refuses such input before any simulator sees it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mokka import cli
from mokka.daemon.command import build_simulators
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.teardown import teardown
from mokka.errors import SpecError
from mokka.host import Host
from mokka.simulators.base import Daemon
from mokka.state.compile import compile_profile
from tests.support import snapshot

BUILT_IN = ("a100", "b200", "gb200", "gb300", "h100", "l40s", "t4")


def outside(tree: dict, root: Path) -> dict:
    """A sandbox snapshot without the node root's own subtree."""
    prefix = root.name
    return {k: v for k, v in tree.items() if k != prefix and not k.startswith(prefix + "/")}


@pytest.mark.parametrize("profile", BUILT_IN)
async def test_a_whole_node_stages_inside_its_root_and_tears_down_clean(
    tmp_path: Path, profile: str
) -> None:
    sandbox = tmp_path / "sandbox"
    root = sandbox / "node"
    root.mkdir(parents=True)
    # Neighbours a stray write would land on: beside the root and at paths
    # the simulators use on a real host.
    (sandbox / "var" / "lib").mkdir(parents=True)
    (sandbox / "etc").mkdir()
    (sandbox / "etc" / "keep").write_text("neighbour\n")
    before = snapshot(sandbox)

    args = cli.build_parser().parse_args(
        ["daemon", "--root", str(root), "--profile", profile, "--node-name", "worker-7"]
    )
    simulators = build_simulators(args)
    assert {s.name for s in simulators} >= {
        "gpudriver", "pcibus", "nvlink", "cri", "imex", "fabricmanager", "kernellog",
    }
    host = Host(root)
    state = compile_profile(profile, node_name="worker-7")

    result = await Reconciler(host, simulators, supervisor=None).reconcile_once(state)
    assert result.ok, result.summary()
    assert outside(snapshot(sandbox), root) == outside(before, root)
    # A staged node is visible: the driver tree, one device per GPU, the CDI spec.
    drv = root / "var/lib/nvml-mock/driver"
    assert sorted(p.name for p in (drv / "dev").glob("nvidia[0-9]*")) == sorted(
        f"nvidia{g.minor}" for g in state.gpus
    )
    assert (root / "var/run/cdi/nvidia.yaml").is_file()
    for sim in simulators:
        if not isinstance(sim, Daemon):  # daemons do not run in a single pass
            assert sim.readiness.ready, (sim.name, sim.readiness.reason)

    report = await teardown(host, simulators, timeout=30)
    assert report.clean, report.failures
    assert snapshot(sandbox) == before


HOSTILE = """\
version: "1.0"
system:
  driver_version: "580.105.08"
device_defaults:
  name: "NVIDIA H100 80GB HBM3"
  pci: {device_id: 0x233010DE, subsystem_id: 0x16C110DE}
devices:
  - index: 0
    pci: {bus_id: "0000:53:00.0/../../../../etc"}
  - index: 1
    minor_number: -1
    pci: {bus_id: "0000:64:00.0"}
nvlink:
  version: 4
  links_per_gpu: 18
  bandwidth_per_link_mbps: 26562
  switches:
    - {bdf: "../../etc/passwd", uuid: "NVSwitch-0"}
pcie_topology:
  root_complexes:
    - id: "pci0000:00/../../../tmp"
      numa_node: 0
      devices: ["0000:64:00.0"]
"""


def test_a_hostile_profile_cannot_name_a_path_outside_the_root(tmp_path: Path) -> None:
    """Every field that becomes part of a path is validated; all problems come at once."""
    path = tmp_path / "hostile.yaml"
    path.write_text(HOSTILE)
    with pytest.raises(SpecError) as info:
        compile_profile(path, node_name="worker-7")
    text = str(info.value)
    for field in (
        "devices[0].pci.bus_id",
        "devices[1].minor_number",
        "nvlink.switches[0].bdf",
        "pcie_topology.root_complexes[0].id",
    ):
        assert field in text, (field, text)
    # each problem names the file first
    assert all(p.startswith(f"{path}: ") for p in info.value.problems), info.value.problems
