"""Performance states and encoder capacity (native/nvml/pstates.c, encoder.c).

Through nvidia-ml-py and ctypes on every built-in profile: the states a
board lists (P0 and P8, and any state the profile names), the clock range
of each (a state is a memory clock of the supported clocks table), and the
free NVENC capacity of the boards whose profile has an ``encoder`` block
(T4: H.264 and H.265; L40S: those and AV1), NOT_SUPPORTED on the rest.  nvidia-smi 535 asks for
none of these three (they are not among the NVML names it resolves, and no
`-q` section prints them), so nvidia-ml-py is the client here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mokka.state.compile import compile_profile
from mokka.state.profile import BUILTIN_PROFILES, load_profile, read_profile_text
from tests.engine_config_oracle import parse_engine_config
from tests.nvml_support import PYNVML_ATTEMPT, run_script, state_with_overrides, write_config

NOT_SUPPORTED, INVALID_ARGUMENT, INSUFFICIENT_SIZE, GPU_IS_LOST = 3, 2, 7, 15
PSTATE_UNKNOWN = 32
#: Codecs (NVML_ENCODER_QUERY_*: H264 0, HEVC 1, AV1 2) of the boards with
#: NVENC, from their datasheets; every other built-in board has none.
NVENC_CODECS = {"t4": {0, 1}, "l40s": {0, 1, 2}}
#: Their NVENC engines (T4 datasheet: 1 NVENC; L40S datasheet: 3 NVENC).
NVENC_ENGINES = {"t4": 1, "l40s": 3}

PROBE = r"""
import ctypes, json
import pynvml as nv

""" + PYNVML_ATTEMPT + r"""
lib = ctypes.CDLL("libnvidia-ml.so.1")
nv.nvmlInit()
out = []
for index in range(nv.nvmlDeviceGetCount()):
    h = nv.nvmlDeviceGetHandleByIndex(index)
    ranges = {}
    for state in list(range(16)) + [16, 32]:
        row = []
        for clock in range(5):
            lo, hi = ctypes.c_uint(0), ctypes.c_uint(0)
            r = lib.nvmlDeviceGetMinMaxClockOfPState(h, clock, state, ctypes.byref(lo),
                                                     ctypes.byref(hi))
            row.append([lo.value, hi.value] if r == 0 else {"error": r})
        ranges[state] = row
    lo = ctypes.c_uint(0)
    only_min = lib.nvmlDeviceGetMinMaxClockOfPState(h, 0, 0, ctypes.byref(lo), None)
    neither = lib.nvmlDeviceGetMinMaxClockOfPState(h, 0, 0, None, None)
    small = (ctypes.c_uint * 16)(*([99] * 16))
    short = lib.nvmlDeviceGetSupportedPerformanceStates(h, small, 4)
    out.append({
        "pstates": attempt(lambda: nv.nvmlDeviceGetSupportedPerformanceStates(h)),
        "current": attempt(lambda: nv.nvmlDeviceGetPerformanceState(h)),
        "ranges": ranges,
        "only_min": [only_min, lo.value],
        "neither": neither,
        "short": [short, list(small)],
        "null": lib.nvmlDeviceGetSupportedPerformanceStates(h, None, 64),
        "encoder": [attempt(lambda: nv.nvmlDeviceGetEncoderCapacity(h, q)) for q in (0, 1, 2)],
        "encoder_bad_type": attempt(lambda: nv.nvmlDeviceGetEncoderCapacity(h, 3)),
        "encoder_null": lib.nvmlDeviceGetEncoderCapacity(h, 0, None),
    })
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def answers(native: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each built-in profile's config entries and the probe's answers, once per module."""
    out = {}
    for profile in BUILTIN_PROFILES:
        config = write_config(tmp_path_factory.mktemp(profile),
                              compile_profile(profile, node_name="worker-1"))
        parsed = parse_engine_config(config.read_bytes())
        assert parsed is not None
        values = {k.decode(): v.decode() for k, v in parsed.items()}
        out[profile] = values, run_script(native, config, PROBE)
    return out


def memory_table(values: dict[str, str], index: int) -> dict[int, list[int]]:
    """The supported clocks table of GPU ``index``: memory clock -> its graphics clocks."""
    base = f"device.{index}.supported_clocks.memory_clocks"
    table = {}
    for i in range(int(values[f"{base}.count"])):
        graphics = f"{base}.{i}.graphics_clocks"
        table[int(values[f"{base}.{i}.freq_mhz"])] = [
            int(values[f"{graphics}.{j}"]) for j in range(int(values[f"{graphics}.count"]))
        ]
    return table


def expected_ranges(values: dict[str, str], index: int, state: int) -> list[list[int]]:
    """Graphics, SM, memory and video ranges of a state the board has."""
    table = memory_table(values, index)
    memory = max(table) if state == 0 else min(table)
    graphics = [min(table[memory]), max(table[memory])]
    video = [int(values[f"device.{index}.clocks.video_current"]),
             int(values[f"device.{index}.clocks.video_max"])]
    return [graphics, graphics, [memory, memory], video]


def idle_state(values: dict[str, str], index: int) -> int:
    return int(values[f"device.{index}.performance_state"][1:])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_performance_states_and_their_clock_ranges(answers, profile: str):
    values, got = answers[profile]
    assert len(got) == int(values["device_count"]) > 0
    for index, dev in enumerate(got):
        states = sorted({0, 8, idle_state(values, index)})
        assert dev["pstates"] == states, f"GPU {index}"
        assert dev["current"] in states
        for state in range(16):
            row = dev["ranges"][str(state)]
            if state in states:
                assert row[:4] == expected_ranges(values, index, state), (index, state)
                assert row[0][0] < row[0][1]  # a range, not a point
            else:
                assert row[:4] == [{"error": NOT_SUPPORTED}] * 4, (index, state)
            assert row[4] == {"error": INVALID_ARGUMENT}  # NVML_CLOCK_COUNT is no clock
        for bad in ("16", "32"):
            assert dev["ranges"][bad] == [{"error": INVALID_ARGUMENT}] * 5
        # either output may be NULL; both NULL is an invalid call
        assert dev["only_min"] == [0, expected_ranges(values, index, 0)[0][0]]
        assert dev["neither"] == INVALID_ARGUMENT
        # `size` is in bytes: room for one state is too small, and nothing is written
        assert dev["short"] == [INSUFFICIENT_SIZE, [99] * 16]
        assert dev["null"] == INVALID_ARGUMENT


FULL_LIST = r"""
import ctypes, json
lib = ctypes.CDLL("libnvidia-ml.so.1")
assert lib.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
states = (ctypes.c_uint * 20)(*([99] * 20))
r = lib.nvmlDeviceGetSupportedPerformanceStates(h, states, 20 * 4)
print(json.dumps([r, list(states)]))
"""


def test_unused_entries_are_unknown_and_the_list_stops_at_sixteen(native: Path, tmp_path: Path):
    """A larger array gets NVML_PSTATE_UNKNOWN after the states, for at most 16 entries."""
    config = write_config(tmp_path, compile_profile("t4", node_name="worker-1"))
    r, states = run_script(native, config, FULL_LIST)
    assert r == 0
    assert states == [0, 8] + [PSTATE_UNKNOWN] * 14 + [99] * 4


def test_a_state_an_override_names_is_listed(native: Path, tmp_path: Path):
    state = state_with_overrides("t4", tmp_path, ["pstate", "--gpu", "0", "--state", "P2"])
    config = write_config(tmp_path / "root", state)
    got = run_script(native, config, PROBE)
    assert got[0]["current"] == 2
    assert got[0]["pstates"] == [0, 2, 8]
    # every state below P0 runs the lowest memory clock
    assert got[0]["ranges"]["2"] == got[0]["ranges"]["8"]


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_encoder_capacity_on_boards_with_nvenc(answers, profile: str):
    values, got = answers[profile]
    codecs = NVENC_CODECS.get(profile, set())
    for index, dev in enumerate(got):
        busy = int(values[f"device.{index}.utilization.encoder"])
        assert dev["encoder"] == [
            100 - busy if codec in codecs else {"error": NOT_SUPPORTED} for codec in (0, 1, 2)
        ], f"GPU {index}"
        assert dev["encoder_bad_type"] == {"error": INVALID_ARGUMENT}
        assert dev["encoder_null"] == INVALID_ARGUMENT


def test_every_board_with_nvenc_is_a_built_in_profile():
    assert set(NVENC_CODECS) <= set(BUILTIN_PROFILES)


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_the_profiles_state_the_datasheets_encoders(profile: str):
    """T4: one NVENC; L40S: three (their datasheets); the other boards have none."""
    words = {"h264": 0, "hevc": 1, "av1": 2}
    for device in load_profile(profile).devices:
        encoder = device.config.get("encoder")
        if profile not in NVENC_CODECS:
            assert encoder is None
            continue
        assert {words[c] for c in encoder["codecs"]} == NVENC_CODECS[profile]
        assert encoder["engines"] == NVENC_ENGINES[profile]


def with_encoder(tmp_path: Path, profile: str, encoder: dict[str, Any] | None) -> Path:
    """A built-in profile with its ``encoder`` block replaced (``None``: removed), as a file."""
    _, text = read_profile_text(profile)
    doc = yaml.safe_load(text)
    doc["device_defaults"].pop("encoder", None)
    if encoder is not None:
        doc["device_defaults"]["encoder"] = encoder
    path = tmp_path / f"{profile}-encoder.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(
    ("profile", "encoder", "answering"),
    [
        # an H100 given an AV1-only NVENC answers for AV1 alone: the field decides,
        # not the PCI device id
        ("h100", {"engines": 1, "codecs": ["av1"]}, {2}),
        # a T4 without the block answers for no codec
        ("t4", None, set()),
    ],
)
def test_the_encoder_field_decides_which_codecs_answer(
    native: Path, tmp_path: Path, profile: str, encoder: dict[str, Any] | None,
    answering: set[int],
):
    state = compile_profile(with_encoder(tmp_path, profile, encoder), node_name="worker-1")
    config = write_config(tmp_path / "root", state)
    got = run_script(native, config, PROBE)
    busy = int(state.gpus[0].fields["utilization"]["encoder"])
    for dev in got:
        assert dev["encoder"] == [
            100 - busy if codec in answering else {"error": NOT_SUPPORTED}
            for codec in (0, 1, 2)
        ]


LOST = r"""
import ctypes, json
lib = ctypes.CDLL("libnvidia-ml.so.1")
assert lib.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
states = (ctypes.c_uint * 16)()
lo, hi, cap = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
print(json.dumps([
    lib.nvmlDeviceGetSupportedPerformanceStates(h, states, 64),
    lib.nvmlDeviceGetMinMaxClockOfPState(h, 0, 0, ctypes.byref(lo), ctypes.byref(hi)),
    lib.nvmlDeviceGetEncoderCapacity(h, 0, ctypes.byref(cap)),
]))
"""


def test_a_lost_gpu_fails_every_query(native: Path, tmp_path: Path):
    state = state_with_overrides("t4", tmp_path, ["fail", "--gpu", "0", "--mode", "lost"])
    config = write_config(tmp_path / "root", state)
    assert run_script(native, config, LOST) == [GPU_IS_LOST] * 3
