"""The mock-ib daemon on one node: LIDs, MAD bytes, the fabric model, and the
real Debian infiniband-diags tools (sminfo, smpquery, perfquery, iblinkinfo,
ibnetdiscover) run through the staged wrappers against an in-process daemon.

The tools run as subprocesses under ``trio.run_process`` so the daemon
(in the same event loop) answers them; each is given a short MAD timeout
(``-t``) and a process timeout.  Every test that stages checks that the
daemon's socket is gone when it stops and that discard restores the root.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import attrs
import pytest
import trio

from mokka import cli, layout
from mokka.errors import SpecError
from mokka.noderoot.host import Host
from mokka.simulators.ib import IbSimulator, lids, mad, smp
from mokka.simulators.ib.counters import CounterError, change_counters
from mokka.simulators.ib.fabric import SPINE, UPLINK, Fabric, Walked
from mokka.simulators.ib.hca import plan_hcas
from mokka.simulators.ib.mockib import RUN_OWNER, SOCKET_DIR, UMAD_SOCKET
from mokka.simulators.ib.request import Request
from mokka.simulators.ib.settings import IbSettings
from mokka.simulators.ib.tools import IB_PREFIXES
from mokka.simulators.ib.umadsocket import listen
from mokka.simulators.pcibus import PcibusSimulator
from mokka.state.model import Clique, Domain, State, Topology
from tests.daemon_support import PROCESS_TIMEOUT, kill_daemon, running_daemon
from tests.ib_support import (
    NO_TOOLS,
    TOOL_TIMEOUT,
    discard_with_pcibus,
    ib_native_fixture,  # noqa: F401  (a fixture: tests name it ib_native)
    native_env_fixture,  # noqa: F401  (a fixture: tests name it native_env)
    stage,
    stage_with_pcibus,
    state_of,
    tool_env,
)
from tests.support import require_tool, snapshot

BIN = layout.DRIVER_BIN.lstrip("/")
IB = layout.IB_ROOT.lstrip("/")
PREFIXES = ":".join(IB_PREFIXES)


def in_fabric(state: State, nodes: list[str], node: str) -> State:
    """``state`` for ``node`` with a topology document listing ``nodes``."""
    topology = Topology(domains=(Domain(uuid="d", cliques=(Clique(0, tuple(nodes)),)),), text="")
    return attrs.evolve(state, node_name=node, topology=topology)


# --------------------------------------------------------------------------
# LIDs
# --------------------------------------------------------------------------


def test_lids_are_unique_across_64_nodes_and_stable() -> None:
    base = state_of("h100")  # 8 HCAs per node
    nodes = [f"node-{i:02d}" for i in range(64)]
    seen: dict[int, str] = {}
    for node in nodes:
        for hca in plan_hcas(in_fabric(base, nodes, node)):
            assert hca.lid not in seen, f"{node} {hca.name} LID {hca.lid} also {seen[hca.lid]}"
            seen[hca.lid] = f"{node} {hca.name}"
    assert len(seen) == 64 * 8
    # No HCA takes the SM's LID or a leaf switch's, and all are unicast LIDs.
    leaves = {lids.leaf_lid(k) for k in range(64)}
    assert all(1 < lid <= 0xBFFF and lid not in leaves for lid in seen)
    # Stable: the same list gives the same LIDs (a restarted daemon recompiles
    # its state), and nodes appended later leave earlier nodes' LIDs alone.
    again = [h.lid for h in plan_hcas(in_fabric(base, nodes, "node-17"))]
    grown = [h.lid for h in plan_hcas(in_fabric(base, [*nodes, "node-64"], "node-17"))]
    assert again == grown == [h.lid for h in plan_hcas(in_fabric(base, nodes, "node-17"))]
    assert again[0] == seen_lid(seen, "node-17 mlx5_0")


def seen_lid(seen: dict[int, str], name: str) -> int:
    return next(lid for lid, who in seen.items() if who == name)


def test_lid_layout_and_limits() -> None:
    assert (lids.leaf_lid(0), lids.hca_lid(0, 0)) == (2, 3)
    assert lids.owner(lids.hca_lid(5, 3)) == (5, 4)
    assert (lids.owner(1), lids.owner(0xC000)) == (None, None)
    base = state_of("h100")
    nodes = [f"n{i}" for i in range(255)]
    too_many = r"255 nodes in the InfiniBand fabric, expected at most 254"
    with pytest.raises(SpecError, match=too_many):
        plan_hcas(in_fabric(base, nodes, "n0"))
    # A node not in the topology's list is a fabric of its own.
    alone = in_fabric(base, ["x", "y"], "node-a")
    assert lids.fabric_nodes(alone) == ("node-a",)
    assert [h.lid for h in plan_hcas(alone)][:2] == [3, 4]


# --------------------------------------------------------------------------
# Bytes
# --------------------------------------------------------------------------


def test_umad_frames_round_trip_and_control_frames_parse() -> None:
    frame = mad.Umad(agent_id=7, status=0, timeout_ms=250, retries=2, qpn=1,
                     qkey=mad.GSI_QKEY, lid=0x1234, sl=3, pkey_index=0,
                     mad=bytes(range(256))).pack()
    assert len(frame) == 64 + 256
    # The header is the kernel's: host-order words, then network-order address.
    assert frame[0:4] == (7).to_bytes(4, "little")
    assert frame[16:20] == (320).to_bytes(4, "little")
    assert (frame[20:24], frame[28:30]) == ((1).to_bytes(4, "big"), b"\x12\x34")
    back = mad.Umad.unpack(frame)
    assert (back.agent_id, back.lid, back.sl, back.retries, back.mad) == (
        7, 0x1234, 3, 2, bytes(range(256)))
    with pytest.raises(ValueError, match="expected at least 88"):
        mad.Umad.unpack(b"x" * 70)
    # ib_user_mad_reg_req: id, method_mask[4] (host order), qpn, class, version, oui, rmpp
    mask = (1 << mad.METHOD_GET).to_bytes(16, "little")
    reg = (b"MKIB" + (2).to_bytes(4, "little") + bytes(4) + bytes(4) + mask
           + bytes([1, 0x32, 1]) + b"\x00\x14\x05" + bytes(2))
    control = mad.Control.unpack(reg)
    assert control.registration == mad.Registration(
        mgmt_class=0x32, class_version=1, method_mask=2, oui=0x1405, qpn=1)
    ping = bytearray(256)
    ping[1], ping[3] = 0x32, mad.METHOD_GET
    ping[37:40] = b"\x00\x14\x05"
    assert control.registration.accepts(bytes(ping))
    ping[37:40] = b"\x00\x14\x06"
    assert not control.registration.accepts(bytes(ping))
    counter = mad.Control.unpack(mad.counter_frame(2, "symbol_error", mad.COUNTER_ADD, 9))
    assert (counter.arg, counter.counter) == (2, mad.CounterChange("symbol_error", 0, 9))
    assert mad.parse_reply(mad.control_reply(4, -errno.ENODEV)) == (4, -errno.ENODEV, 0)


def test_port_counters_saturate_like_the_hardware() -> None:
    data = smp.port_counters(1, {"symbol_error": 70000, "link_downed": 3,
                                 "local_link_integrity_errors": 20, "port_xmit_data": 5})
    assert data[4:6] == b"\xff\xff"  # 16-bit SymbolErrorCounter stops at its maximum
    assert (data[7], data[19] >> 4, data[24:28]) == (3, 15, (5).to_bytes(4, "big"))


# --------------------------------------------------------------------------
# The fabric model
# --------------------------------------------------------------------------


def model(live: set[int], me: int = 0, nodes: int = 3) -> Fabric:
    base = state_of("gb200")  # 4 HCAs
    names = [f"n{i}" for i in range(nodes)]
    return Fabric(nodes=tuple(names), me=me, hcas=plan_hcas(in_fabric(base, names, names[me])),
                  is_live=lambda k: k in live, read_counters=lambda i: {})


def test_directed_routes_walk_the_tree_and_stop_at_down_links() -> None:
    fabric = model(live={2})
    start = Walked(entity=("hca", 0, 1), arrival=1)
    # Up to the leaf (arriving on the HCA's port), the spine, and back down.
    assert fabric.walk(attrs.evolve(start, hops=(1,))) == Walked(entity=("leaf", 0), arrival=2)
    assert fabric.walk(attrs.evolve(start, hops=(1, 5))) == Walked(entity=SPINE, arrival=1)
    assert fabric.walk(attrs.evolve(start, hops=(1, 5, 1, 4))) == Walked(
        entity=("hca", 0, 3), arrival=1)
    # A live peer's leaf is its daemon's: the walk hands over the rest of the hops.
    assert fabric.walk(attrs.evolve(start, hops=(1, 5, 3, 2))) == Walked(
        entity=("leaf", 2), arrival=UPLINK, hops=(2,))
    # A peer that is not live is an unplugged cable; so is a port with nothing on it.
    assert fabric.walk(attrs.evolve(start, hops=(1, 5, 2))) is None
    assert fabric.walk(attrs.evolve(start, hops=(1, 7))) is None
    assert fabric.walk(attrs.evolve(start, hops=(2,))) is None


def test_switch_ports_show_the_links_state() -> None:
    fabric = model(live={2})
    request = bytearray(256)
    request[0:4] = bytes([1, mad.CLASS_SMP_DR, 1, mad.METHOD_GET])
    request[16:18] = smp.ATTR_PORT_INFO.to_bytes(2, "big")

    def port(entity: tuple, number: int) -> tuple[int, int, int]:
        request[20:24] = number.to_bytes(4, "big")
        data = fabric.answer_smp(entity, 5, bytes(request))[64:128]
        return data[32] & 0xF, data[33] >> 4, data[28]

    assert port(SPINE, 1) == (smp.PORT_ACTIVE, smp.PHYS_LINK_UP, 5)
    assert port(SPINE, 2) == (smp.PORT_DOWN, smp.PHYS_POLLING, 5)  # n1 is not live
    assert port(SPINE, 3) == (smp.PORT_ACTIVE, smp.PHYS_LINK_UP, 5)
    answer = fabric.answer_smp(SPINE, 5, bytes(request[:20]) + (9).to_bytes(4, "big")
                               + bytes(request[24:]))
    assert int.from_bytes(answer[4:6], "big") & 0x7FFF == mad.STATUS_INVALID_FIELD


# --------------------------------------------------------------------------
# Real tools against an in-process daemon
# --------------------------------------------------------------------------


async def tool(root: Path, name: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    require_tool(name)
    with trio.fail_after(TOOL_TIMEOUT):
        return await trio.run_process(
            [str(root / BIN / name), *args], capture_stdout=True, capture_stderr=True,
            check=False, env=tool_env(),
        )


def text(done: subprocess.CompletedProcess[bytes]) -> str:
    return done.stdout.decode()


def fields(done: subprocess.CompletedProcess[bytes]) -> dict[str, str]:
    """``Name:.....value`` lines of smpquery/perfquery output."""
    return dict(re.findall(r"^(\w[\w ]*?):\.+(.*)$", text(done), re.M))


async def test_real_tools_on_one_node(node_root: Path, native_env: Path) -> None:
    before = snapshot(node_root)
    host = Host(node_root)
    state = state_of("gb200")
    sim = await stage_with_pcibus(host, state)
    hcas = plan_hcas(state)
    socket_file = node_root / UMAD_SOCKET.lstrip("/")
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        assert socket_file.is_socket()
        # Recorded before it was bound, so a cleanup after a kill finds it.
        assert host.owned(RUN_OWNER)[UMAD_SOCKET] == "file"
        assert sim.readiness.reason.endswith("; mock-ib: serving MADs")

        done = await tool(node_root, "sminfo", "-t", "500")
        assert done.returncode == 0, done.stderr
        assert re.match(r"sminfo: sm lid 1 sm guid 0x[0-9a-f]+, activity count 0 priority 15 "
                        r"state 3 SMINFO_MASTER", text(done))

        for hca in hcas:
            done = await tool(node_root, "smpquery", "-t", "500", "nodedesc", str(hca.lid))
            assert done.returncode == 0, done.stderr
            assert fields(done) == {"Node Description": hca.node_desc}
        done = await tool(node_root, "smpquery", "-t", "500", "nodeinfo", str(hcas[2].lid))
        info = fields(done)
        assert info["Guid"] == info["PortGuid"] == f"0x{hcas[2].guid:016x}"
        assert (info["NodeType"], info["NumPorts"], info["DevId"]) == (
            "Channel Adapter", "1", "0x1021")
        done = await tool(node_root, "smpquery", "-t", "500", "portinfo", str(hcas[1].lid), "1")
        info = fields(done)
        assert (info["Lid"], info["SMLid"], info["LinkState"], info["PhysLinkState"]) == (
            "4", "1", "Active", "LinkUp")
        # What sysfs says about the port, the SMA says too.
        sysfs = (node_root / IB / "sys/class/infiniband/mlx5_1/ports/1/lid").read_text()
        assert int(sysfs, 16) == hcas[1].lid == 4

        done = await tool(node_root, "perfquery", "-t", "500", str(hcas[3].lid), "1")
        assert done.returncode == 0, done.stderr
        assert fields(done)["SymbolErrorCounter"] == "0"
        # A drill raises counters: sysfs and the PMA show the same new values.
        values = await trio.to_thread.run_sync(
            lambda: change_counters(host, 3, [("symbol_error", 7), ("link_downed", 2)], set_=False))
        assert values == [7, 2]
        counters = node_root / IB / "sys/class/infiniband/mlx5_3/ports/1/counters"
        assert (counters / "symbol_error").read_text() == "7\n"
        assert (counters / "link_downed").read_text() == "2\n"
        done = await tool(node_root, "perfquery", "-t", "500", str(hcas[3].lid), "1")
        assert fields(done)["SymbolErrorCounter"] == "7"
        assert fields(done)["LinkDownedCounter"] == "2"
        assert sim.counters == {"mlx5_3": {"symbol_error": 7, "link_downed": 2}}
        # perfquery -R reads, then resets: the PMA and sysfs both start over.
        done = await tool(node_root, "perfquery", "-t", "500", "-R", str(hcas[3].lid), "1")
        assert done.returncode == 0, done.stderr
        done = await tool(node_root, "perfquery", "-t", "500", str(hcas[3].lid), "1")
        assert (fields(done)["SymbolErrorCounter"], fields(done)["LinkDownedCounter"]) == (
            "0", "0")
        assert (counters / "symbol_error").read_text() == "0\n"
        assert sim.counters["mlx5_3"] == {"symbol_error": 0, "link_downed": 0}

        # The whole subnet: one leaf with the node's HCAs under the spine.
        done = await tool(node_root, "ibnetdiscover", "-t", "500")
        assert done.returncode == 0, done.stderr
        listed = re.findall(r'^Ca\s+1 "H-([0-9a-f]+)"\s+# "([^"]+)"', text(done), re.M)
        assert sorted(listed) == sorted((f"{h.guid:016x}", h.node_desc) for h in hcas)
        assert len(re.findall(r"^Switch\s", text(done), re.M)) == 2
        done = await tool(node_root, "iblinkinfo", "-t", "500")
        assert done.returncode == 0, done.stderr
        assert "Switch: " in text(done)
        assert f'"{hcas[0].node_desc}"' in text(done)

        # Nothing answers at an unused LID: the tool times out (bounded by -t).
        done = await tool(node_root, "smpquery", "-t", "200", "nodedesc", "77")
        assert done.returncode != 0
        nursery.cancel_scope.cancel()
    assert not socket_file.exists()
    # The record goes with the socket; the directory, still staged, stays.
    assert UMAD_SOCKET not in host.owned(RUN_OWNER)
    assert SOCKET_DIR in host.owned(RUN_OWNER)
    await discard_with_pcibus(host, sim)
    assert snapshot(node_root) == before


async def test_a_socket_no_manifest_records_is_replaced(node_root: Path, native_env: Path) -> None:
    """A socket a daemon of an earlier release left (never recorded) does not
    stop the next start, and the discard leaves the root as it was."""
    before = snapshot(node_root)
    host = Host(node_root)
    state = state_of("gb200")
    sim = await stage_with_pcibus(host, state)
    socket_file = node_root / UMAD_SOCKET.lstrip("/")
    stale, dirfd, _ = listen(socket_file)  # bound, then abandoned as by a kill
    stale.close()
    os.close(dirfd)
    assert socket_file.is_socket()
    assert UMAD_SOCKET not in host.owned(RUN_OWNER)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        assert socket_file.is_socket()
        assert host.owned(RUN_OWNER)[UMAD_SOCKET] == "file"
        done = await tool(node_root, "sminfo", "-t", "500")
        assert done.returncode == 0, done.stderr
        nursery.cancel_scope.cancel()
    await discard_with_pcibus(host, sim)
    assert snapshot(node_root) == before


@pytest.mark.parametrize("when", ["serving", "tearing-down"])
async def test_cleanup_after_a_killed_daemon_removes_its_socket(
    node_root: Path, tmp_path: Path, when: str
) -> None:
    """SIGKILL while serving leaves the socket bound in the staged tree (or,
    during the teardown, whatever part of it is left); ``mokka cleanup``
    then leaves the root byte for byte as it was before the daemon."""
    before = snapshot(node_root)
    socket_file = node_root / UMAD_SOCKET.lstrip("/")
    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon(
            "--root", str(node_root), "--profile", "h100", "--health-addr", "127.0.0.1:0",
            "--ib-mode", "sysfs", cwd=tmp_path) as daemon:
            await daemon.wait_for_line(r"mock-ib: MADs served at ")
            await daemon.wait_for_line(r"reconcile pass ok generation=1")
            assert socket_file.is_socket()
            if when == "tearing-down":
                daemon.process.send_signal(signal.SIGTERM)
                await daemon.wait_for_line(r"tearing down")
            await kill_daemon(daemon)
    if when == "serving":
        assert socket_file.is_socket()  # nothing removed it
    assert await trio.to_thread.run_sync(cli.main, ["cleanup", "--root", str(node_root)]) == 0
    assert snapshot(node_root) == before


async def test_reload_changes_the_answers_and_what_is_served(
    node_root: Path, native_env: Path
) -> None:
    """A new state reaches the next MAD; a state without HCAs stops the service."""
    before = snapshot(node_root)
    host = Host(node_root)
    state = state_of("gb200")
    sim = await stage_with_pcibus(host, state)
    socket_file = node_root / UMAD_SOCKET.lstrip("/")
    lid = plan_hcas(state)[0].lid
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        assert state.infiniband is not None
        renamed = attrs.evolve(state, generation=2, infiniband=attrs.evolve(
            state.infiniband, node_desc_template="rack7-{node_name}-hca{idx}",
            port_state="DOWN"))
        await sim.stage(host, renamed)
        await sim.reload(renamed)
        done = await tool(node_root, "smpquery", "-t", "500", "nodedesc", str(lid))
        assert fields(done) == {"Node Description": "rack7-node-a-hca0"}
        done = await tool(node_root, "smpquery", "-C", "mlx5_0", "-t", "500", "-D",
                          "portinfo", "0", "1")
        assert (fields(done)["LinkState"], fields(done)["Lid"]) == ("Down", str(lid))
        # The port is down: the leaf switch behind it cannot be reached.
        done = await tool(node_root, "smpquery", "-C", "mlx5_0", "-t", "200", "-D",
                          "nodeinfo", "0,1")
        assert done.returncode != 0
        # No HCAs any more (the profile lost its infiniband block): no socket.
        without = attrs.evolve(state, generation=3, infiniband=None)
        await sim.stage(host, without)
        await sim.reload(without)  # returns once the service has stopped
        assert not socket_file.exists()
        assert "no MAD service" in sim.readiness.reason
        nursery.cancel_scope.cancel()
    await discard_with_pcibus(host, sim)
    assert snapshot(node_root) == before


async def test_the_relay_is_opt_in_and_a_busy_port_fails_the_start(
    node_root: Path, native_env: Path
) -> None:
    before = snapshot(node_root)
    host = Host(node_root)
    state = in_fabric(state_of("gb200"), ["node-a", "node-b"], "node-a")
    pcibus = PcibusSimulator()
    await pcibus.stage(host, state)
    socket_file = node_root / UMAD_SOCKET.lstrip("/")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        sim = IbSimulator(IbSettings(relay_address="127.0.0.1", relay_port=port,
                                     tools_dir=NO_TOOLS))
        await sim.stage(host, state)
        async with trio.open_nursery() as nursery:
            with pytest.raises(OSError, match=rf"--ib-relay-port: cannot listen on "
                               rf"127\.0\.0\.1:{port}: "):
                await nursery.start(sim.run, host, state)
        assert not socket_file.exists()
    # Without --ib-relay-port the node serves alone: same LIDs, node-b's
    # spine port down, only node-a's HCAs discovered.
    sim = await stage(node_root, state)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        assert "relay" not in sim.readiness.reason
        done = await tool(node_root, "ibnetdiscover", "-t", "300")
        listed = re.findall(r'^Ca\s.*# "([^"]+)"$', text(done), re.M)
        assert sorted(listed) == [f"node-a mlx5_{i}" for i in range(4)]
        done = await tool(node_root, "smpquery", "-t", "300", "portinfo", "1", "2")
        assert fields(done)["PhysLinkState"] == "Polling"
        nursery.cancel_scope.cancel()
    await sim.discard(host)
    await pcibus.discard(host)
    assert snapshot(node_root) == before


def test_umad_shim_exports_only_the_interposed_calls(ib_native: Path) -> None:
    nm = require_tool("nm")
    listing = subprocess.run([nm, "-D", "--defined-only", str(ib_native / "libumadshim.so")],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    exported = sorted(line.split()[-1] for line in listing.splitlines() if " T " in line)
    assert exported == ["__open64_2", "__open_2", "ioctl", "open", "open64", "openat",
                        "openat64"]


async def test_umad_shim_under_valgrind(node_root: Path, native_env: Path) -> None:
    """The real perfquery through both shims and the daemon: no memory error, no leak."""
    valgrind = require_tool("valgrind")
    require_tool("perfquery")
    host = Host(node_root)
    state = state_of("gb200")
    sim = await stage_with_pcibus(host, state)
    env = {**tool_env(), "LD_PRELOAD": f"{native_env / 'libumadshim.so'} "
           f"{native_env / 'libmockfs.so'}", "MOKKA_MOCKFS_ROOT": str(node_root / IB),
           "MOKKA_MOCKFS_PREFIXES": PREFIXES}
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        with trio.fail_after(120):
            done = await trio.run_process(
                [valgrind, "--leak-check=full", "--errors-for-leak-kinds=definite",
                 "--error-exitcode=9", "perfquery", "-t", "2000", "4", "1"],
                capture_stdout=True, capture_stderr=True, check=False, env=env)
        nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert "ERROR SUMMARY: 0 errors" in done.stderr.decode()
    assert fields(done)["PortSelect"] == "1"
    await discard_with_pcibus(host, sim)
    assert snapshot(node_root) == {}


async def test_tools_without_a_daemon_fail_clearly(node_root: Path, native_env: Path) -> None:
    before = snapshot(node_root)
    host = Host(node_root)
    state = state_of("gb200")
    sim = await stage_with_pcibus(host, state)
    done = await tool(node_root, "sminfo", "-t", "200")
    assert done.returncode != 0
    assert "umadshim: no mock-ib daemon answers at" in done.stderr.decode()
    with pytest.raises(CounterError, match="no mock-ib daemon answers"):
        change_counters(host, 0, [("symbol_error", 1)], set_=False)
    await discard_with_pcibus(host, sim)
    assert snapshot(node_root) == before


def test_relay_settings_parse_and_refuse_bad_peers() -> None:
    settings = IbSettings(peers=["b=127.0.0.1:7001", "c=[::1]:7002"], relay_port=7000)
    assert settings.peer_address("b") == ("127.0.0.1", 7001)
    assert settings.peer_address("c") == ("::1", 7002)
    assert settings.peer_address("d") == ("d", 7000)
    with pytest.raises(SpecError, match=r"--ib-peer: 'b:7001', expected NODE=HOST:PORT"):
        IbSettings(peers=["b:7001"])


def test_relay_requests_from_peers_are_checked() -> None:
    """A peer's message can name nothing outside the fabric, however it is built."""
    good = Request(id=1, origin=1, slid=131, mad=bytes(256),
                   walk=Walked(entity=("leaf", 0), arrival=UPLINK, hops=(1,))).to_message()
    assert Request.from_message(good, 2).walk == Walked(entity=("leaf", 0), arrival=UPLINK,
                                                        hops=(1,))
    lid_routed = Request(id=2, origin=0, slid=3, mad=bytes(256), dlid=131).to_message()
    assert Request.from_message(lid_routed, 2).dlid == 131
    for bad in (
        {**good, "walk": [["hca", 5, 0], 1, []]},  # node 5 of a 2-node fabric
        {**good, "walk": [["router", 0], 1, []]},
        {**good, "walk": [["leaf", 0], 1, [1] * 64]},  # longer than any directed route
        {**good, "walk": [["leaf", 0], "sideways", []]},
        {**good, "mad": "00"},
        {**good, "id": -1},
        {**good, "origin": True},
        {**good, "walk": None},  # neither a route nor a LID
        {k: v for k, v in good.items() if k != "slid"},
    ):
        with pytest.raises(ValueError, match="malformed relay request"):
            Request.from_message(bad, 2)


def test_ctl_ib_counter_refuses_bad_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mokka.ctl.command import main

    root = tmp_path / "node"
    root.mkdir()
    assert main(["ib-counter", "--root", str(root), "--hca", "mlx5_0", "bogus=1"]) == 2
    assert "ib-counter: 'bogus=1', expected counter=N with a counter among" in (
        capsys.readouterr().err)
    assert main(["ib-counter", "--root", str(root), "--hca", "hca0", "symbol_error=1"]) == 2
    assert "--hca: 'hca0', expected an HCA name such as mlx5_0" in capsys.readouterr().err
    assert main(["ib-counter", "--root", str(root), "--hca", "mlx5_0", "symbol_error=-1"]) == 2
    assert "N must be an integer >= 0" in capsys.readouterr().err
    # A node whose daemon is not running: exit 1, naming the socket.
    assert main(["ib-counter", "--root", str(root), "--hca", "mlx5_0", "symbol_error=1"]) == 1
    assert "no mock-ib daemon" in capsys.readouterr().err
    assert snapshot(root) == {}
