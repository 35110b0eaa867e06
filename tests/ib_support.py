"""Shared pieces of the IB tests: the real Debian packages the image's tools
come from, the bundle ``deploy/image/install-ib-tools.sh`` makes of them,
running a command with the machine's own IB tools and libraries hidden (a
private mount namespace with ``/dev/null`` bound over each file), which is
how a node without ``infiniband-diags``/``ibverbs-utils`` looks, and the
shims, states and stage call the ib simulator tests share, and the pieces
of the relay tests: a fabric key, a node's mock-ib in process with its
relay on loopback, bare peer relays, and frames a stranger would send."""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import shlex
import socket
import subprocess
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import yaml

from mokka import layout
from mokka.noderoot.host import Host
from mokka.simulators.ib import IbSettings, IbSimulator, mad, smp
from mokka.simulators.ib.relay import Relay
from mokka.simulators.ib.request import Request
from mokka.simulators.pcibus import PcibusSimulator
from mokka.state.compile import compile_profile
from mokka.state.model import Clique, Domain, State, Topology
from mokka.state.profile import read_profile_text
from tests.nvml_support import compiler, load_target
from tests.support import ROOT, require_tool, snapshot

INSTALL_SCRIPT = ROOT / "deploy" / "image" / "install-ib-tools.sh"
#: Where the bundle lands under DESTDIR (the ib simulator's default --ib-tools-dir).
TOOLS_TARGET = "usr/local/lib/mokka/ib"
#: The packages the script takes (install-system-deps downloads them).
PACKAGES = (
    "infiniband-diags",
    "ibverbs-utils",
    "libibumad3",
    "libibmad5",
    "libibnetdisc5",
    "libibverbs1",
    "libnl-3-200",
    "libnl-route-3-200",
)
#: The infiniband-diags tools that send MADs to the mock-ib daemon.
MAD_TOOL_NAMES = (
    "sminfo", "smpquery", "perfquery", "ibping", "ibnetdiscover", "iblinkinfo",
    "ibaddr", "ibtracert", "ibqueryerrors", "ibroute", "ibportstate", "ibsysstat",
)
#: What the bundle holds: the tools, and the non-glibc closure of the ELF ones.
TOOLS = ("ibstat", "ibstatus", "ibv_devices", "ibv_devinfo", *MAD_TOOL_NAMES)
LIBRARIES = (
    "libibmad.so.5",
    "libibnetdisc.so.5",
    "libibumad.so.3",
    "libibverbs.so.1",
    "libnl-3.so.200",
    "libnl-route-3.so.200",
)
#: The machine's own tools (Debian's paths).
SYSTEM_TOOLS = (
    "/usr/sbin/ibstat",
    "/usr/sbin/ibstatus",
    "/usr/bin/ibv_devinfo",
    "/usr/bin/ibv_devices",
    *(f"/usr/sbin/{name}" for name in MAD_TOOL_NAMES),
)


def ib_tool_debs() -> Path:
    """The directory holding one real .deb of every package in ``PACKAGES``."""
    deb_dir = Path(os.environ.get("MOKKA_IB_DEB_DIR", "/var/cache/mokka/ib-tools"))
    missing = [p for p in PACKAGES if not list(deb_dir.glob(f"{p}_*.deb"))]
    if missing:
        pytest.fail(
            f"no {', '.join(missing)} .deb in {deb_dir}; run ./scripts/install-system-deps "
            "(it downloads them there)"
        )
    return deb_dir


def run_install(
    dest: Path, deb_dir: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``install-ib-tools.sh DESTDIR [DEBDIR]`` with a clean environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RDMA_", "LD_"))}
    args = [str(dest)] + ([str(deb_dir)] if deb_dir is not None else [])
    return subprocess.run(
        ["bash", str(INSTALL_SCRIPT), *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=300,
        check=False,
    )


def install_ib_tools(dest: Path) -> Path:
    """The bundle built from the real packages under ``dest``; returns its directory."""
    require_tool("patchelf")
    done = run_install(dest, ib_tool_debs())
    assert done.returncode == 0, done.stderr
    return dest / TOOLS_TARGET


def system_ib_files() -> list[str]:
    """The machine's own IB tools and the real files behind its IB libraries."""
    cache = subprocess.run(
        ["ldconfig", "-p"], capture_output=True, text=True, check=True
    ).stdout
    files = {os.path.realpath(p) for p in SYSTEM_TOOLS if os.path.exists(p)}
    for line in cache.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.split(" ", 1)[0] in LIBRARIES and os.path.exists(path):
            files.add(os.path.realpath(path))
    return sorted(files)


def run_in_mount_namespace(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    hide: Iterable[str] = (),
    setup: str = "",
) -> subprocess.CompletedProcess[str]:
    """``argv`` in a private mount namespace: ``/dev/null`` bound over every
    path in ``hide``, then the shell commands ``setup``; nothing outlives it."""
    unshare = require_tool("unshare")
    script = "\n".join(
        ["set -e", *(f"mount --bind /dev/null {shlex.quote(p)}" for p in hide), setup,
         'exec "$@"']
    )
    return subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
        capture_output=True,
        text=True,
        env=dict(env),
        timeout=60,
        check=False,
    )


def build_ib_shims(out: Path) -> Path:
    """``libmockfs.so``, ``libibshim.so`` and ``libumadshim.so`` built from the
    current sources into ``out``."""
    load_target("mockfs").build(out, compiler())
    load_target("ibshim").build(out, compiler())
    load_target("umadshim").build(out, compiler())
    return out


def state_of(profile: str | Path, gpus: int | None = None, tmp: Path | None = None) -> State:
    """A built-in profile compiled for ``node-a``, optionally cut to ``gpus`` GPUs."""
    if gpus is None:
        return compile_profile(profile, node_name="node-a")
    assert tmp is not None
    doc = yaml.safe_load(read_profile_text(str(profile))[1])
    doc["system"]["num_devices"] = gpus
    path = tmp / f"{profile}-{gpus}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return compile_profile(path, node_name="node-a")


#: A tools directory that does not exist: the wrappers run the machine's tools
#: (whatever this machine has at the image path).
NO_TOOLS = Path("/nonexistent/mokka-ib-tools")


async def stage(
    root: Path, state: State, mode: str = "auto", tools_dir: Path = NO_TOOLS
) -> IbSimulator:
    sim = IbSimulator(IbSettings(mode=mode, tools_dir=tools_dir))
    await sim.stage(Host(root), state)
    return sim


async def stage_with_pcibus(
    host: Host, state: State, mode: str = "auto", tools_dir: Path = NO_TOOLS
) -> IbSimulator:
    """The PCI bus (whose shim the wrappers preload), then the ib simulator, staged."""
    await PcibusSimulator().stage(host, state)
    return await stage(host.root, state, mode, tools_dir)


async def discard_with_pcibus(host: Host, sim: IbSimulator) -> None:
    """Undo ``stage_with_pcibus``: each simulator removes what its manifest records."""
    await sim.discard(host)
    await PcibusSimulator().discard(host)


# The two fixtures below are imported by the test modules that use them; the
# ``name=`` keeps a test's parameter from shadowing the imported function.


@pytest.fixture(scope="module", name="ib_native")
def ib_native_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``libmockfs.so``, ``libibshim.so`` and ``libumadshim.so`` built from the
    current sources, once per test module."""
    return build_ib_shims(tmp_path_factory.mktemp("ib-native"))


@pytest.fixture(name="native_env")
def native_env_fixture(ib_native: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``ib_native`` as the native directory the simulators load from."""
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(ib_native))
    return ib_native


# --------------------------------------------------------------------------
# The mock-ib daemon: MAD tools, fabrics of real daemons
# --------------------------------------------------------------------------

#: Bound on one MAD tool run; every tool is also given a short MAD timeout.
TOOL_TIMEOUT = 30


def small_profile(tmp: Path, gpus: int = 2, base: str = "h100") -> Path:
    """A built-in profile cut to ``gpus`` GPUs (and so HCAs), as a file."""
    doc = yaml.safe_load(read_profile_text(base)[1])
    doc["system"]["num_devices"] = gpus
    path = tmp / f"{base}-{gpus}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def topology_text(nodes: Sequence[str]) -> str:
    """A topology document with ``nodes`` in one clique: the fabric's node list."""
    return yaml.safe_dump({
        "version": 1,
        "domains": [{"name": "ib-fabric", "uuid": "00000000-0000-0000-0000-00000000feed",
                     "cliques": [{"id": 0, "nodes": list(nodes)}]}],
    })


def _listener_ports() -> range:
    """Ports for listeners started later, outside the kernel's ephemeral range
    (``ip_local_port_range``): a port from ``bind(0)`` could meanwhile become the
    local end of one of the test's own outgoing connections (a relay dialling a
    peer not yet up), and the listener's ``bind`` fail with "address already in
    use"."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # the kernel's default
    return range(max(1024, low - 12000), low) if low > 2048 else range(high + 1, 65536)


def free_port() -> int:
    """A port free now, for a listener a process started later binds."""
    ports = _listener_ports()
    for port in random.sample(ports, min(200, len(ports))):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {ports}")


def tool_env() -> dict[str, str]:
    """The environment a user's shell would give a wrapper (no preloads of ours)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "MOKKA_"))}


# --------------------------------------------------------------------------
# The relay: a fabric key, an in-process node in a fabric, peers and strangers
# --------------------------------------------------------------------------


def write_relay_key(directory: Path, name: str = "relay.key") -> Path:
    """A fresh fabric key (64 hex digits) in ``directory/name``, outside any node root."""
    path = directory / name
    path.write_text(secrets.token_hex(32) + "\n")
    return path


def fabric_state(names: Sequence[str], me: str, profile: str = "gb200") -> State:
    """``profile`` compiled for ``me``, with a topology document listing ``names``."""
    topology = Topology(domains=(Domain(uuid="d", cliques=(Clique(0, tuple(names)),)),),
                        text="")
    return attrs.evolve(compile_profile(profile, node_name=me), topology=topology)


def counter_file(root: Path, hca: int, name: str) -> Path:
    return root / layout.IB_ROOT.lstrip("/") / (
        f"sys/class/infiniband/mlx5_{hca}/ports/1/counters/{name}")


#: Seconds a relay test waits for a log line (a dial, a drop: milliseconds).
LOG_WAIT = 20


@attrs.define(eq=False)
class LogWaiter(logging.Handler):
    """A logging handler that wakes a test when a line containing some text is logged
    (from the trio thread: the relay logs there)."""

    texts: list[str] = attrs.field(factory=list)
    _wanted: list[tuple[str, int, trio.Event]] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        logging.Handler.__init__(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(record.getMessage())
        for wanted, times, event in self._wanted:
            if self.count(wanted) >= times:
                event.set()

    async def wait_for(self, text: str, times: int = 1) -> None:
        """Until ``times`` lines containing ``text`` have been logged (maybe
        already); at most ``LOG_WAIT`` seconds."""
        event = trio.Event()
        self._wanted.append((text, times, event))
        if self.count(text) >= times:
            event.set()
        with trio.fail_after(LOG_WAIT):
            await event.wait()

    def count(self, text: str) -> int:
        return sum(text in seen for seen in self.texts)


@contextmanager
def relay_log() -> Iterator[LogWaiter]:
    """Every line the ib daemon logs (relay and service), while the block runs."""
    waiter = LogWaiter()
    target = logging.getLogger("mokka.simulators.ib")
    old_level = target.level
    target.setLevel(logging.DEBUG)
    target.addHandler(waiter)
    try:
        yield waiter
    finally:
        target.removeHandler(waiter)
        target.setLevel(old_level)


@attrs.define(eq=False)
class RelayNode:
    """A node daemon's ib simulator, staged and running, with its relay on loopback."""

    root: Path
    sim: IbSimulator
    port: int
    state: State


@asynccontextmanager
async def relay_node(root: Path, names: Sequence[str], key_file: Path,
                     peers: Mapping[str, int], port: int | None = None,
                     ) -> AsyncIterator[RelayNode]:
    """``names[0]``'s mock-ib in this process (the PCI bus and the ib tree staged,
    the relay on loopback at ``port`` or a free port, ``peers`` dialled at
    loopback ports); on the way out its root is checked to be as it was."""
    before = snapshot(root)
    host = Host(root)
    state = fabric_state(names, names[0])
    port = port or free_port()
    sim = IbSimulator(IbSettings(
        relay_address="127.0.0.1", relay_port=port, relay_key_file=key_file, tools_dir=NO_TOOLS,
        peers=[f"{name}=127.0.0.1:{p}" for name, p in peers.items()],
    ))
    await PcibusSimulator().stage(host, state)
    await sim.stage(host, state)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, state)
            yield RelayNode(root=root, sim=sim, port=port, state=state)
            nursery.cancel_scope.cancel()
    finally:
        await discard_with_pcibus(host, sim)
    assert snapshot(root) == before


@asynccontextmanager
async def peer_relay(names: Sequence[str], me: int, key_file: Path,
                     addresses: Mapping[int, int], port: int = 0,
                     ) -> AsyncIterator[tuple[Relay, trio.MemoryReceiveChannel[Any]]]:
    """Node ``names[me]``'s relay alone (no MAD service), on loopback: what it
    receives goes to the returned channel, as (peer index, message)."""
    send, receive = trio.open_memory_channel[Any](100)

    async def on_message(peer: int, message: dict[str, Any]) -> None:
        await send.send((peer, message))

    relay = Relay(nodes=tuple(names), me=me, listen=("127.0.0.1", port),
                  addresses={k: ("127.0.0.1", p) for k, p in addresses.items()},
                  own_guids=lambda: {}, on_message=on_message, key_file=key_file)
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.run)
        yield relay, receive
        nursery.cancel_scope.cancel()


def plain_frame(message: object) -> bytes:
    """A message as the relay took it before it had keys: a length and JSON."""
    body = json.dumps(message).encode()
    return len(body).to_bytes(4, "big") + body


def counter_reset(dlid: int, slid: int, origin: int, request_id: int = 1) -> dict[str, Any]:
    """A relay ``req`` carrying a PerfMgt Set of every PortCounter of ``dlid``
    (what ``perfquery -R`` sends), as a peer ``origin`` would send it."""
    request = bytearray(mad.MAD_SIZE)
    request[0:4] = bytes([1, mad.CLASS_PERF, 1, mad.METHOD_SET])
    request[8:16] = (0x1234).to_bytes(8, "big")
    request[16:18] = smp.ATTR_PORT_COUNTERS.to_bytes(2, "big")
    request[64 + 1] = 1  # PortSelect
    request[64 + 2 : 64 + 4] = b"\xff\xff"  # CounterSelect: all
    return Request(id=request_id, origin=origin, slid=slid, mad=bytes(request),
                   dlid=dlid).to_message()


async def ib_tool(root: Path, name: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """A staged MAD tool wrapper of ``root`` (bounded by ``TOOL_TIMEOUT``)."""
    require_tool(name)
    with trio.fail_after(TOOL_TIMEOUT):
        return await trio.run_process(
            [str(root / layout.DRIVER_BIN.lstrip("/") / name), *args], capture_stdout=True,
            capture_stderr=True, check=False, env=tool_env(),
        )
