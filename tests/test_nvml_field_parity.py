"""Field values that restate a getter answer what the getter answers.

``nvmlDeviceGetFieldValues`` for the perf policy counters (``NVML_FI_DEV_
PERF_POLICY_*``: the time in ns a policy held the clocks down, an unsigned
long long) and the remapped rows (``NVML_FI_DEV_REMAPPED_*``: counts,
pending and failure flags, unsigned ints) against
``nvmlDeviceGetViolationStatus`` and ``nvmlDeviceGetRemappedRows``, as a
real H100 answers both ways.  The ids and the policy each counter reports
are nvidia-ml-py's constants (NVIDIA's restatement of nvml.h, checked here
against the header): the two totals are policies 10 and 11, not 6 and 7.

Expected figures come from the compiled State: the remapped rows the
profile gives, and which policies grow from the clocks event reasons the
profile (or ``mokka ctl throttle``) makes active, by the mapping
docs/nvml.md documents.  Errors follow the getter's: a GPU fallen off the
bus fails every entry, and a field value call is one guarded call.  Each
check runs in a child interpreter (NVML state is process-global).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from mokka.state.model import Failure, State
from tests.nvml_support import (
    PYNVML_ATTEMPT,
    load_target,
    run_script,
    run_smi,
    state_with_overrides,
    write_config,
)

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(120)]

SUCCESS, NOT_SUPPORTED, GPU_IS_LOST = 0, 3, 15
UNSIGNED_INT, UNSIGNED_LONG_LONG = 1, 3  # NVML_VALUE_TYPE_*

#: Each policy's clocks event reasons (docs/nvml.md, "Violation status"):
#: its time grows while one of them is active.
POLICY_REASONS = {
    "POWER": {"sw_power_cap"},
    "THERMAL": {"sw_thermal_slowdown", "hw_thermal_slowdown"},
    "SYNC_BOOST": {"sync_boost"},
    "BOARD_LIMIT": {"hw_slowdown", "hw_power_brake_slowdown"},
    "LOW_UTILIZATION": {"gpu_idle"},
    "RELIABILITY": set(),
}
POLICY_REASONS["TOTAL_APP_CLOCKS"] = set().union(*POLICY_REASONS.values())
POLICY_REASONS["TOTAL_BASE_CLOCKS"] = (
    POLICY_REASONS["POWER"] | POLICY_REASONS["THERMAL"] | POLICY_REASONS["BOARD_LIMIT"]
)
REMAPPED = ("COR", "UNC", "PENDING", "FAILURE")

#: The child: one command, one JSON document on stdout.
CHILD = r"""
import ctypes, json, sys, time
import pynvml as nv

# The violation times count on CLOCK_REALTIME_COARSE (Linux clock id 5),
# which moves once a kernel tick: reads two ticks apart see it move.
TICK = time.clock_getres(5)

def past_a_tick():
    time.sleep(2 * TICK)

POLICIES = json.loads(sys.argv[2])
REMAPPED = json.loads(sys.argv[3])
POLICY_FIELDS = [getattr(nv, "NVML_FI_DEV_PERF_POLICY_" + p) for p in POLICIES]
REMAP_FIELDS = [getattr(nv, "NVML_FI_DEV_REMAPPED_" + r) for r in REMAPPED]

""" + PYNVML_ATTEMPT + r"""
def fields(h, ids):
    # the C call itself, so a failed call still shows what each entry says
    values = (nv.c_nvmlFieldValue_t * len(ids))()
    for i, field in enumerate(ids):
        values[i].fieldId = field
    fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    ret = fn(h, ctypes.c_int32(len(ids)), ctypes.byref(values))
    out = []
    for v in values:
        value = v.value.ullVal if v.valueType == nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG else (
            v.value.uiVal)
        out.append({"id": v.fieldId, "ret": v.nvmlReturn, "type": v.valueType,
                    "value": value if v.nvmlReturn == 0 else None})
    return {"call": ret, "entries": out}

def violation(h, policy):
    return attempt(lambda: nv.nvmlDeviceGetViolationStatus(h, policy).violationTime)

def remapped(h):
    return attempt(lambda: list(nv.nvmlDeviceGetRemappedRows(h)))

command, index = sys.argv[1], int(sys.argv[4])
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(index)
if command == "violation":
    out = {"ids": POLICY_FIELDS, "rows": []}
    for name, field in zip(POLICIES, POLICY_FIELDS):
        policy = getattr(nv, "NVML_PERF_POLICY_" + name)
        before = violation(h, policy)
        past_a_tick()
        (entry,) = fields(h, [field])["entries"]
        past_a_tick()
        after = violation(h, policy)
        out["rows"].append({"policy": name, "before": before, "field": entry, "after": after})
elif command == "remapped":
    out = {"ids": REMAP_FIELDS, "getter": remapped(h), "fields": fields(h, REMAP_FIELDS)}
elif command == "sequence":
    # guarded calls in turn: a getter, one field value call, a getter, a field value call
    out = [
        violation(h, nv.NVML_PERF_POLICY_TOTAL_APP_CLOCKS),
        fields(h, POLICY_FIELDS + REMAP_FIELDS),
        remapped(h),
        fields(h, POLICY_FIELDS + REMAP_FIELDS),
    ]
nv.nvmlShutdown()
print(json.dumps(out))
"""


def child(native: Path, config: Path, command: str, index: int = 0) -> Any:
    return run_script(native, config, CHILD, command, json.dumps(list(POLICY_REASONS)),
                      json.dumps(REMAPPED), str(index))




def with_gpu(state: State, index: int, **changes) -> State:
    gpus = tuple(attrs.evolve(g, **changes) if g.index == index else g for g in state.gpus)
    return attrs.evolve(state, gpus=gpus)


def test_the_ids_are_nvml_h_s():
    """nvidia-ml-py's ids for the counters and policies are the ones the
    header the library is built against defines."""
    header = load_target("nvml")._exports().find_header().read_text()
    defined = dict(re.findall(r"^#define (NVML_FI_DEV_\w+)\s+(\d+)", header, re.M))
    policies = dict(re.findall(r"^\s*(NVML_PERF_POLICY_\w+)\s*=\s*(\d+)", header, re.M))
    script = (
        "import json, pynvml as nv\n"
        "print(json.dumps({n: getattr(nv, n) for n in json.loads(input())}))"
    )
    names = (
        [f"NVML_FI_DEV_PERF_POLICY_{p}" for p in POLICY_REASONS]
        + [f"NVML_FI_DEV_REMAPPED_{r}" for r in REMAPPED]
        + [f"NVML_PERF_POLICY_{p}" for p in POLICY_REASONS]
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(names),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    bindings = json.loads(result.stdout)
    assert bindings == {n: int(defined.get(n) or policies[n]) for n in names}
    # the counters are 74..81 and 142..145; the totals are policies 10 and 11
    assert [bindings[n] for n in names[:12]] == [*range(74, 82), 142, 143, 144, 145]
    assert [bindings[n] for n in names[12:]] == [0, 1, 2, 3, 4, 5, 10, 11]


@pytest.mark.parametrize("profile", ["h100", "gb200"])
@pytest.mark.parametrize(
    "reasons", [None, "sw_thermal_slowdown", "sw_power_cap,sync_boost", "hw_power_brake_slowdown"]
)
def test_perf_policy_fields_are_the_violation_times(
    native: Path, tmp_path: Path, profile: str, reasons: str | None
):
    calls = [["throttle", "--gpu", "0", "--reasons", reasons]] if reasons else []
    state = state_with_overrides(profile, tmp_path, *calls)
    active = {r for r, on in state.gpus[0].fields["clocks_throttle_reasons"].items() if on}
    assert active == (set(reasons.split(",")) if reasons else {"gpu_idle"})
    got = child(native, write_config(tmp_path, state), "violation")
    growing = []
    for row in got["rows"]:
        field, before, after = row["field"], row["before"], row["after"]
        assert (field["ret"], field["type"]) == (SUCCESS, UNSIGNED_LONG_LONG), row
        # one meter: the field reads between the two getter calls
        assert before <= field["value"] <= after, row
        if POLICY_REASONS[row["policy"]] & active:
            # held down since the library loaded: each read (a tick apart) is ahead
            assert before < field["value"] < after, row
            growing.append(row["policy"])
        else:
            assert before == field["value"] == after == 0, row
    # every scenario holds the application clocks down; the base clocks only
    # for power, thermal and board limits
    assert "TOTAL_APP_CLOCKS" in growing
    assert ("TOTAL_BASE_CLOCKS" in growing) == bool(active & POLICY_REASONS["TOTAL_BASE_CLOCKS"])


def remapped_rows(**rows: Any) -> dict[str, Any]:
    return {
        "correctable": 0,
        "uncorrectable": 0,
        "pending": False,
        "failure_occurred": False,
        **rows,
    }


@pytest.mark.parametrize("profile", ["h100", "gb200"])
def test_remapped_rows_fields_are_the_getter_s(native: Path, tmp_path: Path, profile: str):
    state = state_with_overrides(profile, tmp_path)
    # distinct figures per GPU, so no field can borrow another's
    for gpu in state.gpus:
        block = dict(gpu.fields["remapped_rows"])
        block.update(
            correctable=3 + gpu.index,
            uncorrectable=gpu.index,
            pending=gpu.index % 2 == 1,
            failure_occurred=gpu.index == 2,
        )
        state = with_gpu(state, gpu.index, fields={**gpu.fields, "remapped_rows": block})
    config = write_config(tmp_path, state)
    for gpu in state.gpus:
        rows = gpu.fields["remapped_rows"]
        expected = [
            rows["correctable"],
            rows["uncorrectable"],
            int(rows["pending"]),
            int(rows["failure_occurred"]),
        ]
        got = child(native, config, "remapped", gpu.index)
        assert got["getter"] == expected
        assert got["fields"] == {
            "call": SUCCESS,
            "entries": [
                {"id": field, "ret": SUCCESS, "type": UNSIGNED_INT, "value": value}
                for field, value in zip(got["ids"], expected, strict=True)
            ],
        }


@pytest.mark.parametrize("profile", ["a100", "b200", "gb300", "l40s", "t4"])
def test_remapped_rows_fields_follow_the_getter_on_every_board(
    native: Path, tmp_path: Path, profile: str
):
    """Where the getter answers, the fields answer the same; where the board
    has no row remapper (T4), neither does."""
    state = state_with_overrides(profile, tmp_path)
    got = child(native, write_config(tmp_path, state), "remapped")
    entries = got["fields"]["entries"]
    if "remapped_rows" not in state.gpus[0].fields:
        assert got["getter"] == {"error": NOT_SUPPORTED}
        assert [(f["ret"], f["value"]) for f in entries] == [(NOT_SUPPORTED, None)] * 4
    else:
        assert [(f["ret"], f["type"]) for f in entries] == [(SUCCESS, UNSIGNED_INT)] * 4
        assert [f["value"] for f in entries] == got["getter"]


def test_a_gpu_fallen_off_the_bus_fails_them(native: Path, tmp_path: Path):
    state = with_gpu(state_with_overrides("gb200", tmp_path), 2,
                     failure=Failure(mode="fallen_off_bus"))
    got = child(native, write_config(tmp_path, state), "sequence", 2)
    getter, first, rows, again = got
    assert getter == rows == {"error": GPU_IS_LOST}
    assert first["call"] == again["call"] == GPU_IS_LOST
    # every entry says why, as the getters do
    assert [e["ret"] for e in first["entries"] + again["entries"]] == [GPU_IS_LOST] * 24


def test_a_field_value_call_is_one_guarded_call(native: Path, tmp_path: Path):
    """`after_calls: 2`: a getter and one field value call (twelve fields)
    get through; the next getter and field value call find the GPU lost."""
    state = with_gpu(state_with_overrides("h100", tmp_path), 0,
                     failure=Failure(mode="lost", after_calls=2))
    getter, first, rows, again = child(native, write_config(tmp_path, state), "sequence", 0)
    assert isinstance(getter, int)
    assert first["call"] == SUCCESS
    assert [e["ret"] for e in first["entries"]] == [SUCCESS] * 12
    # the violation times, then the profile's remapped rows
    assert first["entries"][6]["value"] >= getter  # total app clocks: the same meter
    assert [e["value"] for e in first["entries"][8:]] == [0, 0, 0, 0]
    assert rows == {"error": GPU_IS_LOST}
    assert again["call"] == GPU_IS_LOST
    assert [e["ret"] for e in again["entries"]] == [GPU_IS_LOST] * 12


@pytest.mark.parametrize("profile", ["h100", "gb200"])
def test_nvidia_smi_reports_the_remapped_rows_the_fields_give(
    native: Path, smi: Path, tmp_path: Path, profile: str
):
    """The real nvidia-smi 535 reads the getter (its report is the same
    before and after the fields answered); the fields agree with it."""
    state = state_with_overrides(profile, tmp_path)
    block = remapped_rows(correctable=5, uncorrectable=1, pending=True)
    gpu = state.gpus[0]
    state = with_gpu(
        state, 0, fields={**gpu.fields, "remapped_rows": {**gpu.fields["remapped_rows"], **block}}
    )
    config = write_config(tmp_path, state)
    result = run_smi(smi, native, config, "-q", "-i", "0")
    assert result.returncode == 0, result.stdout + result.stderr
    section = re.search(
        r"Remapped Rows\n\s+Correctable Error\s+: (\d+)\n\s+Uncorrectable Error\s+: (\d+)\n"
        r"\s+Pending\s+: (\w+)\n\s+Remapping Failure Occurred\s+: (\w+)\n",
        result.stdout,
    )
    assert section is not None, result.stdout
    smi_rows = [
        int(section[1]),
        int(section[2]),
        int(section[3] == "Yes"),
        int(section[4] == "Yes"),
    ]
    assert smi_rows == [5, 1, 1, 0]
    got = child(native, config, "remapped", 0)
    assert [f["value"] for f in got["fields"]["entries"]] == smi_rows == got["getter"]
