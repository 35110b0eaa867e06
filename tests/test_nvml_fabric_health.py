"""The fabric health ``nvmlDeviceGetGpuFabricInfoV`` reports: the profile's, an override's.

Real boards differ (the captures ``nvidia-smi -q -x`` of an HGX H100 and an
HGX B200 node, ``<fabric><health>``): the H100 reports every field N/A, the
B200 ``Healthy`` with only the access-timeout recovery flag known
(``False``), a GB200 tray every flag.  ``mokka ctl fabric-health`` writes the
words the library reads, and the health answers them once the fabric is
registered.  The library used to report a GB200's health for every board
and to ignore the ctl verb.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nvml_support import run_script, state_with_overrides, write_config

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(120)]

#: ``nvmlDeviceGetGpuFabricInfoV`` v3 through ctypes (nvidia-ml-py has no binding):
#: every GPU's (state, healthMask, healthSummary).
CHILD = """
import ctypes, json
lib = ctypes.CDLL("libnvidia-ml.so.1")
class Info(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_ubyte * 16),
                ("status", ctypes.c_int), ("cliqueId", ctypes.c_uint),
                ("state", ctypes.c_ubyte), ("healthMask", ctypes.c_uint),
                ("healthSummary", ctypes.c_ubyte)]
assert lib.nvmlInit_v2() == 0
count = ctypes.c_uint()
assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
out = []
for index in range(count.value):
    handle = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0
    info = Info(version=ctypes.sizeof(Info) | 3 << 24)
    ret = lib.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    out.append([ret, info.state, info.healthMask, info.healthSummary])
lib.nvmlShutdown()
print(json.dumps(out))
"""

COMPLETED, IN_PROGRESS = 3, 2
NOT_SUPPORTED, HEALTHY, UNHEALTHY = 0, 1, 2
#: Each 2-bit field of the mask: 1 true, 2 false, 0 not supported (nvml.h).
YES, NO = 1, 2


def mask(bandwidth_degraded=0, route_recovery=0, route_unhealthy=0, access_timeout=0,
         incorrect_configuration=0) -> int:
    """A health mask from its fields (``NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_*``)."""
    return (bandwidth_degraded | route_recovery << 2 | route_unhealthy << 4
            | access_timeout << 6 | incorrect_configuration << 8)


def health(native: Path, tmp_path: Path, profile: str, *ctl_calls: list[str]) -> list[list[int]]:
    # registered: ``auto`` would wait for the fabric manager's marker
    calls = [["set", "--gpu", "all", "fabric.state=completed"], *ctl_calls]
    state = state_with_overrides(profile, tmp_path, *calls)
    return run_script(native, write_config(tmp_path, state), CHILD)


@pytest.mark.parametrize(("profile", "expected"), [
    # the H100 capture: summary and every field N/A
    ("h100", [0, COMPLETED, 0, NOT_SUPPORTED]),
    # the B200 capture: Healthy; access timeout recovery False, the rest N/A
    ("b200", [0, COMPLETED, mask(access_timeout=NO), HEALTHY]),
    # the GB200 capture: Healthy, Full bandwidth, no recovery, no unhealthy route
    ("gb200", [0, COMPLETED, mask(NO, NO, NO, NO), HEALTHY]),
])
def test_each_board_reports_the_health_its_capture_shows(native: Path, tmp_path: Path,
                                                         profile: str, expected: list[int]):
    got = health(native, tmp_path, profile)
    assert got == [expected] * len(got)


@pytest.mark.parametrize(("state", "expected_mask"), [
    ("degraded-bandwidth", mask(YES, NO, NO, NO, incorrect_configuration=1)),
    ("route_recovery", mask(NO, YES, NO, NO, incorrect_configuration=1)),
    ("route_unhealthy", mask(NO, NO, YES, NO, incorrect_configuration=1)),
    ("access_timeout_recovery", mask(NO, NO, NO, YES, incorrect_configuration=1)),
    # a configuration found wrong: the first reason nvml.h lists (SysGUID, 2)
    ("incorrect_configuration", mask(NO, NO, NO, NO, incorrect_configuration=2)),
])
def test_ctl_fabric_health_is_what_nvml_reports(native: Path, tmp_path: Path, state: str,
                                                expected_mask: int):
    got = health(native, tmp_path, "gb200", ["fabric-health", "--gpu", "1", "--state", state])
    assert got[1] == [0, COMPLETED, expected_mask, UNHEALTHY]
    # the other GPUs keep the board's health
    assert got[0] == [0, COMPLETED, mask(NO, NO, NO, NO), HEALTHY]
    (tmp_path / "again").mkdir()
    healthy = health(native, tmp_path / "again", "gb200",
                     ["fabric-health", "--gpu", "1", "--state", state],
                     ["fabric-health", "--gpu", "1", "--state", "healthy"])
    assert healthy[1] == [0, COMPLETED, mask(NO, NO, NO, NO, incorrect_configuration=1), HEALTHY]


def test_an_unregistered_fabric_reports_no_health(native: Path, tmp_path: Path):
    """In progress (the fabric manager not up): every field NOT_SUPPORTED, whatever the words."""
    calls = [["fabric-health", "--gpu", "0", "--state", "route_unhealthy"],
             ["set", "--gpu", "all", "fabric.state=in_progress"]]
    state = state_with_overrides("gb200", tmp_path, *calls)
    got = run_script(native, write_config(tmp_path, state), CHILD)
    assert got == [[0, IN_PROGRESS, 0, NOT_SUPPORTED]] * len(got)
