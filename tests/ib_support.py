"""Shared pieces of the IB tests: the real Debian packages the image's tools
come from, the bundle ``deploy/image/install-ib-tools.sh`` makes of them,
running a command with the machine's own IB tools and libraries hidden (a
private mount namespace with ``/dev/null`` bound over each file), which is
how a node without ``infiniband-diags``/``ibverbs-utils`` looks, and the
shims, states and stage call the ib simulator tests share."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest
import yaml

from mokka.host import Host
from mokka.simulators.ib import IbSettings, IbSimulator
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
    "libibverbs1",
    "libnl-3-200",
    "libnl-route-3-200",
)
#: What the bundle holds: the tools, and the non-glibc closure of the ELF ones.
TOOLS = ("ibstat", "ibstatus", "ibv_devices", "ibv_devinfo")
LIBRARIES = (
    "libibmad.so.5",
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
    """``libmockfs.so`` and ``libibshim.so`` built from the current sources into ``out``."""
    load_target("mockfs").build(out, compiler())
    load_target("ibshim").build(out, compiler())
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
