"""The ``infiniband`` block's text and counts, checked before anything is written.

Its text fields go verbatim into sysfs attributes (``fw_ver``, ``hw_rev``,
``board_id``, ``hca_type``) and its template into ``node_desc``, files that
``ibstat``, libibumad and libibverbs read as one line each.  A control
character or an over-long value must therefore be refused with the profile
file and field named, as must a template whose format spec would build a
huge string or a control character, non-ASCII digits in ``hca_type``, and
more HCAs than the ib simulator's LID layout holds.  Valid profiles stage
exactly the tree they always did, in process and through a real
``python -m mokka daemon --once``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from mokka import layout
from mokka.errors import SpecError
from mokka.noderoot.host import File
from mokka.simulators.ib import lids
from mokka.simulators.ib.hca import pci_device_id, plan_hcas
from mokka.simulators.ib.sysfs import hca_artifacts, tree_artifacts
from mokka.state import profile_blocks
from mokka.state.compile import compile_profile
from mokka.state.model import State
from mokka.state.profile import read_profile_text
from tests.daemon_support import run_mokka
from tests.support import snapshot

pytestmark = pytest.mark.timeout(120)

NODE = "n0"
#: The ib subtree of a node root, and its HCA class in it.
IB = layout.IB_ROOT.lstrip("/")
HCA_CLASS = f"{IB}/sys/class/infiniband"


def profile_with(tmp_path: Path, **infiniband: Any) -> Path:
    """The built-in h100 profile with some ``infiniband`` keys changed, as a file."""
    doc = yaml.safe_load(read_profile_text("h100")[1])
    doc["infiniband"].update(infiniband)
    path = tmp_path / "P.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def refusal(path: Path) -> str:
    """The message of the ``SpecError`` compiling the profile at ``path`` must raise."""
    with pytest.raises(SpecError) as info:
        compile_profile(path, node_name=NODE)
    return str(info.value)


def stage_refusal(state: State) -> str:
    """The message of the ``SpecError`` planning ``state``'s HCAs must raise."""
    with pytest.raises(SpecError) as info:
        plan_hcas(state)
    return str(info.value)


def with_template(state: State, template: str) -> State:
    """``state`` with another node description template, past the profile's checks."""
    assert state.infiniband is not None
    ib = attrs.evolve(state.infiniband, node_desc_template=template)
    return attrs.evolve(state, infiniband=ib)


def attributes(state: State, index: int = 0) -> dict[str, bytes]:
    """HCA ``mlx5_<index>``'s node attribute files (``fw_ver``, ``node_desc``...) by name."""
    hca = plan_hcas(state)[index]
    base = f"/{HCA_CLASS}/{hca.name}/"
    return {
        a.path.removeprefix(base): a.content
        for a in hca_artifacts(hca)
        if isinstance(a, File) and "/" not in a.path.removeprefix(base)
    }


# --------------------------------------------------------------------------
# Text written verbatim into sysfs attributes
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("fw_version", "28.39\n1002"),
        ("hw_rev", "0x0\nX"),
        ("board_id", "MT_1\r2"),
        ("board_id", "MT_\x9b31m"),  # a C1 control (CSI)
        ("fw_version", "28.39.1002\x7f"),  # DEL
        ("hca_type", "MT4129\x00"),
        ("fw_version", "28.39.1002\n"),  # a YAML block scalar's final newline
    ],
)
def test_a_control_character_in_an_attribute_is_refused(
    tmp_path: Path, field: str, value: str
) -> None:
    path = profile_with(tmp_path, **{field: value})
    text = refusal(path)
    assert f"{path}: infiniband.{field}: " in text, text
    assert "holds a control character" in text
    assert "expected text on one line" in text


@pytest.mark.parametrize(
    ("field", "value", "most"),
    [
        ("fw_version", "2" * 32, 31),
        ("hw_rev", "0x" + "0" * 18, 19),
        ("board_id", "MT_" + "9" * 100_000, 64),
        ("board_id", "MT_" + "\u00e9" * 31, 64),  # bytes, not characters: 65 of UTF-8
        ("hca_type", "MT" + "4" * 38, 39),
    ],
)
def test_an_attribute_longer_than_the_kernel_prints_is_refused(
    tmp_path: Path, field: str, value: str, most: int
) -> None:
    path = profile_with(tmp_path, **{field: value})
    text = refusal(path)
    size = len(value.encode())
    assert f"{path}: infiniband.{field}: is {size} bytes long, expected at most {most}" in text
    # the message names the size, it does not carry the value
    assert len(text) < 300


def test_attributes_as_long_as_the_kernel_prints_are_written_as_given(tmp_path: Path) -> None:
    values = {"fw_version": "2" * 31, "hw_rev": "0x" + "a" * 17, "board_id": "MT_" + "8" * 61}
    state = compile_profile(profile_with(tmp_path, **values), node_name=NODE)
    files = attributes(state)
    assert files["fw_ver"] == ("2" * 31 + "\n").encode()
    assert files["hw_rev"] == ("0x" + "a" * 17 + "\n").encode()
    assert files["board_id"] == ("MT_" + "8" * 61 + "\n").encode()


# --------------------------------------------------------------------------
# The node description template
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("{node_name}\r\tmlx5_{idx}\x1b[31m", "holds a control character"),
        # {idx:c} is chr(idx): NUL for mlx5_0, BEL for mlx5_7
        ("{node_name} {idx:c}", "'{idx:c}' turns a number into a character"),
        ("{idx:>300000000}", "'{idx:>300000000}' has a width above 64, expected at most 64"),
        ("{idx:>" + "0" * 200 + "65}", "has a width above 64"),
        ("{node_name:.65}", "'{node_name:.65}' has a precision above 64"),
        # format() reads any script's digits as a width
        ("{idx:>\u0663" + "\u0660" * 8 + "}", "with ASCII digits"),
        ("{idx:{idx}}", "has a format spec other than"),
        ("{node_name} mlx5_{idx", "cannot be parsed"),
        ("{node_name}" + "x" * 250, "is 261 bytes long, expected at most 256"),
    ],
)
def test_a_template_that_cannot_make_a_node_description_is_refused(
    tmp_path: Path, template: str, why: str
) -> None:
    path = profile_with(tmp_path, node_desc_template=template)
    text = refusal(path)
    assert f"{path}: infiniband.node_desc_template: " in text, text
    assert why in text, text


@pytest.mark.parametrize(
    ("template", "first", "last"),
    [
        ("{node_name} mlx5_{idx}", "n0 mlx5_0", "n0 mlx5_7"),
        ("{node_name}-hca{idx:02d}", "n0-hca00", "n0-hca07"),
        ("{idx:=^64}", "=" * 31 + "0" + "=" * 32, "=" * 31 + "7" + "=" * 32),
        ("{node_name:.1}{idx:#x}", "n0x0", "n0x7"),
        # the result is cut to the 64 bytes of an IB NodeDescription
        ("{node_name} " + "x" * 100, "n0 " + "x" * 61, "n0 " + "x" * 61),
    ],
)
def test_a_template_within_bounds_fills_in_as_before(
    tmp_path: Path, template: str, first: str, last: str
) -> None:
    state = compile_profile(profile_with(tmp_path, node_desc_template=template), node_name=NODE)
    assert attributes(state, 0)["node_desc"] == f"{first}\n".encode()
    assert attributes(state, 7)["node_desc"] == f"{last}\n".encode()


def test_the_stage_refuses_a_wide_template_without_building_it() -> None:
    """A state that never went through the profile's checks is checked again."""
    state = with_template(compile_profile("h100", node_name=NODE), "{idx:>1000000}")
    text = stage_refusal(state)
    assert "h100: infiniband.node_desc_template: '{idx:>1000000}' has a width above 64" \
        in text, text


def test_the_stage_refuses_a_character_field() -> None:
    state = with_template(compile_profile("h100", node_name=NODE), "{node_name} {idx:c}")
    text = stage_refusal(state)
    assert "h100: infiniband.node_desc_template: '{idx:c}' turns a number into a " \
        "character" in text, text


def test_a_control_character_from_the_node_name_is_refused() -> None:
    """The template is fine; what it fills in to is not one line."""
    state = compile_profile("h100", node_name="n0\x1b[31m")
    text = stage_refusal(state)
    assert "h100: infiniband.node_desc_template: '{node_name} mlx5_{idx}' fills in to " \
        "'n0\\x1b[31m mlx5_0' for mlx5_0" in text, text
    assert "expected one line without control characters" in text


def test_the_stage_refuses_attribute_text_the_profile_would_have() -> None:
    state = compile_profile("h100", node_name=NODE)
    assert state.infiniband is not None
    ib = attrs.evolve(state.infiniband, fw_version="28.39\n1002", board_id="MT_" + "9" * 65)
    text = stage_refusal(attrs.evolve(state, infiniband=ib))
    assert "h100: infiniband.fw_version: '28.39\\n1002', expected one line of at most " \
        "31 bytes" in text, text
    assert "h100: infiniband.board_id: " in text


# --------------------------------------------------------------------------
# hca_type: ASCII digits only
# --------------------------------------------------------------------------


#: Arabic-Indic, fullwidth and Devanagari 4129: ``\d`` and ``int()`` take them all.
OTHER_DIGITS = ["MT\u0664\u0661\u0662\u0669", "MT\uff14\uff11\uff12\uff19",
                "MT\u096a\u0967\u0968\u096f"]


@pytest.mark.parametrize("hca_type", OTHER_DIGITS)
def test_an_hca_type_with_other_scripts_digits_is_refused(tmp_path: Path, hca_type: str) -> None:
    assert pci_device_id(hca_type) is None
    path = profile_with(tmp_path, hca_type=hca_type)
    text = stage_refusal(compile_profile(path, node_name=NODE))
    assert f"{path}: infiniband.hca_type: {hca_type!r}, expected an mlx5 part name" in text


def test_an_ascii_hca_type_still_names_the_pci_device() -> None:
    assert pci_device_id("MT4129") == 0x1021
    assert pci_device_id(" MT4131 ") == 0x1023
    assert pci_device_id("MT4129x") is None


# --------------------------------------------------------------------------
# HCA counts: the profile's bound is the LID layout's
# --------------------------------------------------------------------------


def test_the_profile_and_the_lid_layout_share_one_hca_limit() -> None:
    assert lids.MAX_HCAS == profile_blocks.MAX_HCAS == 127
    assert lids.BLOCK == profile_blocks.MAX_HCAS + 1


@pytest.mark.parametrize(
    ("field", "value"), [("hca_count", 128), ("hca_count", 200), ("hca_count", 256),
                         ("hcas_per_gpu", 128), ("hcas_per_gpu", 256)]
)
def test_more_hcas_than_a_node_holds_are_refused_up_front(
    tmp_path: Path, field: str, value: int
) -> None:
    path = profile_with(tmp_path, **{field: value})
    text = refusal(path)
    assert f"{path}: infiniband.{field}: {value} is out of range, expected 1..127" in text, text


def test_as_many_hcas_as_a_node_holds_are_planned(tmp_path: Path) -> None:
    state = compile_profile(profile_with(tmp_path, hca_count=127), node_name=NODE)
    hcas = plan_hcas(state)
    assert [h.name for h in hcas][-1] == "mlx5_126"
    assert len({h.lid for h in hcas}) == 127


# --------------------------------------------------------------------------
# Valid profiles: exactly the tree they always staged
# --------------------------------------------------------------------------

#: sha256 of ``repr(tree_artifacts(plan_hcas(...)))`` for the built-ins compiled
#: for node ``n0``, recorded before these checks existed: they must not change
#: a single byte of what a valid profile stages.
PLAN_DIGESTS = {
    "h100": (476, "dcac94d45a31c6e9970755ddd758093d058889c269ceb3ba4d4acb3730fd28ec"),
    "gb200": (240, "65a0f130f672d30991c68e8f2e4c92db791519d22b5c752010b2f15a6d8817cc"),
}
#: The built-ins' node attributes, HCA count and firmware by profile.
BUILTIN_IB = {"h100": (8, "28.39.1002"), "gb200": (4, "28.44.1036")}


@pytest.mark.parametrize("profile", sorted(PLAN_DIGESTS))
def test_builtin_profiles_plan_the_same_tree(profile: str) -> None:
    state = compile_profile(profile, node_name=NODE)
    count, firmware = BUILTIN_IB[profile]
    for index in range(count):
        files = attributes(state, index)
        assert files["fw_ver"] == f"{firmware}\n".encode()
        assert (files["hw_rev"], files["board_id"], files["hca_type"]) == (
            b"0x0\n", b"MT_0000000838\n", b"MT4129\n")
        assert files["node_desc"] == f"{NODE} mlx5_{index}\n".encode()
    artifacts = tree_artifacts(plan_hcas(state))
    digest = hashlib.sha256(repr(artifacts).encode()).hexdigest()
    assert (len(artifacts), digest) == PLAN_DIGESTS[profile]


#: sha256 of the ``snapshot`` of ``sys/class/infiniband`` (448 entries) that
#: ``daemon --once`` staged for h100 on node ``n0``, recorded before these checks.
H100_CLASS_DIGEST = (448, "645c73e76934a8a4aac94e3319a8d2623c894eacf8e552be77eeeb6c4a4aa75f")


def daemon_once(tmp_path: Path, profile: Path) -> tuple[Path, str]:
    """``python -m mokka daemon --once`` on a fresh root: (root, output); checks no traceback."""
    root = tmp_path / "root"
    run = run_mokka("daemon", "--once", "--root", str(root), "--profile", str(profile),
                    "--node-name", NODE, "--health-addr", "127.0.0.1:0", cwd=tmp_path)
    output = run.stdout + run.stderr
    assert "Traceback" not in output, output
    assert run.returncode in (0, 1), output
    return root, output


def test_daemon_once_stages_the_same_h100_sysfs_tree(tmp_path: Path) -> None:
    profile = tmp_path / "P.yaml"
    profile.write_text(read_profile_text("h100")[1], encoding="utf-8")
    root, output = daemon_once(tmp_path, profile)
    assert "stage ib" not in output, output
    tree = snapshot(root / HCA_CLASS)
    for index in range(8):
        assert tree[f"mlx5_{index}/fw_ver"] == ("file", 0o444, b"28.39.1002\n")
        assert tree[f"mlx5_{index}/node_desc"] == ("file", 0o644, f"n0 mlx5_{index}\n".encode())
    digest = hashlib.sha256(repr(sorted(tree.items())).encode()).hexdigest()
    assert (len(tree), digest) == H100_CLASS_DIGEST


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("fw_version", "28.39\n1002", "holds a control character"),
        ("node_desc_template", "{idx:>10000000}", "has a width above 64"),
    ],
)
def test_daemon_once_refuses_the_profile_and_writes_no_hca(
    tmp_path: Path, field: str, value: str, why: str
) -> None:
    profile = profile_with(tmp_path, **{field: value})
    root, output = daemon_once(tmp_path, profile)
    assert f"{profile}: infiniband.{field}: " in output, output
    assert why in output
    assert not (root / HCA_CLASS).exists()
