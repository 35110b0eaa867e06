"""The image's IB tools staged into the driver tree by the ib simulator.

The bundle is the one ``deploy/image/install-ib-tools.sh`` builds from the
real Debian packages.  The staged wrappers must run its copies, not the
machine's: every run here hides the machine's own IB tools and libraries (a
private mount namespace), as on a node without ``infiniband-diags`` or
``ibverbs-utils``, and reaches the driver tree at the state root, through
the ``/run/nvidia/driver`` symlink, and through a bind mount there.  Each
test checks that discard restores the root byte for byte (or that a refused
stage wrote nothing).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import trio

from mokka import layout
from mokka.errors import SpecError
from mokka.noderoot.host import Host
from mokka.simulators.ib import IbSettings, IbSimulator
from mokka.simulators.ib.bundle import STAGED_DIR
from tests.ib_support import (
    MAD_TOOL_NAMES,
    NO_TOOLS,
    discard_with_pcibus,
    ib_native_fixture,  # noqa: F401  (a fixture: tests name it ib_native)
    install_ib_tools,
    native_env_fixture,  # noqa: F401  (a fixture: tests name it native_env)
    run_in_mount_namespace,
    stage,
    stage_with_pcibus,
    state_of,
    system_ib_files,
)
from tests.support import snapshot

BIN = layout.DRIVER_BIN.lstrip("/")
STAGED = STAGED_DIR


@pytest.fixture(scope="module")
def ib_tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's tools bundle, built by deploy/image/install-ib-tools.sh
    from the real Debian packages."""
    return install_ib_tools(tmp_path_factory.mktemp("ib-image"))


def hidden_env() -> dict[str, str]:
    """A clean environment for the wrappers, with an empty LD_LIBRARY_PATH."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "MOKKA_"))}
    return {**base, "LD_LIBRARY_PATH": ""}


def run_hidden(argv: list[str], setup: str = "") -> subprocess.CompletedProcess:
    """``argv`` as on a node without IB packages: the machine's own IB tools and
    libraries are hidden (a private mount namespace)."""
    return run_in_mount_namespace(argv, hidden_env(), hide=system_ib_files(), setup=setup)


def staged_files(root: Path) -> dict[str, tuple]:
    return {k: v for k, v in snapshot(root / STAGED.lstrip("/")).items() if v[0] != "dir"}


async def test_the_image_tools_are_staged_and_run_by_the_wrappers(
    node_root: Path, native_env: Path, ib_tools: Path
) -> None:
    before = snapshot(node_root)
    host = Host(node_root)
    state = state_of("h100")
    sim = await stage_with_pcibus(host, state, tools_dir=ib_tools)
    assert sim.readiness.ready
    assert sim.readiness.reason.endswith(
        f"wrappers run the image's tools from {ib_tools}, staged in {STAGED}")
    # bin/ and lib/ are copied byte for byte as siblings (the relative
    # RUNPATHs hold); nothing else of the bundle is staged.
    expected = {
        f"{kind}/{path.name}": ("file", mode, path.read_bytes())
        for kind, mode in (("bin", 0o755), ("lib", 0o644))
        for path in sorted((ib_tools / kind).iterdir())
    }
    assert len(expected) == 22  # 16 tools, 6 libraries
    assert staged_files(node_root) == expected
    for tool in ("ibstat", "ibstatus"):
        text = (node_root / BIN / tool).read_text()
        assert f"\nreal=$here/../local/lib/mokka-ib/bin/{tool}\n" in text
        assert "/usr/sbin" not in text
    assert not (node_root / BIN / "ibv_devinfo").exists()  # full mode only
    # With the machine's own IB tools and libraries hidden, the wrappers
    # list the mock HCAs: they run the staged copies.
    listed = run_hidden([str(node_root / BIN / "ibstat"), "-l"])
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == [f"mlx5_{i}" for i in range(8)]
    card = run_hidden([str(node_root / BIN / "ibstat"), "mlx5_7"])
    assert "CA type: MT4129" in card.stdout
    assert "State: Active" in card.stdout
    status = run_hidden([str(node_root / BIN / "ibstatus"), "mlx5_4"])
    assert "Infiniband device 'mlx5_4' port 1 status:" in status.stdout, status.stderr
    # Converged: a second stage copies nothing again.
    assert not host.converge("ib", sim.plan(state).artifacts).changed
    await discard_with_pcibus(host, sim)
    assert snapshot(node_root) == before


async def test_the_image_mad_tools_reach_the_daemon(
    node_root: Path, native_env: Path, ib_tools: Path
) -> None:
    """The MAD tools come from the bundle too: with the machine's own
    infiniband-diags and libraries hidden, the wrappers run the staged copies
    (libibnetdisc.so.5 included), which reach the mock-ib daemon."""
    before = snapshot(node_root)
    host = Host(node_root)
    state = state_of("gb200")
    sim = await stage_with_pcibus(host, state, tools_dir=ib_tools)
    for tool in MAD_TOOL_NAMES:
        text = (node_root / BIN / tool).read_text()
        assert f"\nreal=$here/../local/lib/mokka-ib/bin/{tool}\n" in text
        assert "/usr/sbin" not in text
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        # In a worker thread: the daemon answers from this event loop.
        sminfo = await trio.to_thread.run_sync(
            run_hidden, [str(node_root / BIN / "sminfo"), "-t", "500"])
        assert sminfo.returncode == 0, sminfo.stderr
        assert "state 3 SMINFO_MASTER" in sminfo.stdout
        discovered = await trio.to_thread.run_sync(
            run_hidden, [str(node_root / BIN / "ibnetdiscover"), "-t", "500"])
        assert discovered.returncode == 0, discovered.stderr
        assert len(re.findall(r"^Ca\s", discovered.stdout, re.M)) == 4
        nursery.cancel_scope.cancel()
    await discard_with_pcibus(host, sim)
    assert snapshot(node_root) == before


async def test_image_tools_in_full_mode_and_through_run_nvidia_driver(
    node_root: Path, native_env: Path, ib_tools: Path
) -> None:
    """ibv_devinfo and ibv_devices from the image, through the driver root, the
    /run/nvidia/driver symlink and a bind mount of the driver root there."""
    before = snapshot(node_root)
    host = Host(node_root)
    state = state_of("gb200")
    sim = await stage_with_pcibus(host, state, mode="full", tools_dir=ib_tools)
    names = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    driver = node_root / layout.DRIVER_ROOT.lstrip("/")
    link = node_root / layout.RUN_DRIVER.lstrip("/")
    link.parent.mkdir(parents=True)
    link.symlink_to("../../var/lib/nvml-mock/driver")
    for top in (driver, link):
        devinfo = run_hidden([str(top / "usr/bin/ibv_devinfo"), "-l"])
        assert devinfo.returncode == 0, devinfo.stderr
        assert devinfo.stdout.split() == ["4", "HCAs", "found:", *names]
        devices = run_hidden([str(top / "usr/bin/ibv_devices")])
        assert re.findall(r"mlx5_\d", devices.stdout) == names, devices.stderr
        assert run_hidden([str(top / "usr/bin/ibstat"), "-l"]).stdout.split() == names
    # A bind mount of the driver root has no ../ib beside it: the wrapper
    # takes the tree at its node path, and says where it looked without one.
    state_root = node_root / layout.STATE_ROOT.lstrip("/")
    bind = (
        "mount -t tmpfs mokka-test /run\n"
        "mkdir -p /run/nvidia/driver\n"
        f"mount --bind {driver} /run/nvidia/driver\n"
    )
    tree = (
        "mount -t tmpfs mokka-test /var/lib\n"
        "mkdir /var/lib/nvml-mock\n"
        f"mount --bind {state_root} /var/lib/nvml-mock\n"
    )
    bound = run_hidden(["/run/nvidia/driver/usr/bin/ibv_devinfo", "-l"], setup=bind + tree)
    assert bound.returncode == 0, bound.stderr
    assert bound.stdout.split() == ["4", "HCAs", "found:", *names]
    lost = run_hidden(["/run/nvidia/driver/usr/bin/ibstat", "-l"], setup=bind)
    assert lost.returncode == 1
    assert "no mock InfiniBand tree at /var/lib/nvml-mock/ib" in lost.stderr
    link.unlink()
    link.parent.rmdir()
    link.parent.parent.rmdir()
    await discard_with_pcibus(host, sim)
    assert snapshot(node_root) == before


async def test_without_the_tools_dir_the_copies_go_and_the_machines_tools_return(
    node_root: Path, ib_tools: Path
) -> None:
    before = snapshot(node_root)
    state = state_of("h100")
    await stage(node_root, state, tools_dir=ib_tools)
    assert len(staged_files(node_root)) == 22
    # The same node staged by a daemon whose image has no bundle.
    sim = await stage(node_root, state, tools_dir=NO_TOOLS)
    assert not (node_root / STAGED.lstrip("/")).exists()
    assert "\nreal=/usr/sbin/ibstatus\n" in (node_root / BIN / "ibstatus").read_text()
    assert "the machine's own /usr/sbin/ibstat" in sim.readiness.reason
    await sim.discard(Host(node_root))
    assert snapshot(node_root) == before


async def test_a_broken_tools_dir_fails_before_anything_is_written(
    node_root: Path, tmp_path: Path, native_env: Path
) -> None:
    broken = tmp_path / "ib-tools"
    (broken / "bin" / "nested").mkdir(parents=True)
    (broken / "bin" / "ibstat").write_text("#!/bin/sh\n")
    sim = IbSimulator(IbSettings(mode="full", tools_dir=broken))
    with pytest.raises(SpecError) as info:
        await sim.stage(Host(node_root), state_of("h100"))
    text = str(info.value)
    assert f"--ib-tools-dir: {broken / 'lib'}: missing, expected a directory" in text
    assert f"{broken / 'bin' / 'nested'}: not a regular file" in text
    for tool in ("ibstatus", "ibv_devinfo", "ibv_devices"):
        assert f"{broken / 'bin'}: no {tool}, expected the tools" in text
    assert "stage failed" in sim.readiness.reason
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("")
    with pytest.raises(SpecError, match="is not a directory"):
        await stage(node_root, state_of("h100"), tools_dir=a_file)
    assert snapshot(node_root) == {}
