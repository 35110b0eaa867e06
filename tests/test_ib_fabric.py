"""One InfiniBand fabric across real node daemons on one machine.

Two and three ``python -m mokka daemon`` processes, each with its own node
root, node name and relay port on loopback, share a topology document (the
fabric's node list).  The real Debian infiniband-diags tools run through
each node's staged wrappers (also through ``/run/nvidia/driver``): ibping
between nodes by LID and by GUID, sminfo, perfquery on a remote LID (and
after ``mokka ctl ib-counter`` raised a counter there), smpquery nodedesc
of a remote LID, ibnetdiscover and iblinkinfo listing every node's HCAs.
Stopping a daemon makes ibping to it time out and its spine port go down;
starting it again restores both, with the same LIDs.

The daemons share a fabric key (``--ib-relay-key-file``), which no log line
carries.  Every test checks at the end that each root is as it was, that
no relay port is still open, and that every process it started has exited.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from mokka import layout, native
from mokka.simulators.ib import lids
from mokka.state.compile import compile_profile
from tests.daemon_support import (
    PROCESS_TIMEOUT,
    DaemonProcess,
    daemon_env,
    start_daemon,
    stop_daemon,
    wait_for_lines,
)
from tests.ib_support import (
    TOOL_TIMEOUT,
    build_ib_shims,
    free_port,
    small_profile,
    tool_env,
    topology_text,
    write_relay_key,
)
from tests.support import require_tool, snapshot

BIN = layout.DRIVER_BIN.lstrip("/")
IB = layout.IB_ROOT.lstrip("/")
#: MAD timeout given to every tool (ms): a dead peer costs this, not the default second.
MAD_TIMEOUT = "300"


@pytest.fixture(scope="module")
def ib_native(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's native build (the daemon's other simulators need it),
    with the IB shims built from the current sources."""
    out = tmp_path_factory.mktemp("fabric-native")
    for built in native.PACKAGE_NATIVE_DIR.iterdir():
        (out / built.name).symlink_to(built)
    return build_ib_shims(out)


@attrs.define
class Node:
    name: str
    root: Path
    relay_port: int
    before: dict[str, tuple] = attrs.field(factory=dict)
    daemon: DaemonProcess | None = None

    @property
    def bin(self) -> Path:
        return self.root / BIN

    def lid_file(self, hca: int) -> int:
        path = self.root / IB / f"sys/class/infiniband/mlx5_{hca}/ports/1/lid"
        return int(path.read_text(), 16)

    def guid(self, hca: int) -> str:
        path = self.root / IB / f"sys/class/infiniband/mlx5_{hca}/node_guid"
        return "0x" + path.read_text().strip().replace(":", "")


@attrs.define
class Fabric:
    nodes: list[Node]
    profile: Path
    topology: Path
    native: Path
    #: the fabric's shared relay key (outside every node root)
    key_file: Path
    processes: list[trio.Process] = attrs.field(factory=list)

    def args(self, node: Node) -> list[str]:
        peers = [f"--ib-peer={n.name}=127.0.0.1:{n.relay_port}" for n in self.nodes]
        return [
            "daemon", "--root", str(node.root),
            "--profile", str(self.profile), "--topology", str(self.topology),
            "--health-addr", "127.0.0.1:0",
            "--ib-relay-address", "127.0.0.1", "--ib-relay-port", str(node.relay_port),
            "--ib-relay-key-file", str(self.key_file), "--resync-interval", "0", *peers,
        ]

    async def start(self, node: Node) -> None:
        node.daemon = await start_daemon(
            *self.args(node), cwd=node.root.parent, node_name=node.name,
            env={"MOKKA_NATIVE_DIR": str(self.native)},
        )
        self.processes.append(node.daemon.process)
        await logged(node, "mock-ib: MADs served")

    async def linked(self, node: Node, peer: Node, times: int = 1) -> None:
        """Wait until ``node``'s relay has connected to ``peer`` ``times`` times."""
        await logged(node, f"ib relay: connected to {peer.name} ", times)

    async def stop(self, node: Node) -> None:
        assert node.daemon is not None
        with trio.fail_after(PROCESS_TIMEOUT):
            code = await stop_daemon(node.daemon, signal.SIGTERM)
        assert code == 0, "\n".join(node.daemon.lines)
        # The key is a secret: no line of the log carries it.
        key = self.key_file.read_text().strip()
        assert not [line for line in node.daemon.lines if key in line]
        node.daemon = None


async def logged(node: Node, text: str, times: int = 1) -> None:
    """Read ``node``'s daemon log until ``text`` has appeared in ``times`` lines."""
    assert node.daemon is not None
    with trio.fail_after(PROCESS_TIMEOUT):
        await wait_for_lines(node.daemon, re.escape(text), times)


async def run_tool(node: Node, name: str, *args: str,
                   via: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    require_tool(name)
    with trio.fail_after(TOOL_TIMEOUT):
        return await trio.run_process(
            [str((via or node.bin) / name), *args], capture_stdout=True, capture_stderr=True,
            check=False, env=tool_env(),
        )


def out(done: subprocess.CompletedProcess[bytes]) -> str:
    return done.stdout.decode() + done.stderr.decode()


def port_closed(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@asynccontextmanager
async def fabric_of(tmp_path: Path, native: Path, names: Sequence[str],
                    gpus: int = 2) -> AsyncIterator[Fabric]:
    profile = small_profile(tmp_path, gpus)
    topology = tmp_path / "topology.yaml"
    topology.write_text(topology_text(names))
    nodes = []
    for name in names:
        root = tmp_path / f"root-{name}"
        root.mkdir()
        nodes.append(Node(name=name, root=root, relay_port=free_port(),
                          before=snapshot(root)))
    fabric = Fabric(nodes=nodes, profile=profile, topology=topology, native=native,
                    key_file=write_relay_key(tmp_path))
    try:
        for node in nodes:
            await fabric.start(node)
        for node in nodes:
            for peer in nodes:
                if peer is not node:
                    await fabric.linked(node, peer)
        yield fabric
    finally:
        with trio.CancelScope(shield=True):
            for node in nodes:
                if node.daemon is not None:
                    await fabric.stop(node)
    for node in nodes:
        assert snapshot(node.root) == node.before, f"{node.name}'s root changed"
        assert port_closed(node.relay_port), f"{node.name}'s relay port is still open"
    assert all(p.returncode is not None for p in fabric.processes)


async def ping(node: Node, *target: str, count: int = 2) -> subprocess.CompletedProcess[bytes]:
    return await run_tool(node, "ibping", "-c", str(count), "-t", MAD_TIMEOUT, *target)


@asynccontextmanager
async def ping_server(node: Node) -> AsyncIterator[trio.Process]:
    """``ibping -S`` on ``node``: answers pings until killed."""
    require_tool("ibping")
    process = await trio.lowlevel.open_process(
        [str(node.bin / "ibping"), "-S", "-C", "mlx5_0"], env=tool_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        # Registered once it answers a ping from its own node (each failed
        # ping waits out its MAD timeout, so this is no busy loop).
        for _ in range(50):
            if "1 received" in out(await ping(node, str(node.lid_file(0)), count=1)):
                break
        else:
            raise AssertionError(f"ibping -S on {node.name} never answered")
        yield process
    finally:
        process.kill()
        with trio.CancelScope(shield=True), trio.fail_after(TOOL_TIMEOUT):
            await process.wait()


async def test_two_nodes_ping_query_and_survive_a_restart(
    tmp_path: Path, ib_native: Path
) -> None:
    async with fabric_of(tmp_path, ib_native, ["node-a", "node-b"]) as fabric:
        a, b = fabric.nodes
        # LIDs follow the node list: node-b's block comes after node-a's.
        assert [a.lid_file(0), a.lid_file(1)] == [lids.hca_lid(0, 0), lids.hca_lid(0, 1)]
        b_lids = [b.lid_file(0), b.lid_file(1)]
        assert b_lids == [lids.hca_lid(1, 0), lids.hca_lid(1, 1)]

        done = await run_tool(a, "sminfo", "-t", MAD_TIMEOUT)
        assert re.match(r"sminfo: sm lid 1 sm guid 0x[0-9a-f]+, .* SMINFO_MASTER", out(done))

        done = await run_tool(a, "smpquery", "-t", MAD_TIMEOUT, "nodedesc", str(b_lids[1]))
        assert done.returncode == 0, out(done)
        assert re.search(r"Node Description:\.+node-b mlx5_1$", out(done), re.M)

        async with ping_server(b):
            done = await ping(a, str(b_lids[0]))
            assert done.returncode == 0, out(done)
            assert "2 packets transmitted, 2 received, 0% packet loss" in out(done)
            assert len(re.findall(rf"Pong from .* \(Lid {b_lids[0]}\): time [\d.]+ ms",
                                  out(done))) == 2
            done = await ping(a, "-G", b.guid(0))
            assert done.returncode == 0, out(done)
            assert f"(Lid {b_lids[0]})" in out(done)
            # Through the /run/nvidia/driver link as well.
            via = a.root / "run/nvidia/driver/usr/bin"
            done = await run_tool(a, "ibping", "-c", "1", "-t", MAD_TIMEOUT, str(b_lids[0]),
                                  via=via)
            assert "1 received" in out(done), out(done)

            # A counter raised on node-b shows in perfquery from node-a.
            ctl = await trio.run_process(
                [sys.executable, "-m", "mokka", "ctl", "ib-counter", "--root", str(b.root),
                 "--hca", "mlx5_1", "symbol_error=4", "link_downed=1"],
                capture_stdout=True, capture_stderr=True, check=False, env=daemon_env(),
            )
            assert ctl.returncode == 0, out(ctl)
            done = await run_tool(a, "perfquery", "-t", MAD_TIMEOUT, str(b_lids[1]), "1")
            assert done.returncode == 0, out(done)
            assert re.search(r"SymbolErrorCounter:\.+4$", out(done), re.M)
            assert re.search(r"LinkDownedCounter:\.+1$", out(done), re.M)

            done = await run_tool(a, "ibnetdiscover", "-t", MAD_TIMEOUT)
            cas = set(re.findall(r'^Ca\s.*# "([^"]+)"$', out(done), re.M))
            assert cas == {"node-a mlx5_0", "node-a mlx5_1", "node-b mlx5_0", "node-b mlx5_1"}
            # The switches' forwarding tables route every port the fabric has.
            done = await run_tool(a, "ibtracert", "-t", MAD_TIMEOUT, str(a.lid_file(0)),
                                  str(b_lids[1]))
            assert done.returncode == 0, out(done)
            assert '"mokka spine switch (subnet manager)"' in out(done)
            assert (f'To ca {{{b.guid(1)}}} portnum 1 lid {b_lids[1]}-{b_lids[1]} '
                    '"node-b mlx5_1"') in out(done)
            # The spine routes itself, two leaves and four HCAs.
            done = await run_tool(a, "ibroute", "-t", MAD_TIMEOUT, "1")
            assert "7 valid lids dumped" in out(done), out(done)
            done = await run_tool(b, "iblinkinfo", "-t", MAD_TIMEOUT)
            assert done.returncode == 0, out(done)
            assert '"mokka leaf switch node-a"' in out(done)
            assert '"node-a mlx5_1"' in out(done)
            assert '"node-b mlx5_0"' in out(done)

        # node-b goes away: a cable pulled.  Pings time out, its spine port polls.
        await fabric.stop(b)
        assert a.daemon is not None
        await logged(a, "ib relay: node-b went away")
        done = await ping(a, str(b_lids[0]), count=1)
        assert "1 packets transmitted, 0 received, 100% packet loss" in out(done), out(done)
        assert "Connection timed out" in out(done)
        done = await run_tool(a, "ibnetdiscover", "-t", MAD_TIMEOUT)
        assert "node-b mlx5_0" not in out(done)
        assert "node-a mlx5_1" in out(done)

        # Back again, with the same LIDs.
        await fabric.start(b)
        await fabric.linked(a, b, times=2)
        assert [b.lid_file(0), b.lid_file(1)] == b_lids
        async with ping_server(b):
            done = await ping(a, str(b_lids[0]), count=1)
            assert done.returncode == 0, out(done)
            assert "1 received" in out(done)


async def test_three_nodes_see_one_subnet(tmp_path: Path, ib_native: Path) -> None:
    names = ["node-a", "node-b", "node-c"]
    async with fabric_of(tmp_path, ib_native, names) as fabric:
        a, b, c = fabric.nodes
        expected = {f"{n} mlx5_{i}" for n in names for i in range(2)}
        for node in fabric.nodes:
            done = await run_tool(node, "ibnetdiscover", "-t", MAD_TIMEOUT)
            assert done.returncode == 0, out(done)
            assert set(re.findall(r'^Ca\s.*# "([^"]+)"$', out(done), re.M)) == expected
            # Three leaves under one spine.
            assert len(re.findall(r"^Switch\s", out(done), re.M)) == 4
        async with ping_server(c):
            done = await ping(a, "-G", c.guid(0))
            assert done.returncode == 0, out(done)
            assert f"(Lid {c.lid_file(0)})" in out(done)
            done = await ping(b, str(c.lid_file(0)))
            assert "2 received" in out(done), out(done)
        # All LIDs distinct across the three nodes.
        every = [n.lid_file(i) for n in fabric.nodes for i in range(2)]
        assert len(set(every)) == 6
        state = compile_profile(fabric.profile, node_name="node-c", topology=fabric.topology)
        assert lids.fabric_nodes(state) == tuple(names)
