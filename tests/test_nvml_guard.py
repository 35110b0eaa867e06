"""No call of the mock NVML library writes past (or before) its caller's buffer.

The guard-page harness (tests/nvml_guard_support.py generates its calls from
nvml.h, tests/nvml_guard_harness.c runs them) calls every implemented
function with each output buffer flush against a PROT_NONE page, sized
exactly as that entry point's struct version: an overrun faults and the
harness names the function.  It runs on every built-in profile, in every
failure mode, and under valgrind.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from mokka.state.compile import compile_profile
from mokka.state.model import Failure, State
from mokka.state.profile import BUILTIN_PROFILES
from tests import nvml_guard_support as guard
from tests.nvml_support import nvml_env, write_config
from tests.support import require_tool

pytestmark = pytest.mark.realclient

#: Functions the harness covers; it may only go up (a newly implemented
#: function is covered by generation, or the coverage test names it).
COVERED_AT_LEAST = 163


@pytest.fixture(scope="module")
def harness(native: Path, tmp_path_factory: pytest.TempPathFactory) -> guard.Harness:
    return guard.build(native, tmp_path_factory.mktemp("guard"))


def run(harness: guard.Harness, native: Path, config: Path, *args: str, wrap: tuple[str, ...] = ()):
    return subprocess.run(
        [*wrap, str(harness.binary), *args],
        env=nvml_env(native, config),
        capture_output=True,
        text=True,
        timeout=600,
    )


def passed(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    assert result.stdout.splitlines()[-1] == "OK"
    return result.stdout


def with_failures(state: State, failure: Failure, indices: tuple[int, ...]) -> State:
    gpus = tuple(attrs.evolve(g, failure=failure) if g.index in indices else g for g in state.gpus)
    return attrs.evolve(state, gpus=gpus)


def test_every_implemented_function_is_swept(harness: guard.Harness, native: Path, tmp_path: Path):
    assert harness.problems == ()
    config = write_config(tmp_path, compile_profile("t4", node_name="worker-1"))
    out = passed(run(harness, native, config, "1", "1"))
    covered = guard.covered(out)
    assert covered == set(harness.implemented)
    print(f"guard harness: {len(covered)} implemented functions covered")
    assert len(covered) >= COVERED_AT_LEAST


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_no_call_overruns_on_a_builtin_profile(
    harness: guard.Harness, native: Path, tmp_path: Path, profile: str
):
    state = compile_profile(profile, node_name="worker-1")
    out = passed(run(harness, native, write_config(tmp_path, state), "0", "2"))
    assert f"DEVICES {len(state.gpus)}" in out


@pytest.mark.parametrize(
    "failure",
    [
        Failure(mode="lost"),
        Failure(mode="fallen_off_bus"),
        Failure(mode="ecc_uncorrectable"),
        Failure(mode="lost", after_calls=500),
        Failure(mode="fallen_off_bus", probability=0.2, seed=3),
    ],
    ids=["lost", "fallen_off_bus", "ecc_uncorrectable", "lost_after_calls", "off_bus_random"],
)
def test_no_call_overruns_in_a_failure_mode(
    harness: guard.Harness, native: Path, tmp_path: Path, failure: Failure
):
    state = with_failures(compile_profile("gb200", node_name="worker-1"), failure, (0, 2))
    passed(run(harness, native, write_config(tmp_path, state), "0", "2"))


def busy(state: State) -> State:
    """Every GPU with processes of both kinds and retired pages, so the
    caller-sized arrays have entries to write."""

    def change(gpu):
        fields = copy.deepcopy(gpu.fields)
        fields["processes"] = [
            {
                "pid": 1000 + k,
                "type": "graphics" if k % 3 == 0 else "compute",
                "used_memory_bytes": (k + 1) << 28,
                "name": f"job{k}",
            }
            for k in range(5)
        ]
        fields["retired_pages"] = {
            "pending_retirement": True,
            "single_bit_retirement": {"addresses": [0x1000 * (k + 1) for k in range(7)]},
            "double_bit_retirement": {"addresses": [0xBEEF000]},
        }
        return attrs.evolve(gpu, fields=fields)

    return attrs.evolve(state, gpus=tuple(change(g) for g in state.gpus))


def test_no_call_overruns_with_full_lists(harness: guard.Harness, native: Path, tmp_path: Path):
    state = busy(compile_profile("h100", node_name="worker-1"))
    config = write_config(tmp_path, state)
    passed(run(harness, native, config, "0", "2"))
    # The lists reach the library through the real writer.
    text = config.read_text()
    assert "device.0.processes.count: 5" in text
    assert "device.0.retired_pages.single_bit_retirement.addresses.count: 7" in text


def test_under_valgrind(harness: guard.Harness, native: Path, tmp_path: Path):
    valgrind = require_tool("valgrind")
    state = with_failures(
        busy(compile_profile("h100", node_name="worker-1")), Failure(mode="lost"), (1,)
    )
    wrap = (
        valgrind,
        "--error-exitcode=1",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite",
        "--quiet",
    )
    result = run(harness, native, write_config(tmp_path, state), "0", "2", wrap=wrap)
    passed(result)
    assert result.stderr == ""


def test_a_buffer_one_version_too_small_faults(native: Path, tmp_path: Path):
    """The harness catches a real overrun: handed the 52-byte pre-v3 record,
    nvmlDeviceGetPciInfo_v3 writes its 68 bytes into the guard page."""
    wrong = {**guard.LEGACY_SIZES, ("nvmlDeviceGetPciInfo_v3", "pci"): 52}
    harness = guard.build(native, tmp_path / "wrong", legacy=wrong)
    config = write_config(tmp_path, compile_profile("t4", node_name="worker-1"))
    result = run(harness, native, config, "1", "1")
    assert result.returncode == 70, result.stdout[-2000:]
    assert "FAULT nvmlDeviceGetPciInfo_v3 " in result.stderr
    assert "side=after" in result.stderr


def test_versioned_structs_follow_the_header(harness: guard.Harness):
    """Every version NVML_STRUCT_VERSION defines for a swept struct is swept."""
    source = (harness.binary.parent / "nvml_guard_calls.c").read_text()
    for tag in (
        "nvmlGpuFabricInfo_v2",
        "nvmlGpuFabricInfo_v3",
        "nvmlPlatformInfo_v1",
        "nvmlPlatformInfo_v2",
        "nvmlMemory_v2",
        "nvmlTemperature_v1",
    ):
        assert tag in source, tag


PCI_V2_SCRIPT = r"""
import ctypes, json, pynvml
pynvml.nvmlInit()
lib = pynvml.nvmlLib
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(i)
    # pynvml's own record for the _v1/_v2 entry points, then a canary.
    class Padded(ctypes.Structure):
        _fields_ = [("pci", pynvml.nvmlPciInfo_v2_t), ("canary", ctypes.c_ubyte * 32)]
    for name in ("nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v2"):
        buf = Padded()
        ctypes.memset(ctypes.byref(buf), 0xA5, ctypes.sizeof(buf))
        rc = getattr(lib, name)(handle, ctypes.byref(buf.pci))
        p = buf.pci
        bus_id = p.busId  # pynvml's structures decode char arrays
        out.append({
            "rc": rc, "size": ctypes.sizeof(p), "busId": bus_id,
            "domain": p.domain, "bus": p.bus, "device": p.device,
            "pciDeviceId": p.pciDeviceId, "pciSubSystemId": p.pciSubSystemId,
            "reserved": [p.reserved0, p.reserved1, p.reserved2, p.reserved3],
            "canary": list(buf.canary) == [0xA5] * 32,
        })
print(json.dumps(out))
"""


def test_pre_v3_pci_entry_points_fill_the_52_byte_record(native: Path, tmp_path: Path):
    """nvmlDeviceGetPciInfo and _v2 fill pynvml's nvmlPciInfo_v2_t (the
    legacy busId, the ids, zeroed reserved words) and nothing after it."""
    state = compile_profile("gb200", node_name="worker-1")
    config = write_config(tmp_path, state)
    result = subprocess.run(
        [sys.executable, "-c", PCI_V2_SCRIPT],
        env=nvml_env(native, config),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)
    assert len(records) == 2 * len(state.gpus)
    for record, gpu in zip(records, [g for g in state.gpus for _ in (0, 1)], strict=True):
        assert record["rc"] == 0
        assert record["size"] == 52
        assert record["canary"]
        assert record["reserved"] == [0, 0, 0, 0]
        domain, bus, rest = gpu.nvml_bus_id.split(":")
        assert record["busId"] == f"{int(domain, 16):04X}:{bus}:{rest}"
        assert (record["domain"], record["bus"]) == (int(domain, 16), int(bus, 16))
        assert record["device"] == int(rest.split(".")[0], 16)
        assert record["pciDeviceId"] == (gpu.pci_device_id << 16) | gpu.pci_vendor_id
