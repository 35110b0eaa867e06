"""An injected uncorrectable ECC error is node state that every process agrees on.

``mokka ctl fail --mode ecc_uncorrectable`` gives the GPU one double-bit
error in its memory: the uncorrectable counters of device memory count it
(volatile and aggregate), an Ampere or later board has its row pending a
remap, a Turing board its page pending retirement, and each event set
registered for double-bit errors on the GPU before the injection gets one
``nvmlEventTypeDoubleBitEccError``, in every process.  However many calls a
process makes, the counts stay where they are, so two processes reading at
the same instant agree.  Through nvidia-ml-py in processes running side by
side, ctypes for the events, and the real nvidia-smi 535.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mokka.simulators.gpudriver.engine_config import render_engine_config
from tests.nvml_support import nvml_env, run_smi, state_with_overrides, write_config

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(120)]

TIMEOUT = 10
DOUBLE_BIT_ECC, XID_CRITICAL_ERROR = 0x2, 0x8
#: What the device plugin registers: Xids, double- and single-bit ECC errors.
PLUGIN_EVENTS = 0xB

#: Reads the uncorrectable counts of GPU 0 and (when the node has one) GPU 1
#: argv[1] times, making argv[2] other guarded calls between reads, and
#: prints each read.
READER = r"""
import json, sys, pynvml as nv
reads, busy = int(sys.argv[1]), int(sys.argv[2])
nv.nvmlInit()
def attempt(call):
    try:
        return call()
    except nv.NVMLError as e:
        return {"error": e.value}
def counts(h):
    unc = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    field = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_ECC_DBE_VOL_TOTAL])[0]
    return {
        "volatile": nv.nvmlDeviceGetTotalEccErrors(h, unc, nv.NVML_VOLATILE_ECC),
        "aggregate": nv.nvmlDeviceGetTotalEccErrors(h, unc, nv.NVML_AGGREGATE_ECC),
        "device_memory": nv.nvmlDeviceGetMemoryErrorCounter(
            h, unc, nv.NVML_VOLATILE_ECC, nv.NVML_MEMORY_LOCATION_DEVICE_MEMORY),
        "field": field.value.ullVal,
        "remapped_rows": attempt(lambda: list(nv.nvmlDeviceGetRemappedRows(h))),
        "retired": attempt(lambda: list(nv.nvmlDeviceGetRetiredPages(
            h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))),
        "retired_pending": attempt(lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h)),
    }
handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(min(2, nv.nvmlDeviceGetCount()))]
out = []
for _ in range(reads):
    out.append([counts(h) for h in handles])
    for _ in range(busy):
        nv.nvmlDeviceGetTemperature(handles[0], nv.NVML_TEMPERATURE_GPU)
print(json.dumps(out))
"""

#: Answers one JSON step a line: ``create NAME``, ``register NAME MASK GPU``,
#: ``wait NAME MS`` (the event as [gpu, type, data], or the error code).
EVENTS = r"""
import ctypes, json, sys

class Event(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong),
                ("eventData", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]

lib = ctypes.CDLL("libnvidia-ml.so.1")
assert lib.nvmlInit_v2() == 0
handles = [ctypes.c_void_p() for _ in range(2)]
for index, handle in enumerate(handles):
    assert lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0
index_of = {handle.value: index for index, handle in enumerate(handles)}
sets = {}
print(json.dumps("ready"), flush=True)
for line in sys.stdin:
    verb, name, *args = json.loads(line)
    if verb == "create":
        sets[name] = ctypes.c_void_p()
        answer = lib.nvmlEventSetCreate(ctypes.byref(sets[name]))
    elif verb == "register":
        mask, gpu = args
        answer = lib.nvmlDeviceRegisterEvents(handles[gpu], ctypes.c_ulonglong(mask), sets[name])
    else:
        event = Event()
        code = lib.nvmlEventSetWait_v2(sets[name], ctypes.byref(event), args[0])
        answer = ([index_of[event.device], event.eventType, event.eventData,
                   event.gpuInstanceId] if code == 0 else code)
    print(json.dumps(answer), flush=True)
for event_set in sets.values():
    assert lib.nvmlEventSetFree(event_set) == 0
assert lib.nvmlShutdown() == 0
"""


def injected(profile: str, where: Path, *flags: str) -> Path:
    """The engine config of a ``profile`` node whose GPU 0 has an injected error."""
    where.mkdir()
    state = state_with_overrides(
        profile, where, ["fail", "--gpu", "0", "--mode", "ecc_uncorrectable", *flags])
    return write_config(where / "root", state)


@pytest.mark.parametrize(("profile", "flags"), [
    ("h100", []),
    ("t4", []),
    # the triggers count one process's calls: they do not apply to node state
    ("h100", ["--after-calls", "30", "--probability", "0.5", "--seed", "3"]),
], ids=["h100", "t4", "h100-triggers"])
def test_processes_reading_side_by_side_agree_and_no_count_moves(
    native: Path, tmp_path: Path, profile: str, flags: list[str]
):
    config = injected(profile, tmp_path / profile, *flags)
    # one process reads between a burst of other calls, one reads back to back
    readers = [subprocess.Popen([sys.executable, "-c", READER, "20", str(busy)],
                                env=nvml_env(native, config), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for busy in (50, 0)]
    answers = []
    for reader in readers:
        out, err = reader.communicate(timeout=60)
        assert reader.returncode == 0, err
        answers.append(json.loads(out))
    first = answers[0][0]
    assert all(read == first for answer in answers for read in answer)
    injected_gpu = first[0]
    for key in ("volatile", "aggregate", "device_memory", "field"):
        assert injected_gpu[key] == 1, key
    if profile == "h100":  # Hopper remaps the row at the next reset
        healthy = first[1]  # the next GPU of the node: nothing injected there
        assert [healthy[key] for key in ("volatile", "aggregate", "device_memory")] == [0, 0, 0]
        assert injected_gpu["remapped_rows"] == [0, 1, 1, 0]
        assert healthy["remapped_rows"] == [0, 0, 0, 0]
        assert injected_gpu["retired"] == {"error": 3}  # NOT_SUPPORTED: no page retirement
    else:  # Turing (one GPU on the node) retires the page at the next reset
        assert len(injected_gpu["retired"]) == 1
        assert injected_gpu["retired_pending"] == 1
        assert injected_gpu["remapped_rows"] == {"error": 3}


class EventClient:
    """One process answering EVENTS steps against the engine config ``config``."""

    def __init__(self, native: Path, config: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", EVENTS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
            env=nvml_env(native, config, MOCK_NVML_RECHECK_INTERVAL_MS="0"))
        assert self.step() == "ready"

    def step(self, *command: object) -> object:
        if command:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, self.process.stderr.read() if self.process.stderr else ""
        return json.loads(line)

    def close(self) -> None:
        """End the process (its stdin ends); it must have exited cleanly."""
        assert self.process.stdin is not None
        assert self.process.stderr is not None
        if not self.process.stdin.closed:
            self.process.stdin.close()
        returncode = self.process.wait(timeout=30)
        err = self.process.stderr.read()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        assert returncode == 0, err


def place(source: Path, config: Path) -> None:
    """Swap ``source`` in as the engine config, as the daemon does (rename)."""
    shutil.copyfile(source, config.with_suffix(".next"))
    os.replace(config.with_suffix(".next"), config)


@pytest.mark.timeout(60)
def test_one_double_bit_event_per_injection_to_each_set_in_every_process(
    native: Path, tmp_path: Path
):
    idle_where = tmp_path / "idle"
    idle_where.mkdir()
    healthy = idle_where / "config.yaml"
    healthy.write_text(render_engine_config(state_with_overrides("h100", idle_where)))
    broken = injected("h100", tmp_path / "injected")
    config = write_config(tmp_path / "node", state_with_overrides("h100", idle_where))
    clients = [EventClient(native, config) for _ in range(2)]
    try:
        for client in clients:
            for name, mask, gpu in (("ecc", DOUBLE_BIT_ECC, 0), ("plugin", PLUGIN_EVENTS, 0),
                                    ("xid", XID_CRITICAL_ERROR, 0), ("other", DOUBLE_BIT_ECC, 1)):
                assert client.step("create", name) == 0
                assert client.step("register", name, mask, gpu) == 0
        place(broken, config)
        event = [0, DOUBLE_BIT_ECC, 0, 0xFFFFFFFF]  # no Xid code, no MIG instance
        for client in clients:
            assert client.step("wait", "ecc", 2000) == event
            assert client.step("wait", "ecc", 0) == TIMEOUT  # once
            assert client.step("wait", "plugin", 2000) == event
            assert client.step("wait", "plugin", 0) == TIMEOUT
            assert client.step("wait", "xid", 100) == TIMEOUT  # no Xid by itself
            assert client.step("wait", "other", 100) == TIMEOUT  # another GPU
            # a set registered after the injection does not record it
            assert client.step("create", "late") == 0
            assert client.step("register", "late", DOUBLE_BIT_ECC, 0) == 0
            assert client.step("wait", "late", 100) == TIMEOUT
        # healed (``mokka ctl reset``), then injected again: a new error
        place(healthy, config)
        for client in clients:
            assert client.step("wait", "ecc", 0) == client.step("wait", "late", 0) == TIMEOUT
        place(broken, config)
        for client in clients:
            assert client.step("wait", "late", 2000) == event
            assert client.step("wait", "ecc", 2000) == event
            assert client.step("wait", "ecc", 0) == client.step("wait", "late", 0) == TIMEOUT
    finally:
        for client in clients:
            client.close()


@pytest.mark.parametrize(("profile", "retirement"), [
    ("h100", [("Uncorrectable Error", "1"), ("Pending", "Yes")]),
    ("t4", [("Double Bit ECC", "1"), ("Pending Page Blacklist", "Yes")]),
])
def test_nvidia_smi_reports_the_injected_error(
    native: Path, smi: Path, tmp_path: Path, profile: str, retirement: list[tuple[str, str]]
):
    config = injected(profile, tmp_path / profile)
    section = "ROW_REMAPPER" if profile == "h100" else "PAGE_RETIREMENT"
    gpus = (("0", 1), ("1", 0)) if profile == "h100" else (("0", 1),)  # a T4 node has one
    for gpu, errors in gpus:
        result = run_smi(smi, native, config, "-q", "-i", gpu, "-d", f"ECC,{section}")
        assert result.returncode == 0, result.stdout + result.stderr
        pairs = [tuple(part.strip() for part in line.split(":", 1))
                 for line in result.stdout.splitlines() if ":" in line]
        # volatile, then aggregate
        assert [value for key, value in pairs if key == "DRAM Uncorrectable"] == [str(errors)] * 2
        for pair in retirement:
            assert (pair in pairs) == (gpu == "0"), (gpu, pair)
    table = run_smi(smi, native, config)
    assert table.returncode == 0, table.stdout + table.stderr
    # the summary's "Volatile Uncorr. ECC" column, on each GPU's bus id row
    rows = [line for line in table.stdout.splitlines() if "| 00000000:" in line]
    assert [row.rstrip("| ").split()[-1] for row in rows[:len(gpus)]] == [
        str(errors) for _, errors in gpus]
