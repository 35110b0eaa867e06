"""The system's DMI identity in the mock ``/sys``: what GFD's ``gpu.machine`` and
inventory tools read, by a C tool under ``libmockfs.so`` and by a direct read
of the staged tree (what Python and Go readers do), and teardown back to the
tree as it was."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import attrs
import pytest
import yaml

from mokka import layout
from mokka.noderoot.host import Host
from mokka.simulators.pcibus import PcibusSettings, PcibusSimulator
from mokka.simulators.pcibus.dmi import GENERIC, DmiIdentity, board_system, system_identity
from mokka.state.compile import compile_profile
from mokka.state.model import SystemDmi
from mokka.state.profile import BUILTIN_PROFILES, read_profile_text
from tests.support import require_tool, snapshot
from tests.test_pcibus import mockfs_dir, native  # noqa: F401  (fixtures)

FIELDS = ("sys_vendor", "product_name", "product_family", "board_vendor", "board_name")


def cat_under_shim(shim: Path, mock_root: Path, *paths: str) -> subprocess.CompletedProcess:
    """The real ``cat`` of ``paths`` with ``libmockfs.so`` preloaded on its default prefixes."""
    env = {**os.environ, "LD_PRELOAD": str(shim), "MOKKA_MOCKFS_ROOT": str(mock_root)}
    env.pop("MOKKA_MOCKFS_PREFIXES", None)
    return subprocess.run([require_tool("cat"), *paths], env=env, capture_output=True,
                          text=True, timeout=30, check=False)


@pytest.mark.parametrize(
    ("profile", "vendor", "product"),
    [
        ("h100", "NVIDIA", "DGXH100"),
        ("b200", "NVIDIA", "DGXB200"),
        ("gb300", "Supermicro", "ARS-121GL-NB3-LCC-R1"),
        ("gb200", GENERIC.sys_vendor, GENERIC.product_name),
        ("a100", GENERIC.sys_vendor, GENERIC.product_name),
        ("l40s", GENERIC.sys_vendor, GENERIC.product_name),
        ("t4", GENERIC.sys_vendor, GENERIC.product_name),
    ],
)
def test_each_built_in_profile_s_system(profile: str, vendor: str, product: str) -> None:
    identity = system_identity(compile_profile(profile, node_name="worker-1"))
    assert (identity.sys_vendor, identity.product_name) == (vendor, product)


@pytest.mark.timeout(60)
async def test_dmi_reads_the_board_s_system_and_teardown_restores_the_root(
    host: Host, node_root: Path, native: Path  # noqa: F811
) -> None:
    before = snapshot(node_root)
    sim = PcibusSimulator(PcibusSettings(fallback_cpus=4))
    await sim.stage(host, compile_profile("h100", node_name="worker-1"))
    mock_root = node_root / layout.STATE_ROOT.lstrip("/")
    sysfs = mock_root / "sys"

    # A direct read of the staged tree, through the class link as readers open it.
    assert os.readlink(sysfs / "class/dmi/id") == "../../devices/virtual/dmi/id"
    read = {name: (sysfs / "class/dmi/id" / name).read_text() for name in FIELDS}
    assert read == {
        "sys_vendor": "NVIDIA\n", "product_name": "DGXH100\n", "product_family": "DGX\n",
        "board_vendor": "NVIDIA\n", "board_name": "DGXH100\n",
    }
    assert oct((sysfs / "devices/virtual/dmi/id/product_name").stat().st_mode & 0o777) == "0o444"

    # A C tool under the shim sees the same at the real paths, both spellings.
    shown = cat_under_shim(native, mock_root, "/sys/class/dmi/id/product_name",
                           "/sys/devices/virtual/dmi/id/sys_vendor")
    assert (shown.returncode, shown.stdout) == (0, "DGXH100\nNVIDIA\n"), shown.stderr

    await sim.discard(host)
    assert snapshot(node_root) == before


def test_the_profile_s_fields_are_the_attributes_the_tree_writes() -> None:
    assert [f.name for f in attrs.fields(SystemDmi)] == list(FIELDS)
    assert [f.name for f in attrs.fields(DmiIdentity)] == list(FIELDS)


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_a_built_in_profile_s_stated_system_is_the_one_its_board_implies(profile: str) -> None:
    """A profile of its own that copies a built-in board without ``system.dmi`` gets the
    same identity: the board lookup and the built-in profiles agree."""
    state = compile_profile(profile, node_name="worker-1")
    stated = {k: v for k, v in attrs.asdict(state.system.dmi).items() if v is not None}
    assert stated == {k: v for k, v in attrs.asdict(board_system(state)).items() if k in stated}
    assert system_identity(state) == board_system(state)


def profile_with_dmi(tmp_path: Path, dmi: dict[str, str]) -> Path:
    """The h100 profile with ``system.dmi`` replaced by ``dmi``, as a file."""
    _, text = read_profile_text("h100")
    doc = yaml.safe_load(text)
    doc["system"]["dmi"] = dmi
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.timeout(60)
async def test_a_stated_product_name_is_staged_and_the_rest_follows_the_board(
    host: Host, node_root: Path, tmp_path: Path, native: Path  # noqa: F811
) -> None:
    before = snapshot(node_root)
    state = compile_profile(profile_with_dmi(tmp_path, {"product_name": "X"}),
                            node_name="worker-1")
    sim = PcibusSimulator(PcibusSettings(fallback_cpus=4))
    await sim.stage(host, state)
    dmi_dir = node_root / layout.STATE_ROOT.lstrip("/") / "sys/class/dmi/id"
    read = {name: (dmi_dir / name).read_text() for name in FIELDS}
    # the stated field wins; the others are the board's system (8x H100: a DGX H100)
    assert read == {
        "sys_vendor": "NVIDIA\n", "product_name": "X\n", "product_family": "DGX\n",
        "board_vendor": "NVIDIA\n", "board_name": "DGXH100\n",
    }
    await sim.discard(host)
    assert snapshot(node_root) == before


def test_every_stated_field_replaces_the_board_s() -> None:
    state = compile_profile("t4", node_name="worker-1")
    given = SystemDmi(sys_vendor="Amazon EC2", product_name="g4dn.xlarge",
                      product_family="g4dn", board_vendor="Amazon EC2", board_name="n/a")
    stated = attrs.evolve(state, system=attrs.evolve(state.system, dmi=given))
    assert attrs.asdict(system_identity(stated)) == attrs.asdict(given)
    # nothing stated: the board's lookup (a T4 VM is no system Mokka knows)
    assert system_identity(state) == GENERIC
