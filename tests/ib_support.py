"""Shared pieces of the IB tests: the real Debian packages the image's tools
come from, the bundle ``deploy/image/install-ib-tools.sh`` makes of them,
running a command with the machine's own IB tools and libraries hidden (a
private mount namespace with ``/dev/null`` bound over each file), which is
how a node without ``infiniband-diags``/``ibverbs-utils`` looks, and the
shims, states and stage call the ib simulator tests share."""

from __future__ import annotations

import os
import random
import shlex
import socket
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest
import yaml

from mokka.host import Host
from mokka.simulators.ib import IbSettings, IbSimulator
from mokka.simulators.pcibus import PcibusSimulator
from mokka.state.compile import compile_profile
from mokka.state.model import State
from mokka.state.profile import read_profile_text
from tests.nvml_support import compiler, load_target
from tests.support import ROOT, require_tool

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
