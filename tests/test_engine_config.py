"""The engine config writer: a flat YAML subset the C library parses without a YAML library."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest
import yaml

import mokka.state
from mokka import layout
from mokka.errors import SpecError
from mokka.simulators.gpudriver.engine_config import (
    FORMAT_VERSION,
    MAX_CONFIG_BYTES,
    DeviceBlocks,
    fabric_marker_relative_path,
    nvml_bus_id,
    render_engine_config,
)
from mokka.state.compile import compile_profile
from mokka.state.model import Failure, Xid

PROFILES = Path(mokka.state.__file__).parent / "profiles"
LINE = re.compile(r'^[A-Za-z0-9_.-]+: (-?\d+|-?\d+\.\d+(e[+-]\d+)?|true|false|"([^"\\]|\\.)*")$')


def h100():
    return compile_profile("h100", node_name="worker-1")


@pytest.mark.parametrize("profile", ["h100", "a100", "b200", "gb200", "gb300", "l40s", "t4"])
def test_every_line_is_one_flat_key_and_a_simple_value(profile: str):
    text = render_engine_config(compile_profile(profile, node_name="worker-1"))
    keys = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        assert LINE.match(line), line
        keys.append(line.split(": ", 1)[0])
    assert len(keys) == len(set(keys)), "duplicate keys"
    # Valid YAML too: a flat mapping with the same keys.
    loaded = yaml.safe_load(text)
    assert list(loaded) == keys
    assert loaded["format"] == FORMAT_VERSION


def test_typed_values_resolved_for_the_library():
    state = h100()
    loaded = yaml.safe_load(render_engine_config(state))
    gpu = state.gpus[0]
    assert loaded["device_count"] == 8
    assert loaded["system.driver_version"] == state.system.driver_version
    assert loaded["system.cuda_driver_version"] == state.system.cuda_driver_version
    assert loaded["device.0.uuid"] == gpu.uuid
    assert loaded["device.0.pci.bus_id"] == "00000000:53:00.0"
    assert loaded["device.0.pci.bus_id_legacy"] == "0000:53:00.0"
    assert loaded["device.0.pci.device_id"] == 0x2330  # typed, not the profile's packed 0x233010DE
    assert loaded["device.0.board_id"] == 0x5300
    assert loaded["device.0.cpu_affinity"] == "0-55,112-167"
    assert loaded["device.0.numa_node"] == 0
    assert loaded["device.0.fabric.state"] == "auto"
    assert loaded["device.0.failure.mode"] == "healthy"
    assert loaded["device.0.addressing_mode"] == "hmm"
    # Generic profile fields, flattened; lists get .count and .<i>.
    assert loaded["device.0.clocks.sm_max"] == 1980
    assert loaded["device.0.supported_clocks.memory_clocks.count"] == 2
    assert loaded["device.0.supported_clocks.memory_clocks.1.freq_mhz"] == 1593
    assert loaded["device.0.supported_clocks.memory_clocks.0.graphics_clocks.0"] == 1980
    assert loaded["device.0.processes.count"] == 0
    # NVLink: 18 links per GPU to the four NVSwitches, which the library wires itself.
    assert loaded["device.0.nvlink.link_count"] == 18
    assert loaded["device.0.nvlink.link.0.remote_type"] == "switch"
    assert not any(key.endswith("remote_bus_id") for key in loaded)
    assert loaded["nvlink.switch_count"] == 4
    assert loaded["nvlink.switch.1.bus_id"] == "00000000:06:00.0"


def test_paths_are_relative_to_the_config_directory():
    # no "..": the path must stay inside a bind mount of the driver root alone
    assert fabric_marker_relative_path() == "fabricmanager.ready"
    loaded = yaml.safe_load(render_engine_config(h100()))
    config_dir = layout.ENGINE_CONFIG.rsplit("/", 1)[0]
    resolved = f"{config_dir}/{loaded['paths.fabric_ready_marker']}"
    assert resolved == layout.FABRIC_READY_MIRROR


def test_xids_and_failures_are_carried_by_position():
    state = h100()
    gpus = tuple(
        attrs.evolve(g, failure=Failure(mode="lost", after_calls=2, probability=0.5, seed=3))
        if g.index == 4
        else g
        for g in state.gpus
    )
    state = attrs.evolve(
        state,
        gpus=gpus,
        xids=(Xid(id="a", gpu_index=4, code=79), Xid(id="b", gpu_index=99, code=13)),
    )
    loaded = yaml.safe_load(render_engine_config(state))
    assert loaded["xid_count"] == 1  # the Xid for a GPU that is not staged is dropped
    assert (loaded["xid.0.id"], loaded["xid.0.gpu"], loaded["xid.0.code"]) == ("a", 4, 79)
    assert loaded["device.4.failure.mode"] == "lost"
    assert loaded["device.4.failure.after_calls"] == 2
    assert loaded["device.4.failure.probability"] == 0.5
    assert loaded["device.4.failure.seed"] == 3


def test_strings_are_escaped_and_floats_stay_floats():
    state = h100()
    gpus = (
        attrs.evolve(
            state.gpus[0],
            name='Quote " and \\ backslash',
            fields={**state.gpus[0].fields, "ratio": 1e-05, "bad key": 1},
        ),
        *state.gpus[1:],
    )
    text = render_engine_config(attrs.evolve(state, gpus=gpus))
    loaded = yaml.safe_load(text)
    assert loaded["device.0.name"] == 'Quote " and \\ backslash'
    assert loaded["device.0.ratio"] == 1e-05
    assert not any(key.startswith("device.0.bad") for key in loaded)


@pytest.mark.parametrize("key", ["ends\n", "mid\ndle", "\nstarts", "ends\r", "tab\t", "ünï"])
def test_a_field_name_that_would_break_the_line_is_left_out_with_a_warning(
    key: str, tmp_path, caplog
):
    """Read from a profile file: ``"ends\n": 5`` once matched ``^...$`` (``$`` allows a final
    newline) and split its line in two, so the library read a key without a value."""
    profile = tmp_path / "profile.yaml"
    text = (PROFILES / "h100.yaml").read_text()
    nested = yaml.safe_dump({"device_defaults": {key: 5, "nested": {key: "v", "kept": 1}}})
    body = nested.split("\n", 1)[1]  # the two fields under the existing heading
    profile.write_text(text.replace("device_defaults:\n", "device_defaults:\n" + body, 1))
    with caplog.at_level("WARNING", logger="mokka.simulators.gpudriver.engine_config"):
        text = render_engine_config(compile_profile(profile, node_name="worker-1"))
    for line in text.splitlines():
        assert line.startswith("#") or LINE.match(line), line
    loaded = yaml.safe_load(text)
    assert loaded["device.0.nested.kept"] == 1
    assert loaded["device.7.nested.kept"] == 1
    assert not any(key in name for name in loaded)
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert any(repr(key) in message and "gpu 0" in message for message in left_out), left_out


def test_deterministic_and_pure():
    assert render_engine_config(h100()) == render_engine_config(h100())


def with_fields(state, position: int, **fields):
    """``state`` with profile fields of the GPU at ``position`` set (others kept, in order)."""
    gpu = state.gpus[position]
    gpus = list(state.gpus)
    gpus[position] = attrs.evolve(gpu, fields={**gpu.fields, **fields})
    return attrs.evolve(state, gpus=tuple(gpus))


def test_kept_device_blocks_render_exactly_what_a_fresh_render_does():
    """Each GPU's lines are reused only while its fields are the same in type and order too."""
    blocks = DeviceBlocks()
    base = with_fields(h100(), 1, knob=1, table={"a": 1, "b": [1, 2]})
    fewer = attrs.evolve(base, gpus=base.gpus[:4])
    shifted = attrs.evolve(base, gpus=base.gpus[1:])
    steps = [
        base,
        h100(),  # an equal state compiled again: every block reused
        base,
        with_fields(base, 1, knob=True),  # 1 == True to Python, "true" to the library
        with_fields(base, 1, knob=1.0),
        with_fields(base, 1, table={"b": [1, 2], "a": 1}),  # equal dicts, other key order
        with_fields(base, 1, table={"a": 1, "b": [1, 2.0]}),
        fewer,  # the node shrank: positions past it are dropped
        base,
        shifted,  # every GPU at a new position
        with_fields(base, 7, name_suffix="x"),
    ]
    for step, state in enumerate(steps):
        assert render_engine_config(state, blocks) == render_engine_config(state), step
    assert "device.1.knob: 1\n" in render_engine_config(base, blocks)
    assert "device.1.knob: true\n" in render_engine_config(with_fields(base, 1, knob=True), blocks)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "two\nlines"}, r"device\.0\.name: .*without newlines"),
        # a C1 control: the C reader would take it, but no YAML reader reads the file
        ({"name": "NVIDIA H100\x9b31m"}, r"device\.0\.name: .*without newlines"),
        # a lone surrogate has no UTF-8 spelling, and NVML clients decode names as UTF-8
        ({"name": "NVIDIA \udcffH100"}, r"device\.0\.name: .*expected UTF-8 text"),
        ({"failure": Failure(mode="melted")}, r"gpu 0: failure\.mode: got 'melted'"),
    ],
)
def test_unrepresentable_values_are_refused_naming_the_field(change, message):
    state = h100()
    gpus = (attrs.evolve(state.gpus[0], **change), *state.gpus[1:])
    with pytest.raises(SpecError, match=message):
        render_engine_config(attrs.evolve(state, gpus=gpus))


def test_a_number_the_reader_cannot_take_is_refused_naming_the_field():
    """The reader refuses any value over 4096 bytes, and with it the whole file: every
    client's ``nvmlInit`` would fail.  Strings were checked; integers were not."""
    state = with_fields(h100(), 0, huge=10**4096)  # 4097 digits
    with pytest.raises(SpecError, match=r"device\.0\.huge: a number of 4097 digits, expected "
                                        r"at most 4096"):
        render_engine_config(state)
    assert "device.0.fine: " + "9" * 4096 in render_engine_config(
        with_fields(h100(), 0, fine=10**4096 - 1))


def test_a_config_larger_than_the_library_reads_is_refused():
    """A profile field that expands to millions of lines (here, a long list in each GPU)
    made a config the library refuses whole (over 16 MiB): refused as soon as it passes."""
    long_list = list(range(200_000))
    state = h100()
    state = attrs.evolve(state, gpus=tuple(
        attrs.evolve(gpu, fields={**gpu.fields, "table": long_list}) for gpu in state.gpus))
    with pytest.raises(SpecError) as info:
        render_engine_config(state)
    message = str(info.value)
    assert "expected at most 16777216 (the mock NVML library's limit)" in message
    # refused at the GPU that crossed the line, before the rest was rendered
    assert re.search(r"engine config: \d+ bytes or more by gpu [0-7],", message), message
    assert int(message.split()[2]) > MAX_CONFIG_BYTES
    # just under it is written whole
    fits = attrs.evolve(state, gpus=tuple(
        attrs.evolve(gpu, fields={**gpu.fields, "table": long_list[:50_000]})
        for gpu in state.gpus[:2]))
    assert len(render_engine_config(fits).encode()) < MAX_CONFIG_BYTES


def test_board_id_is_the_profiles_else_domain_and_bus():
    state = h100()
    gpu = state.gpus[0]
    fields = {k: v for k, v in gpu.fields.items() if k != "board_id"}
    derived = attrs.evolve(gpu, bus_id="0008:a1:00.0", fields=fields)
    given = attrs.evolve(gpu, bus_id="0008:a1:00.0", fields={**fields, "board_id": 0x100})
    loaded = yaml.safe_load(
        render_engine_config(attrs.evolve(state, gpus=(derived, given, *state.gpus[2:]))))
    assert loaded["device.0.board_id"] == (0x8 << 16) | (0xA1 << 8)
    assert loaded["device.1.board_id"] == 0x100


@pytest.mark.parametrize("value", ["0x5300", -1, 1 << 32, True])
def test_a_board_id_the_library_cannot_hold_is_refused(value):
    state = h100()
    gpu = attrs.evolve(state.gpus[0], fields={**state.gpus[0].fields, "board_id": value})
    with pytest.raises(SpecError, match=r"gpu 0: board_id: got .*expected an integer"):
        render_engine_config(attrs.evolve(state, gpus=(gpu, *state.gpus[1:])))


def test_nvml_bus_id_spellings():
    assert nvml_bus_id("0000:05:00.0") == "00000000:05:00.0"
    assert nvml_bus_id("0008:a1:00.0") == "00000008:A1:00.0"
    assert nvml_bus_id("b9:00.0") == "00000000:B9:00.0"
