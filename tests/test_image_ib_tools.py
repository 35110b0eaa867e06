"""deploy/image/install-ib-tools.sh against the real Debian packages.

The script unpacks rdma-core's ``infiniband-diags`` and ``ibverbs-utils``
with the libraries they link into the image's IB tools bundle.  These tests
run it on the real .debs (``scripts/install-system-deps`` downloads them),
check the layout, RUNPATHs and library closure, and run the bundle's tools
against a staged mock tree with the machine's own IB tools and libraries
hidden, which is the node the bundle is for.  Refusals use packages built
with ``dpkg-deb --build``; the bundle as part of the whole payload is
checked by verify-layout.sh in ``test_image_scripts.py``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from mokka import layout
from mokka.noderoot.host import Host
from mokka.simulators.ib.hca import plan_hcas
from mokka.simulators.ib.sysfs import tree_artifacts
from mokka.state.compile import compile_profile
from tests.ib_support import (
    INSTALL_SCRIPT,
    LIBRARIES,
    MAD_TOOL_NAMES,
    PACKAGES,
    TOOLS,
    TOOLS_TARGET,
    ib_tool_debs,
    install_ib_tools,
    run_in_mount_namespace,
    run_install,
    system_ib_files,
)
from tests.image_support import build_deb, debian_arch
from tests.nvml_support import compiler, load_target
from tests.support import require_tool, snapshot

IB_ELF_TOOLS = ("ibstat", "ibv_devices", "ibv_devinfo", *MAD_TOOL_NAMES)
#: What glibc (libc6) provides: never part of the bundle.
GLIBC = re.compile(r"^(libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|ld-linux\S*)\.so")


def print_rpath(path: Path) -> str:
    return subprocess.run(
        [require_tool("patchelf"), "--print-rpath", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout.strip()


@pytest.fixture(scope="module")
def ib_shims(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """libmockfs.so and libibshim.so built from the current sources."""
    out = tmp_path_factory.mktemp("ib-shims")
    load_target("mockfs").build(out, compiler())
    load_target("ibshim").build(out, compiler())
    return out


@pytest.mark.realclient
def test_install_ib_tools_from_the_debian_debs(tmp_path: Path) -> None:
    require_tool("patchelf")
    dest = tmp_path / "payload"
    done = run_install(dest, ib_tool_debs())
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"installed ibstat ibstatus ibv_devinfo ibv_devices sminfo smpquery perfquery ibping "
        r"ibnetdiscover iblinkinfo ibaddr ibtracert ibqueryerrors ibroute ibportstate ibsysstat "
        r"\(rdma-core \d+\.\d+\S*\) with 6 libraries", done.stdout), done.stdout
    tree = snapshot(dest)
    files = {k: v for k, v in tree.items() if v[0] != "dir"}
    bundle = TOOLS_TARGET
    assert set(files) == (
        {f"{bundle}/bin/{t}" for t in TOOLS}
        | {f"{bundle}/lib/{lib}" for lib in LIBRARIES}
        | {f"{bundle}/share/doc/{p}/copyright" for p in PACKAGES}
    )
    for tool in TOOLS:
        assert files[f"{bundle}/bin/{tool}"][1] == 0o755
    for lib in LIBRARIES:
        assert files[f"{bundle}/lib/{lib}"][1] == 0o644
        assert files[f"{bundle}/lib/{lib}"][2][:4] == b"\x7fELF"
        assert print_rpath(dest / bundle / "lib" / lib) == "$ORIGIN"
    assert not [lib for lib in LIBRARIES if GLIBC.match(lib)]
    for tool in IB_ELF_TOOLS:
        assert print_rpath(dest / bundle / "bin" / tool) == "$ORIGIN/../lib"
    # ibstatus is rdma-core's shell script: copied as is.
    assert files[f"{bundle}/bin/ibstatus"][2].startswith(b"#!/bin/sh\n")
    # The loader, with no LD_LIBRARY_PATH, takes every non-glibc library
    # from the bundle, and glibc from the machine.
    lib_dir = (dest / bundle / "lib").resolve()
    for tool in IB_ELF_TOOLS:
        ldd = subprocess.run(
            [require_tool("ldd"), str(dest / bundle / "bin" / tool)], capture_output=True,
            text=True, check=True, env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ""},
        ).stdout
        resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", ldd, re.M))
        assert "not" not in resolved.values(), ldd
        for name, path in resolved.items():
            if GLIBC.match(name):
                assert not Path(path).resolve().is_relative_to(lib_dir), (tool, name)
            else:
                assert Path(path).resolve().parent == lib_dir, (tool, name, path)
    # A second run replaces the bundle with the same one (no stale leftovers).
    (dest / bundle / "lib" / "libstale.so.1").write_bytes(b"stale")
    again = run_install(dest, ib_tool_debs())
    assert again.returncode == 0, again.stderr
    assert snapshot(dest) == tree


@pytest.mark.realclient
def test_installed_ib_tools_run_without_the_machines_copies(
    tmp_path: Path, ib_shims: Path
) -> None:
    """The real proof: with the machine's own IB tools and libraries hidden
    (as on a node without infiniband-diags or ibverbs-utils) and an empty
    LD_LIBRARY_PATH, the bundle's tools list the mock HCAs through the shims."""
    require_tool("ibstat")  # the machine's copy, to show that hiding it works
    tools = install_ib_tools(tmp_path / "payload") / "bin"
    root = tmp_path / "node"
    root.mkdir()
    state = compile_profile("h100", node_name="node-a")
    host = Host(root)
    host.converge("ib-test", tree_artifacts(plan_hcas(state)))
    hide = system_ib_files()
    assert any("libibumad.so" in path for path in hide), hide
    env = {
        "PATH": "/usr/bin:/bin",
        "LD_LIBRARY_PATH": "",
        "LD_PRELOAD": str(ib_shims / "libmockfs.so"),
        "MOKKA_MOCKFS_ROOT": str(root / layout.IB_ROOT.lstrip("/")),
    }
    names = [f"mlx5_{i}" for i in range(8)]
    # The machine's ibstat cannot start once its libraries are hidden.
    libraries = [path for path in hide if ".so" in path]
    system = run_in_mount_namespace(["/usr/sbin/ibstat", "-l"], env, hide=libraries)
    assert system.returncode != 0
    assert "error while loading shared libraries" in system.stderr, system.stderr
    listed = run_in_mount_namespace([str(tools / "ibstat"), "-l"], env, hide=hide)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == names
    cards = run_in_mount_namespace([str(tools / "ibstat")], env, hide=hide)
    assert cards.stdout.count("CA type: MT4129") == 8, cards.stdout
    status = run_in_mount_namespace([str(tools / "ibstatus"), "mlx5_1"], env, hide=hide)
    assert "Infiniband device 'mlx5_1' port 1 status:" in status.stdout, status.stderr
    assert "rate:\t\t 400 Gb/sec (4X NDR)" in status.stdout
    verbs = {**env, "LD_PRELOAD": f"{ib_shims / 'libibshim.so'} {ib_shims / 'libmockfs.so'}"}
    devinfo = run_in_mount_namespace([str(tools / "ibv_devinfo"), "-l"], verbs, hide=hide)
    assert devinfo.returncode == 0, devinfo.stderr
    assert devinfo.stdout.split() == ["8", "HCAs", "found:", *names]
    devices = run_in_mount_namespace([str(tools / "ibv_devices")], verbs, hide=hide)
    assert re.findall(r"(mlx5_\d)\s+([0-9a-f]{16})", devices.stdout) == [
        (f"mlx5_{i}", g[2:]) for i, g in enumerate(state.infiniband.node_guids)
    ]
    host.discard("ib-test")
    assert snapshot(root) == {}


def deb_version(deb: Path) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True, check=True
    ).stdout.strip()


def ib_deb_dir(tmp_path: Path, drop: str | None = None) -> Path:
    """A DEBDIR with links to the real packages, less ``drop``."""
    real = ib_tool_debs()
    out = tmp_path / "debs"
    out.mkdir()
    for package in PACKAGES:
        if package != drop:
            (deb,) = real.glob(f"{package}_*.deb")
            (out / deb.name).symlink_to(deb)
    return out


def rdma_version() -> str:
    (deb,) = ib_tool_debs().glob("infiniband-diags_*.deb")
    return deb_version(deb)


def other_arch() -> str:
    return "s390x" if debian_arch() != "s390x" else "amd64"


@pytest.mark.realclient
@pytest.mark.parametrize(
    ("make", "env", "message"),
    [
        (lambda t: ib_deb_dir(t, drop="libibumad3"), {}, "no libibumad3 .deb (needed: "),
        (
            lambda t: build_deb(ib_deb_dir(t, drop="libibumad3"), "libibumad3", "43.0-1", {}),
            {},
            "libibumad3 is 43.0-1 but infiniband-diags is",
        ),
        (lambda t: ib_deb_dir(t), {"RDMA_CORE_VERSION": "1.0-1"}, "expected the pinned 1.0-1"),
        (
            lambda t: build_deb(
                ib_deb_dir(t, drop="libibumad3"), "libibumad3", rdma_version(), {}, other_arch()
            ),
            {},
            f"architecture {other_arch()}, expected {debian_arch()}",
        ),
        (
            lambda t: build_deb(ib_deb_dir(t), "infiniband-diags", "0.1-1", {}),
            {},
            "more than one infiniband-diags .deb",
        ),
        (
            lambda t: build_deb(
                ib_deb_dir(t, drop="ibverbs-utils"), "ibverbs-utils", rdma_version(),
                {"usr/bin/ibv_devinfo": "#!/bin/sh\n",
                 "usr/share/doc/ibverbs-utils/copyright": "test\n"},
            ),
            {},
            "no executable ibv_devices in the unpacked packages",
        ),
        (
            lambda t: build_deb(
                ib_deb_dir(t, drop="libnl-3-200"), "libnl-3-200", "3.7.0-0.2",
                {"usr/share/doc/libnl-3-200/copyright": "test\n"},
            ),
            {},
            "needs libnl-3.so.200, which none of",
        ),
    ],
    ids=["missing-package", "mixed-versions", "pin", "architecture", "duplicate",
         "missing-tool", "missing-library"],
)
def test_install_ib_tools_refusals(tmp_path: Path, make, env: dict, message: str) -> None:
    make(tmp_path)
    done = run_install(tmp_path / "payload", tmp_path / "debs", env)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    # Nothing lands on a refusal.
    assert not (tmp_path / "payload").exists()


@pytest.mark.realclient
def test_install_ib_tools_usage(tmp_path: Path) -> None:
    done = run_install(tmp_path / "payload", tmp_path / "debs", {"X": "1"})
    assert done.returncode != 0
    assert "debs: no such directory" in done.stderr
    usage = subprocess.run(
        ["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True
    )
    assert usage.returncode != 0
    assert "usage: install-ib-tools.sh DESTDIR [DEBDIR]" in usage.stderr
