"""The mock NVML library's export surface: complete, and its coverage only goes up."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from mokka.native import FALLBACK_NVIDIA_SMI, NVML_LIBRARY
from mokka.state.compile import compile_profile
from tests.nvml_support import compiler, load_target, nvml_env, write_config
from tests.support import require_tool

#: Raise these when more functions are implemented; never lower them.
IMPLEMENTED_FLOOR = 207
EXPORTED_FLOOR = 397


def exported(library: Path) -> set[str]:
    nm = require_tool("nm")
    out = subprocess.run(
        [nm, "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_coverage_is_reported_and_pinned(native: Path):
    coverage = json.loads((native / "nvml-coverage.json").read_text())
    assert coverage["header"] == "nvidia/cu13/include/nvml.h"
    assert coverage["implemented"] >= IMPLEMENTED_FLOOR
    assert coverage["total"] >= EXPORTED_FLOOR
    assert coverage["implemented"] + coverage["stubs"] == coverage["total"]
    names = exported(native / NVML_LIBRARY)
    assert set(coverage["implemented_names"]) <= names
    assert len(names) == coverage["total"]


def test_only_nvml_names_are_exported_and_the_soname_is_nvidias(native: Path):
    names = exported(native / NVML_LIBRARY)
    assert all(name.startswith("nvml") for name in names), sorted(
        n for n in names if not n.startswith("nvml")
    )
    # Both ABI generations of the renamed functions.
    assert {"nvmlInit", "nvmlInit_v2", "nvmlDeviceGetCount", "nvmlDeviceGetCount_v2"} <= names
    assert {"nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo_v3"} <= names
    assert {"nvmlEventSetWait", "nvmlEventSetWait_v2", "nvmlDeviceGetAddressingMode"} <= names
    readelf = require_tool("readelf")
    dynamic = subprocess.run(
        [readelf, "-d", str(native / NVML_LIBRARY)], capture_output=True, text=True, check=True
    ).stdout
    assert "Library soname: [libnvidia-ml.so.1]" in dynamic
    assert NVML_LIBRARY == "libnvidia-ml.so.1"
    assert FALLBACK_NVIDIA_SMI == "nvidia-smi"


def test_every_name_the_real_consumers_resolve_is_exported(native: Path, smi: Path):
    names = exported(native / NVML_LIBRARY)
    smi_names = set(re.findall(rb"(?<=\0)(nvml[A-Za-z0-9_]+)(?=\0)", smi.read_bytes()))
    assert len(smi_names) >= 230
    assert {n.decode() for n in smi_names} <= names
    import pynvml

    pynvml_names = set(re.findall(r'"(nvml[A-Za-z0-9_]+)"', Path(pynvml.__file__).read_text()))
    assert pynvml_names - names == set()


def test_stubs_report_not_supported_and_leave_outputs_alone(native: Path, tmp_path: Path):
    config = write_config(tmp_path, compile_profile("t4", node_name="worker-1"))
    script = """
import ctypes
lib = ctypes.CDLL("libnvidia-ml.so.1")
assert lib.nvmlInit_v2() == 0
handle = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0
out = ctypes.c_uint(0xDEADBEEF)
print(lib.nvmlDeviceGetPowerSource(handle, ctypes.byref(out)), hex(out.value))
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=nvml_env(native, config),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.split() == ["3", "0xdeadbeef"], result.stderr


def test_fallback_target_builds_the_library_it_needs(tmp_path: Path):
    """native/build.py runs nvidia-smi before nvml: the target must not depend on the order."""
    built = load_target("nvidia-smi").build(tmp_path, compiler())
    assert built == [tmp_path / FALLBACK_NVIDIA_SMI]
    assert (tmp_path / NVML_LIBRARY).is_file()
