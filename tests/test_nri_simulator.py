"""The nri simulator as a Daemon: flags, the connection it runs, readiness, reload, teardown.

The connection is a fake with ``run_plugin``'s signature (the real one is
tested against containerd in its own module): it records what it was asked
and hands the test the ``on_create`` callback containerd would call.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import pytest
import trio

from mokka import cli
from mokka.errors import SpecError
from mokka.noderoot.host import Host
from mokka.simulators import registry
from mokka.simulators.base import Daemon, Simulator
from mokka.simulators.nri import PLUGIN, NriSettings, NriSimulator, pci_links
from mokka.simulators.nri.model import Adjustment, Container
from mokka.simulators.pcibus.hierarchy import plan_tree
from mokka.state.compile import compile_profile

pytestmark = pytest.mark.timeout(60)

H100 = compile_profile("h100", node_name="node-a", generation=1)
L40S = compile_profile("l40s", node_name="node-a", generation=2)


@attrs.define
class Status:
    """What ``connection.PluginStatus`` exposes that readiness reads."""

    connected: bool = False
    registrations: int = 0
    last_error: str = ""
    create_failures: int = 0
    last_create_error: str = ""


@attrs.define
class FakeConnection:
    status: Status = attrs.field(factory=Status)
    calls: list[tuple] = attrs.field(factory=list)
    on_create: object = None
    cancelled: bool = False

    async def run_plugin(self, socket_path, name, index, on_create, *,
                         task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.calls.append((socket_path, name, index))
        self.on_create = on_create
        task_status.started(self.status)
        try:
            await trio.sleep_forever()
        finally:
            self.cancelled = True


def gpu_box(value: str = "1") -> Container:
    return Container(id="c", name="ctr", pod_name="p", pod_namespace="ns", pod_uid="u",
                     env=(f"NVIDIA_VISIBLE_DEVICES={value}",))


def make(tmp_path: Path, **settings) -> tuple[NriSimulator, FakeConnection, Host]:
    fake = FakeConnection()
    root = tmp_path / "root"
    root.mkdir()
    sim = NriSimulator(settings=NriSettings(run_plugin=fake.run_plugin, **settings))
    return sim, fake, Host(root)


def test_it_is_a_registered_daemon_with_its_flags() -> None:
    assert "mokka.simulators.nri" in registry.PLUGIN_MODULES
    args = cli.build_parser().parse_args([
        "daemon", "--nri-plugin", "off", "--nri-ambient", "on", "--nri-proc-mounts", "on",
        "--nri-socket", "/run/x/nri.sock", "--nri-mount-root", "/node",
    ])
    sim = PLUGIN.build(args)
    assert isinstance(sim, Simulator)
    assert isinstance(sim, Daemon)
    assert sim.settings.enabled is False
    assert sim.settings.ambient is True
    assert sim.settings.proc_mounts is True
    assert sim.settings.node_socket == "/run/x/nri.sock"  # the cri simulator's flag
    assert sim.settings.socket is None
    assert sim.settings.source("/var/lib/x") == "/node/var/lib/x"
    defaults = PLUGIN.build(cli.build_parser().parse_args(["daemon"])).settings
    assert (defaults.enabled, defaults.ambient, defaults.proc_mounts) == (True, False, False)


def test_a_relative_mount_root_names_its_flag() -> None:
    args = cli.build_parser().parse_args(["daemon", "--nri-mount-root", "node"])
    with pytest.raises(SpecError, match="--nri-mount-root: 'node'"):
        registry.build_simulators(args)


async def test_stage_writes_nothing_and_run_serves_the_policy(tmp_path: Path) -> None:
    sim, fake, host = make(tmp_path)
    before = sorted(os.walk(host.root))
    await sim.stage(host, H100)
    assert sorted(os.walk(host.root)) == before
    assert not sim.readiness.ready
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, H100)
            # Started before containerd answered: not ready, and says where it waits.
            (socket_path, name, index), = fake.calls
            assert socket_path == host.resolve("/var/run/nri/nri.sock")
            assert (name, index) == ("mokka", "10")
            ready = sim.readiness
            assert not ready.ready
            assert "not registered" in ready.reason
            fake.status.last_error = "[Errno 111] Connection refused"
            assert not sim.readiness.ready
            assert "Connection refused" in sim.readiness.reason
            # No socket at all: no containerd with NRI, nothing to miss.
            fake.status.last_error = "[Errno 2] No such file or directory"
            assert sim.readiness.ready
            assert "no NRI socket" in sim.readiness.reason
            # Registered: ready; containers get the policy's answer.
            fake.status.connected, fake.status.registrations = True, 1
            assert sim.readiness.ready
            adj = await fake.on_create(gpu_box("1"))
            gpu1 = H100.gpu(1).bus_id
            assert f"/sys/bus/pci/devices/{gpu1}" in {m.destination for m in adj.mounts}
            assert await fake.on_create(gpu_box("void")) == Adjustment()
            assert (sim.decided, sim.injected) == (2, 1)
            # containerd restarted: the connection is down until it re-registers.
            fake.status.connected = False
            fake.status.last_error = "the runtime closed the connection"
            assert not sim.readiness.ready
            fake.status.connected, fake.status.registrations = True, 2
            # Containers answered empty by the connection show, but stay ready.
            fake.status.create_failures, fake.status.last_create_error = 1, "timed out"
            assert sim.readiness.ready
            assert "timed out" in sim.readiness.reason
            nursery.cancel_scope.cancel()
    assert fake.cancelled
    assert not sim.readiness.ready
    await sim.discard(host)
    assert sorted(os.walk(host.root)) == before


async def test_reload_swaps_the_view(tmp_path: Path) -> None:
    sim, fake, host = make(tmp_path)
    await sim.stage(host, H100)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, H100)
            assert len(sim.view.gpus) == 8
            await sim.reload(L40S)
            assert [g.bdf for g in sim.view.gpus] == [g.bus_id for g in L40S.gpus]
            adj = await fake.on_create(gpu_box("all"))
            buses = {m.destination for m in adj.mounts if m.destination.startswith("/sys/bus")}
            assert buses == {"/sys/bus/pci/devices"} | {
                f"/sys/bus/pci/devices/{g.bus_id}" for g in L40S.gpus}
            nursery.cancel_scope.cancel()


async def test_the_settings_socket_is_used_as_given(tmp_path: Path) -> None:
    sim, fake, host = make(tmp_path, socket="/run/nri/other.sock")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, H100)
            assert fake.calls[0][0] == Path("/run/nri/other.sock")
            nursery.cancel_scope.cancel()


async def test_off_it_never_connects_and_is_ready(tmp_path: Path) -> None:
    sim, fake, host = make(tmp_path, enabled=False)
    await sim.stage(host, H100)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, H100)
            await sim.reload(L40S)
            assert fake.calls == []
            assert sim.readiness.ready
            assert "off" in sim.readiness.reason
            nursery.cancel_scope.cancel()


async def test_a_connection_that_fails_to_start_fails_run(tmp_path: Path) -> None:
    """The supervisor restarts a crashed daemon; the error must reach it."""

    async def broken(*args, task_status=trio.TASK_STATUS_IGNORED) -> None:
        raise OSError("no NRI here")

    sim = NriSimulator(settings=NriSettings(run_plugin=broken))
    root = tmp_path / "root"
    root.mkdir()
    with trio.fail_after(10), pytest.RaisesGroup(
        pytest.RaisesExc(OSError, match="no NRI"), flatten_subgroups=True
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, Host(root), H100)
    assert not sim.readiness.ready


def test_sys_devices_is_an_opt_in_flag() -> None:
    parse = cli.build_parser().parse_args
    assert PLUGIN.build(parse(["daemon"])).settings.sys_devices is False
    assert PLUGIN.build(parse(["daemon", "--nri-sys-devices", "on"])).settings.sys_devices


async def test_sys_devices_stages_a_link_per_function_and_discard_removes_them(
    tmp_path: Path,
) -> None:
    """Each directory holds one link, the text a real node's bus holds; the node's
    own /sys/devices is read at each creation, and an unreadable one fails it
    (the connection then answers empty and readiness says why)."""
    sysfs = tmp_path / "sys"
    (sysfs / "devices" / "system" / "node" / "node0").mkdir(parents=True)
    sim, fake, host = make(tmp_path, sys_devices=True, sysfs=sysfs)
    before = sorted(os.walk(host.root))
    await sim.stage(host, H100)
    links = host.root / pci_links.PCI_LINKS.lstrip("/")
    tree = plan_tree(H100, fallback_cpus=1)
    assert sorted(p.name for p in links.iterdir()) == sorted(
        [pci_links.EMPTY] + [pci_links.link_dir(fn.bdf) for fn in tree.functions])
    for fn in tree.functions:
        (link,) = (links / pci_links.link_dir(fn.bdf)).iterdir()
        assert (link.name, os.readlink(link)) == (fn.bdf, f"../../../{fn.path}")
    assert list((links / pci_links.EMPTY).iterdir()) == []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, H100)
            adj = await fake.on_create(gpu_box("1"))
            by_dest = {m.destination: m for m in adj.mounts}
            assert by_dest["/sys/bus/pci/devices"].type == "overlay"
            assert by_dest["/sys/devices/system"].source == f"{sysfs}/devices/system"
            for option in by_dest["/sys/bus/pci/devices"].options[-1].split("=")[1].split(":"):
                assert (host.root / option.lstrip("/")).is_dir(), option  # staged layers
            (sysfs / "devices" / "system" / "node" / "node0").rmdir()
            (sysfs / "devices" / "system" / "node").rmdir()
            (sysfs / "devices" / "system").rmdir()
            (sysfs / "devices").rmdir()
            with pytest.raises(FileNotFoundError, match="devices"):
                await fake.on_create(gpu_box("1"))
            nursery.cancel_scope.cancel()
    await sim.discard(host)
    assert not links.exists()
    assert sorted(os.walk(host.root)) == before
