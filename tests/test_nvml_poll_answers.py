"""What the polling calls answer from values resolved once per config snapshot.

A health loop polls its event set with a zero timeout, and a poll of a
snapshot already scanned answers without scanning again: a Xid that comes
with a new snapshot, and a fall off the bus that trips within the same
snapshot, must still be delivered by the very next poll.  The stamps that
come without a clock read of their own (field values and violation status:
the call's coarse clock) must still be the wall clock of the call, within
one kernel tick.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.nvml_support import state_with_overrides, write_config
from tests.test_nvml_events import GPU_IS_LOST, TIMEOUT, XID_CRITICAL_ERROR, Configs, run_client
from tests.test_nvml_samples import run_pynvml

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(60)]


def test_polls_of_a_scanned_snapshot_still_hear_new_xids_and_falls(native: Path,
                                                                   tmp_path: Path):
    configs = Configs(tmp_path)
    idle = configs.after()
    # GPU 6 falls at its third guarded call in this process: no new snapshot tells
    triggered = configs.after(["fail", "--gpu", "6", "--mode", "fallen_off_bus",
                               "--after-calls", "2"])
    injected = configs.after(["fail", "--gpu", "6", "--mode", "fallen_off_bus",
                              "--after-calls", "2"], ["xid", "--gpu", "0", "--code", "48"])
    got = run_client(native, tmp_path, idle, [
        ["create", "set"], ["register", "set", list(range(8))],
        ["wait", "set", 0], ["wait", "set", 0],
        ["swap", triggered], ["wait", "set", 0], ["wait", "set", 0],
        ["call", 6], ["call", 6], ["wait", "set", 0], ["call", 6],
        ["wait", "set", 0], ["wait", "set", 0],
        ["swap", injected], ["wait", "set", 0], ["wait", "set", 0],
        ["free", "set"],
    ])
    assert got == [
        [0] * 8, TIMEOUT, TIMEOUT,
        TIMEOUT, TIMEOUT,
        0, 0, TIMEOUT, GPU_IS_LOST,
        [6, XID_CRITICAL_ERROR, 79], TIMEOUT,
        [0, XID_CRITICAL_ERROR, 48], TIMEOUT,
    ]


#: h100's memory temperature (its profile's thermal block).
MEMORY_C = 37

STAMPS = """
handle = nv.nvmlDeviceGetHandleByIndex(0)
rows = []
for _ in range(3):
    before = time.time()
    value = nv.nvmlDeviceGetFieldValues(handle, [nv.NVML_FI_DEV_MEMORY_TEMP])[0]
    violation = nv.nvmlDeviceGetViolationStatus(handle, nv.NVML_PERF_POLICY_POWER)
    after = time.time()
    rows.append([before, after, value.timestamp, violation.referenceTime,
                 value.nvmlReturn, value.value.uiVal])
    time.sleep(0.05)
print(json.dumps(rows))
"""


def test_field_and_violation_stamps_are_the_wall_clock_of_the_call(native: Path,
                                                                   node_root: Path):
    config = write_config(node_root, state_with_overrides("h100", node_root))
    memory = f"device.0.thermal.temperature_memory_c: {MEMORY_C}\n"
    assert memory in config.read_text()
    rows = run_pynvml(native, config, STAMPS)
    assert len(rows) == 3
    # both stamps are the call's clock, CLOCK_REALTIME_COARSE (Linux clock id
    # 5): behind the caller's clock by at most one kernel tick, plus a margin
    # for a tick handled late on a busy machine
    tick = time.clock_getres(5) + 0.005
    for before, after, field_us, reference_us, code, memory_c in rows:
        assert (code, memory_c) == (0, MEMORY_C)  # resolved once per snapshot
        assert before - tick <= field_us / 1e6 <= after
        assert before - tick <= reference_us / 1e6 <= after
    assert rows[0][2] < rows[1][2] < rows[2][2]
    assert rows[0][3] < rows[1][3] < rows[2][3]
