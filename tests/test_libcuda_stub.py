"""The CUDA driver stub (``native/libcuda``) as the gpudriver simulator stages it.

Built from the tree's sources, staged with the tree's mock NVML library on a
test root, then: loaded with ctypes in a child process (a fresh library per
scenario, so "before cuInit" means it), where it must answer as a driver
that sees no CUDA device and report the profile's CUDA version; and found by
the real ``nvidia-ctk cdi generate`` (toolkit v1.20.2), whose spec must
mount ``libcuda.so.<driver version>``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import yaml

from mokka import layout
from mokka.noderoot.host import Host
from mokka.simulators.gpudriver import GpuDriverSimulator
from mokka.state.compile import compile_profile
from mokka.state.model import State
from native.toolchain import load_target
from tests.gpudriver_support import symlink_settings, teardown, toolkit_binary
from tests.nvml_support import compiler
from tests.support import require_tool, snapshot

pytestmark = pytest.mark.timeout(120)

#: What the stub exports, and nothing else.
EXPORTS = {
    "cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuGetErrorName", "cuGetErrorString",
    "cuGetProcAddress", "cuGetProcAddress_v2",
}

# Loads the library at argv[1] and probes it the way a loader does; prints
# one JSON object.  A child per scenario: the stub's "initialised" flag is
# per process.
PROBE = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
out = {}
version = ctypes.c_int(-1)
out["version"] = [lib.cuDriverGetVersion(ctypes.byref(version)), version.value]
out["version_null"] = lib.cuDriverGetVersion(None)
count = ctypes.c_int(-1)
out["count_before"] = [lib.cuDeviceGetCount(ctypes.byref(count)), count.value]
out["init_flags"] = lib.cuInit(1)
out["init"] = lib.cuInit(0)
out["count_after"] = [lib.cuDeviceGetCount(ctypes.byref(count)), count.value]
out["count_null"] = lib.cuDeviceGetCount(None)
out["errors"] = {}
for code in (0, 1, 3, 100, 500, 999):
    name, text = ctypes.c_char_p(b"x"), ctypes.c_char_p(b"x")
    rn = lib.cuGetErrorName(code, ctypes.byref(name))
    rs = lib.cuGetErrorString(code, ctypes.byref(text))
    out["errors"][code] = [rn, name.value and name.value.decode(),
                           rs, text.value and text.value.decode()]
pfn, status = ctypes.c_void_p(1), ctypes.c_int(-1)
out["proc"] = [lib.cuGetProcAddress(b"cuInit", ctypes.byref(pfn), 12000,
                                    ctypes.c_uint64(0)), pfn.value]
pfn = ctypes.c_void_p(1)
out["proc_v2"] = [lib.cuGetProcAddress_v2(b"cuInit", ctypes.byref(pfn), 13000,
                                          ctypes.c_uint64(0), ctypes.byref(status)),
                  pfn.value, status.value]
out["proc_null"] = lib.cuGetProcAddress(None, ctypes.byref(pfn), 12000, ctypes.c_uint64(0))
out["other"] = hasattr(lib, "cuDeviceGet") or hasattr(lib, "cuCtxCreate_v2")
print(json.dumps(out))
"""


def probe(library: Path, env: dict[str, str] | None = None) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(library)], capture_output=True, text=True,
        timeout=30, env=env, check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def full_native(native: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's NVML build and nvidia-smi, with the stub built from the tree beside them."""
    out = tmp_path_factory.mktemp("native-cuda")
    for built in native.iterdir():
        (out / built.name).symlink_to(built)
    load_target("libcuda").build(out, compiler())
    return out


@pytest.fixture
def staged(
    full_native: Path, host: Host, node_root: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[State, Path]]:
    """An h100 driver root staged (and published) on the test root; removed after,
    leaving the root as it was."""
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(full_native))
    state = compile_profile("h100", node_name="node-a")
    sim = GpuDriverSimulator(settings=symlink_settings(tmp_path), can_mount=False)
    before = snapshot(node_root)

    async def stage() -> None:
        with trio.fail_after(60):
            await sim.stage(host, state)
            await sim.apply(host, state)

    async def remove() -> None:
        with trio.fail_after(60):
            await teardown(sim, host)

    trio.run(stage)
    try:
        yield state, node_root / layout.DRIVER_ROOT.lstrip("/")
    finally:
        trio.run(remove)
    assert snapshot(node_root) == before


def test_exports_exactly_what_a_loader_probes(full_native: Path) -> None:
    nm = require_tool("nm")
    listed = subprocess.run(
        [nm, "-D", "--defined-only", str(full_native / "libcuda.so.1")],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout
    assert {line.split()[-1] for line in listed.splitlines() if " T " in line} == EXPORTS
    assert {line.split()[-1] for line in listed.splitlines()} - EXPORTS <= {"_init", "_fini"}


def test_the_staged_stub_reports_no_device_and_the_profiles_cuda_version(staged) -> None:
    state, driver_root = staged
    lib = driver_root / "usr/lib64"
    assert (lib / "libcuda.so.1").readlink() == Path(f"libcuda.so.{state.system.driver_version}")
    assert (lib / "libcuda.so").readlink() == Path("libcuda.so.1")
    # NVML's integer form, as the engine config carries it: 13.0 -> 13000.
    assert state.system.cuda_driver_version == 13000
    got = probe(lib / "libcuda.so")  # through both links, as `dlopen("libcuda.so")` does
    assert got == {
        "version": [0, 13000],
        "version_null": 1,
        "count_before": [3, -1],
        "init_flags": 1,
        "init": 100,
        "count_after": [0, 0],
        "count_null": 1,
        "errors": {
            "0": [0, "CUDA_SUCCESS", 0, "no error"],
            "1": [0, "CUDA_ERROR_INVALID_VALUE", 0, "invalid argument"],
            "3": [0, "CUDA_ERROR_NOT_INITIALIZED", 0, "initialization error"],
            "100": [0, "CUDA_ERROR_NO_DEVICE", 0, "no CUDA-capable device is detected"],
            "500": [0, "CUDA_ERROR_NOT_FOUND", 0, "named symbol not found"],
            "999": [1, None, 1, None],
        },
        "proc": [500, None],
        "proc_v2": [500, None, 1],
        "proc_null": 1,
        "other": False,
    }


def test_the_version_comes_from_the_engine_config_it_finds(
    full_native: Path, tmp_path: Path
) -> None:
    # Alone, with no config beside it: the version is unknown.
    alone = tmp_path / "alone/usr/lib64"
    alone.mkdir(parents=True)
    shutil.copy(full_native / "libcuda.so.1", alone)
    assert probe(alone / "libcuda.so.1")["version"] == [3, -1]
    # MOCK_NVML_CONFIG names it, as for the NVML library; the format is checked.
    config = tmp_path / "config.yaml"
    env = {"PATH": "/usr/bin:/bin", "MOCK_NVML_CONFIG": str(config)}
    config.write_text('format: 1\nsystem.cuda_driver_version: 12080\nnode_name: "n"\n')
    assert probe(alone / "libcuda.so.1", env)["version"] == [0, 12080]
    config.write_text("format: 2\nsystem.cuda_driver_version: 12080\n")
    assert probe(alone / "libcuda.so.1", env)["version"] == [3, -1]
    config.write_text("format: 1\nsystem.cuda_driver_version: -5\n")
    assert probe(alone / "libcuda.so.1", env)["version"] == [3, -1]


def test_nvidia_ctk_cdi_generate_mounts_the_stub(staged, tmp_path: Path) -> None:
    state, driver_root = staged
    output = tmp_path / "nvidia.yaml"
    result = subprocess.run(
        [str(toolkit_binary("nvidia-ctk")), "cdi", "generate", "--driver-root", str(driver_root),
         "--nvidia-cdi-hook-path", str(toolkit_binary("nvidia-cdi-hook")),
         "--output", str(output)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    spec = yaml.safe_load(output.read_text())
    versioned = f"libcuda.so.{state.system.driver_version}"
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    # Without it, v1.20.2 leaves it out silently (v1.17 and the device plugin fail).
    assert mounts[f"/usr/lib64/{versioned}"] == str(driver_root / "usr/lib64" / versioned)
    # The toolkit's hook makes the SONAME link in the container.
    hooks = [" ".join(h["args"]) for h in spec["containerEdits"].get("hooks", [])]
    assert any(f"--link {versioned}::/usr/lib64/libcuda.so.1" in h for h in hooks), hooks
