"""NVML events of the mock library: every event set gets its own copy of each Xid.

As in NVML, a set registered for Xid critical errors on a device records
the Xids on that device from the registration on, whatever other sets in
the process do with them: a program that restarts its health loop (the
device plugin on SIGHUP) must not lose a Xid to the old loop's set, still
inside its wait.  A GPU that falls off the bus raises Xid 79 by itself.

One client process per test drives the library through ctypes while the
test's configs, compiled from real ``mokka ctl`` overrides, replace the
engine config under it (``MOCK_NVML_RECHECK_INTERVAL_MS=0``: the library
stats the file at every call, so the next call sees the swap).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import attrs
import pytest

from mokka import layout
from mokka.simulators.gpudriver.engine_config import render_engine_config
from tests.nvml_support import node_path, run_script, state_with_overrides

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(60)]

TIMEOUT, GPU_IS_LOST = 10, 15
XID_CRITICAL_ERROR = 0x8

#: Runs the steps of argv[2] (JSON) against the library and prints what each
#: ``wait``/``call``/``register`` answered.  ``swap PATH`` renames a copy of
#: PATH over the engine config (argv[1]).
CLIENT = r"""
import ctypes, json, os, shutil, sys

class Event(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong),
                ("eventData", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]

lib = ctypes.CDLL("libnvidia-ml.so.1")
config, steps = sys.argv[1], json.loads(sys.argv[2])
assert lib.nvmlInit_v2() == 0
count = ctypes.c_uint()
assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
handles = [ctypes.c_void_p() for _ in range(count.value)]
for index, handle in enumerate(handles):
    assert lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0
index_of = {handle.value: index for index, handle in enumerate(handles)}
sets, out = {}, []
for verb, *args in steps:
    if verb == "swap":
        shutil.copyfile(args[0], config + ".next")
        os.replace(config + ".next", config)
    elif verb == "create":
        sets[args[0]] = ctypes.c_void_p()
        assert lib.nvmlEventSetCreate(ctypes.byref(sets[args[0]])) == 0
    elif verb == "register":
        name, gpus = args
        out.append([lib.nvmlDeviceRegisterEvents(handles[g], ctypes.c_ulonglong(8), sets[name])
                    for g in gpus])
    elif verb == "wait":
        name, timeout_ms = args
        event = Event()
        code = lib.nvmlEventSetWait_v2(sets[name], ctypes.byref(event), timeout_ms)
        out.append([index_of[event.device], event.eventType, event.eventData]
                   if code == 0 else code)
    elif verb == "call":
        temperature = ctypes.c_uint()
        out.append(lib.nvmlDeviceGetTemperature(handles[args[0]], 0, ctypes.byref(temperature)))
    elif verb == "free":
        assert lib.nvmlEventSetFree(sets.pop(args[0])) == 0
assert not sets, "every set is freed"
assert lib.nvmlShutdown() == 0
print(json.dumps(out))
"""


@attrs.define(eq=False)
class Configs:
    """Engine configs of one h100 node, each after more ``mokka ctl`` calls (one
    overrides file under ``where``, as on a node)."""

    where: Path
    count: int = 0

    def after(self, *ctl_calls: list[str]) -> str:
        """The node's config once ``ctl_calls`` have been applied too, as a file."""
        state = state_with_overrides("h100", self.where, *ctl_calls)
        self.count += 1
        path = self.where / f"config-{self.count}.yaml"
        path.write_text(render_engine_config(state))
        return str(path)


def run_client(native: Path, tmp_path: Path, first: str, steps: list) -> list:
    """What the client answered, started on the config ``first``."""
    config = node_path(tmp_path / "node", layout.ENGINE_CONFIG)
    config.parent.mkdir(parents=True)
    shutil.copyfile(first, config)
    return run_script(
        native, config, CLIENT, str(config), json.dumps(steps), MOCK_NVML_RECHECK_INTERVAL_MS="0"
    )


def test_each_event_set_gets_its_own_copy_of_each_later_xid(native: Path, tmp_path: Path):
    configs = Configs(tmp_path)
    idle = configs.after()
    first = configs.after(["xid", "--gpu", "0", "--code", "79"])
    second = configs.after(["xid", "--gpu", "0", "--code", "48"])
    got = run_client(native, tmp_path, idle, [
        ["create", "old"], ["register", "old", [0]],
        ["create", "new"], ["register", "new", [0]],
        ["create", "other"], ["register", "other", [1]],
        ["swap", first],
        # Both sets get Xid 79, whichever waits first, and each exactly once.
        ["wait", "old", 2000], ["wait", "old", 0],
        ["wait", "new", 2000], ["wait", "new", 0],
        ["wait", "other", 100],
        # A set registered after the Xid does not record it.
        ["create", "late"], ["register", "late", [0]], ["wait", "late", 100],
        ["swap", second],
        ["wait", "late", 2000], ["wait", "new", 2000], ["wait", "old", 2000],
        ["wait", "late", 0], ["wait", "new", 0], ["wait", "old", 0],
        ["free", "old"], ["free", "new"], ["free", "other"], ["free", "late"],
    ])
    ok = [0]
    assert got == [
        ok, ok, ok,
        [0, XID_CRITICAL_ERROR, 79], TIMEOUT,
        [0, XID_CRITICAL_ERROR, 79], TIMEOUT,
        TIMEOUT,
        ok, TIMEOUT,
        [0, XID_CRITICAL_ERROR, 48], [0, XID_CRITICAL_ERROR, 48], [0, XID_CRITICAL_ERROR, 48],
        TIMEOUT, TIMEOUT, TIMEOUT,
    ]


def test_a_process_started_after_a_xid_does_not_record_it(native: Path, tmp_path: Path):
    configs = Configs(tmp_path)
    injected = configs.after(["xid", "--gpu", "3", "--code", "79"])
    got = run_client(native, tmp_path, injected, [
        ["create", "set"], ["register", "set", list(range(8))],
        ["wait", "set", 100], ["free", "set"],
    ])
    assert got == [[0] * 8, TIMEOUT]


def test_a_gpu_falling_off_the_bus_raises_xid_79(native: Path, tmp_path: Path):
    configs = Configs(tmp_path)
    idle = configs.after()
    fallen = configs.after(["fail", "--gpu", "2", "--mode", "fallen_off_bus"])
    # `lost` is a GPU gone without a word; a spec's own Xid replaces the 79.
    others = configs.after(["fail", "--gpu", "3", "--mode", "lost"],
                           ["fail", "--gpu", "5", "--mode", "fallen_off_bus", "--xid", "48"])
    # A trigger: the GPU falls at its third guarded call in this process.
    triggered = configs.after(["fail", "--gpu", "6", "--mode", "fallen_off_bus",
                               "--after-calls", "2"])
    healed = configs.after(["reset"])
    again = configs.after(["fail", "--gpu", "2", "--mode", "fallen_off_bus"])
    got = run_client(native, tmp_path, idle, [
        ["create", "set"], ["register", "set", list(range(8))],
        ["swap", fallen], ["wait", "set", 2000], ["wait", "set", 0],
        # Registered after the fall: nothing recorded (and the lost GPU refuses).
        ["create", "late"], ["register", "late", [1, 2]], ["wait", "late", 100],
        ["swap", others], ["wait", "set", 2000], ["wait", "set", 100],
        ["swap", triggered], ["wait", "set", 100],
        ["call", 6], ["call", 6], ["wait", "set", 100], ["call", 6], ["wait", "set", 2000],
        # Healed, then fallen again under the same spec: a new fall, a new Xid.
        ["swap", healed], ["wait", "set", 100],
        ["swap", again], ["wait", "set", 2000], ["wait", "set", 0],
        ["free", "set"], ["free", "late"],
    ])
    assert got == [
        [0] * 8,
        [2, XID_CRITICAL_ERROR, 79], TIMEOUT,
        [0, GPU_IS_LOST], TIMEOUT,
        [5, XID_CRITICAL_ERROR, 48], TIMEOUT,
        TIMEOUT,
        0, 0, TIMEOUT, GPU_IS_LOST, [6, XID_CRITICAL_ERROR, 79],
        TIMEOUT,
        [2, XID_CRITICAL_ERROR, 79], TIMEOUT,
    ]
