"""Every registered simulator together, on every built-in profile.

The per-simulator suites prove each surface; this one proves the set: the
simulators the daemon really builds (from the daemon's own argument parser,
default flags) stage and apply a whole node under a root that sits inside a
sandbox, never write a byte outside that root, and teardown (revoke, then
discard) leaves the sandbox exactly as it was.  It also checks that nothing a
hostile profile says can point a write outside the root: the compiler
refuses such input before any simulator sees it.  Two more properties of the
set: no simulator does filesystem work on the event loop, and 64 GPUs (the
mock library's limit) stage on every surface.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import yaml

import mokka
from mokka import cli
from mokka.daemon.command import build_simulators
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.supervisor import Supervisor
from mokka.daemon.teardown import teardown
from mokka.errors import SpecError
from mokka.noderoot.host import Host
from mokka.simulators.base import Daemon
from mokka.state.compile import compile_profile
from mokka.state.profile import read_profile_text
from tests.support import snapshot, wait_for_count

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


# --------------------------------------------------------------------------
# No filesystem work on the event loop
# --------------------------------------------------------------------------

#: Audit events of filesystem calls (``sys.audit``), plus the ``os`` calls
#: that raise none and are therefore spied on directly.
FS_EVENTS = frozenset({
    "open", "os.listdir", "os.scandir", "os.mkdir", "os.rename", "os.remove", "os.rmdir",
    "os.symlink", "os.chmod", "os.truncate", "os.mknod", "shutil.copyfile", "subprocess.Popen",
})
#: Mokka's own code, by the package's location (a path substring such as
#: "/mokka/" would also match a checkout that sits under a folder so named).
PACKAGE_DIR = str(Path(mokka.__file__).parent) + os.sep
SPIED = ("stat", "lstat", "readlink", "access")
#: While a test watches: the event loop's thread and what it was caught doing.
_watch: dict[str, object] = {}


def _watching() -> bool:
    return bool(_watch.get("on")) and threading.get_ident() == _watch["thread"]


def _audit(event: str, args: tuple) -> None:
    # Installed once per process (audit hooks cannot be removed): cheap
    # when nobody watches.
    if event in FS_EVENTS and _watching():
        _record(event, args)


def _record(event: str, args: tuple) -> None:
    frame, where = sys._getframe(2), []
    while frame is not None and len(where) < 4:
        if frame.f_code.co_filename.startswith(PACKAGE_DIR):
            where.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}")
        frame = frame.f_back
    if where:  # Mokka's own code, not the test's or the event loop's
        _watch["hits"].add((event, str(args[0] if args else ""), " < ".join(where)))


_hooked: list[bool] = []


@pytest.fixture
def fs_on_event_loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[set]:
    """The filesystem calls Mokka makes on the event loop's thread once ``_watch["on"]``.

    Not from the start: building the simulators from flags happens before
    the daemon's event loop runs.
    """
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked.append(True)
    for name in SPIED:
        real = getattr(os, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            if _watching():
                _record(f"os.{_name}", args)
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, spy)
    hits: set = set()
    _watch.update(thread=threading.get_ident(), hits=hits, on=False)
    try:
        yield hits
    finally:
        _watch.clear()


@pytest.mark.parametrize(
    ("profile", "flags"),
    [
        ("h100", ["--ib-mode", "full"]),
        ("gb200", ["--imex", "on", "--ib-mode", "sysfs"]),
        ("t4", []),
    ],
)
async def test_no_simulator_touches_the_filesystem_on_the_event_loop(
    tmp_path: Path, profile: str, flags: list[str], fs_on_event_loop: set
) -> None:
    """Stage, daemons, apply, readiness and teardown do their file work in threads.

    A blocking call on the event loop stalls every other simulator, the
    health server and the signal handler; on a slow or hung filesystem (NFS,
    a busy disk) it stalls them for as long as the call takes.
    """
    root = tmp_path / "node"
    root.mkdir()
    tools = tmp_path / "ib-tools"  # an image bundle, so its directory is read too
    for sub in ("bin", "lib"):
        (tools / sub).mkdir(parents=True)
    for tool in ("ibstat", "ibstatus", "ibv_devinfo", "ibv_devices"):
        (tools / "bin" / tool).write_text("#!/bin/sh\n")
    args = cli.build_parser().parse_args([
        "daemon", "--root", str(root), "--profile", profile, "--node-name", "worker-7",
        "--ib-tools-dir", str(tools), *flags,
    ])
    simulators = build_simulators(args)
    host = Host(root)
    # An injected Xid, so the kernel log announcer writes and persists too.
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text('version: 1\ndevices:\n  "0": {failure: {xid: {code: 79}}}\n')
    state = compile_profile(profile, node_name="worker-7", overrides=overrides)
    assert state.xids
    _watch["on"] = True
    async with trio.open_nursery() as nursery:
        supervisor = Supervisor(host)
        await nursery.start(supervisor.run)
        reconciler = Reconciler(host, simulators, supervisor=supervisor)
        for _ in range(2):  # the first pass creates, the second finds everything in place
            result = await reconciler.reconcile_once(state)
            assert result.ok, result.summary()
        kernellog = next(s for s in simulators if s.name == "kernellog")
        await wait_for_count(kernellog.written, 1)
        for sim in simulators:
            supervisor.readiness(sim)
        report = await teardown(host, simulators, timeout=60, supervisor=supervisor)
        assert report.clean, report.failures
        nursery.cancel_scope.cancel()
    assert snapshot(root) == {}
    assert sorted(fs_on_event_loop) == []


# --------------------------------------------------------------------------
# As many GPUs as the mock library takes
# --------------------------------------------------------------------------


async def test_sixty_four_gpus_without_a_pcie_topology_stage_everywhere(tmp_path: Path) -> None:
    """64 GPUs (the engine config's limit) on one root complex, 64 HCAs: every
    simulator stages them, the node is published, and teardown is clean."""
    doc = yaml.safe_load(read_profile_text("h100")[1])
    # Buses from 0x10: the NVSwitches keep 05..08.
    doc["devices"] = [{"index": i, "pci": {"bus_id": f"0000:{0x10 + i:02x}:00.0"}}
                      for i in range(64)]
    doc.pop("pcie_topology", None)
    doc["system"].pop("num_devices", None)
    profile = tmp_path / "h100-64.yaml"
    profile.write_text(yaml.safe_dump(doc))
    root = tmp_path / "node"
    root.mkdir()
    args = cli.build_parser().parse_args(
        ["daemon", "--root", str(root), "--profile", str(profile), "--node-name", "worker-7"]
    )
    simulators = build_simulators(args)
    host = Host(root)
    state = compile_profile(profile, node_name="worker-7")
    assert len(state.gpus) == 64
    result = await Reconciler(host, simulators, supervisor=None).reconcile_once(state)
    assert result.ok, result.summary()
    for sim in simulators:
        if not isinstance(sim, Daemon):
            assert sim.readiness.ready, (sim.name, sim.readiness.reason)
    dev = root / "var/lib/nvml-mock/driver/dev"
    assert len(list(dev.glob("nvidia[0-9]*"))) == 64
    assert len(list((root / "var/lib/nvml-mock/sys/bus/pci/drivers/nvidia").iterdir())) == 68
    hcas = root / "var/lib/nvml-mock/ib/sys/class/infiniband"
    assert len(list(hcas.iterdir())) == 64
    report = await teardown(host, simulators, timeout=120)
    assert report.clean, report.failures
    assert snapshot(root) == {}
