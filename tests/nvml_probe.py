"""Drives the mock NVML library through nvidia-ml-py (pynvml) in a child process.

NVML state is process-global, so each check runs in its own interpreter:
the tests start ``python tests/nvml_probe.py <command> [args]`` with
``LD_LIBRARY_PATH`` pointing at the built library and ``MOCK_NVML_CONFIG``
at an engine config, and read one JSON document from stdout.

Commands:
  inventory                 every implemented query, for every device
  events TIMEOUT_MS WAITS   register XID events on all devices, wait WAITS times
  failure INDEX CALLS       CALLS guarded calls on one device, plus ECC counters
  reread                    print READY, wait for a line on stdin, then poll
                            the device name until it changes (max 5 s)
  hammer THREADS SECONDS    THREADS threads calling queries concurrently
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml as nv


def attempt(call: Callable[[], Any]) -> Any:
    """The call's value, or ``{"error": <NVML error code>}``."""
    try:
        return plain(call())
    except nv.NVMLError as error:
        return {"error": error.value}


def address(handle: Any) -> int:
    """A device handle's address, to compare handles."""
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def plain(value: Any) -> Any:
    """ctypes structures and bytes → JSON-friendly values."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list | tuple | ctypes.Array):
        return [plain(v) for v in value]
    if isinstance(value, ctypes._SimpleCData):
        return plain(value.value)
    if hasattr(value, "_fields_"):
        return {name: plain(getattr(value, name)) for name, *_ in value._fields_}
    return value


class FabricInfo(ctypes.Structure):
    """``nvmlGpuFabricInfo_t`` as nvml.h lays it out.

    nvidia-ml-py 12.535.161 declares ``clusterUuid`` as 80 bytes instead of
    16, so its own structure reads the wrong offsets; the call goes through
    its function pointer with the header's layout instead.
    """

    _fields_ = (
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint),
    )


def fabric_info(handle: Any) -> FabricInfo:
    info = FabricInfo()
    result = nv._nvmlGetFunctionPointer("nvmlDeviceGetGpuFabricInfo")(handle, ctypes.byref(info))
    nv._nvmlCheckReturn(result)
    return info


def device_inventory(handle: Any, other: Any) -> dict[str, Any]:
    h = handle
    fields = [
        nv.NVML_FI_DEV_POWER_MIN_LIMIT,
        nv.NVML_FI_DEV_POWER_MAX_LIMIT,
        nv.NVML_FI_DEV_POWER_DEFAULT_LIMIT,
        nv.NVML_FI_DEV_POWER_CURRENT_LIMIT,
        nv.NVML_FI_DEV_MEMORY_TEMP,
        nv.NVML_FI_DEV_NVLINK_LINK_COUNT,
        nv.NVML_FI_DEV_NVSWITCH_CONNECTED_LINK_COUNT,
        nv.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        9999,
    ]
    checks: dict[str, Callable[[], Any]] = {
        "index": lambda: nv.nvmlDeviceGetIndex(h),
        "name": lambda: nv.nvmlDeviceGetName(h),
        "uuid": lambda: nv.nvmlDeviceGetUUID(h),
        "serial": lambda: nv.nvmlDeviceGetSerial(h),
        "minor": lambda: nv.nvmlDeviceGetMinorNumber(h),
        "brand": lambda: nv.nvmlDeviceGetBrand(h),
        "architecture": lambda: nv.nvmlDeviceGetArchitecture(h),
        "board_id": lambda: nv.nvmlDeviceGetBoardId(h),
        "board_part_number": lambda: nv.nvmlDeviceGetBoardPartNumber(h),
        "vbios": lambda: nv.nvmlDeviceGetVbiosVersion(h),
        "inforom_image": lambda: nv.nvmlDeviceGetInforomImageVersion(h),
        "inforom_oem": lambda: nv.nvmlDeviceGetInforomVersion(h, nv.NVML_INFOROM_OEM),
        "compute_capability": lambda: nv.nvmlDeviceGetCudaComputeCapability(h),
        "pci": lambda: nv.nvmlDeviceGetPciInfo_v3(h),
        "pcie_gen": lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "pcie_width": lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h),
        "pcie_max_gen": lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "gpu_max_pcie_gen": lambda: nv.nvmlDeviceGetGpuMaxPcieLinkGeneration(h),
        # scope 1: the module's power budget (GB200's superchip), not the GPU's
        "module_power_limits": lambda: [
            {"ret": f.nvmlReturn, "value": f.value.uiVal}
            for f in nv.nvmlDeviceGetFieldValues(h, [(field_id, 1) for field_id in fields[:4]])
        ],
        "memory": lambda: nv.nvmlDeviceGetMemoryInfo(h),
        "memory_v2": lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2),
        "bar1": lambda: nv.nvmlDeviceGetBAR1MemoryInfo(h),
        "power_usage": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "power_limit": lambda: nv.nvmlDeviceGetPowerManagementLimit(h),
        "power_constraints": lambda: nv.nvmlDeviceGetPowerManagementLimitConstraints(h),
        "power_default": lambda: nv.nvmlDeviceGetPowerManagementDefaultLimit(h),
        "power_enforced": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h),
        "temperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "temp_shutdown": lambda: nv.nvmlDeviceGetTemperatureThreshold(
            h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
        ),
        "temp_slowdown": lambda: nv.nvmlDeviceGetTemperatureThreshold(
            h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        ),
        "fan": lambda: nv.nvmlDeviceGetFanSpeed(h),
        "clock_sm": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "max_clock_graphics": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_GRAPHICS),
        "max_clock_memory": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
        "app_clock_graphics": lambda: nv.nvmlDeviceGetApplicationsClock(h, nv.NVML_CLOCK_GRAPHICS),
        "supported_memory_clocks": lambda: nv.nvmlDeviceGetSupportedMemoryClocks(h),
        "throttle_reasons": lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        "supported_throttle_reasons": lambda: nv.nvmlDeviceGetSupportedClocksThrottleReasons(h),
        "pstate": lambda: nv.nvmlDeviceGetPerformanceState(h),
        "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "encoder": lambda: nv.nvmlDeviceGetEncoderUtilization(h),
        "decoder": lambda: nv.nvmlDeviceGetDecoderUtilization(h),
        "processes": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
        "ecc_mode": lambda: nv.nvmlDeviceGetEccMode(h),
        "ecc_uncorrected_volatile": lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
        ),
        "retired_pages_pending": lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h),
        "remapped_rows": lambda: nv.nvmlDeviceGetRemappedRows(h),
        "persistence": lambda: nv.nvmlDeviceGetPersistenceMode(h),
        "compute_mode": lambda: nv.nvmlDeviceGetComputeMode(h),
        "display_mode": lambda: nv.nvmlDeviceGetDisplayMode(h),
        "virtualization": lambda: nv.nvmlDeviceGetVirtualizationMode(h),
        "mig_mode": lambda: nv.nvmlDeviceGetMigMode(h),
        "mig_handle": lambda: nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0),
        "is_mig": lambda: nv.nvmlDeviceIsMigDeviceHandle(h),
        "common_ancestor": lambda: nv.nvmlDeviceGetTopologyCommonAncestor(h, other),
        "nearest_gpus_system": lambda: len(
            nv.nvmlDeviceGetTopologyNearestGpus(h, nv.NVML_TOPOLOGY_SYSTEM)
        ),
        "cpu_affinity": lambda: nv.nvmlDeviceGetCpuAffinity(h, 4),
        "p2p_nvlink": lambda: nv.nvmlDeviceGetP2PStatus(h, other, nv.NVML_P2P_CAPS_INDEX_NVLINK),
        "nvlink_state_0": lambda: nv.nvmlDeviceGetNvLinkState(h, 0),
        "nvlink_version_0": lambda: nv.nvmlDeviceGetNvLinkVersion(h, 0),
        "nvlink_capability_0": lambda: nv.nvmlDeviceGetNvLinkCapability(
            h, 0, nv.NVML_NVLINK_CAP_P2P_SUPPORTED
        ),
        "nvlink_remote_0": lambda: nv.nvmlDeviceGetNvLinkRemotePciInfo(h, 0).busId,
        "fabric": lambda: fabric_info(h),
        "supported_events": lambda: nv.nvmlDeviceGetSupportedEventTypes(h),
        "field_values": lambda: [
            {"id": f.fieldId, "ret": f.nvmlReturn, "value": f.value.uiVal}
            for f in nv.nvmlDeviceGetFieldValues(h, fields)
        ],
    }
    return {name: attempt(call) for name, call in checks.items()}


def inventory() -> dict[str, Any]:
    nv.nvmlInit()
    count = nv.nvmlDeviceGetCount()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    result: dict[str, Any] = {
        "driver_version": attempt(nv.nvmlSystemGetDriverVersion),
        "nvml_version": attempt(nv.nvmlSystemGetNVMLVersion),
        "cuda_driver_version": attempt(nv.nvmlSystemGetCudaDriverVersion),
        "cuda_driver_version_v2": attempt(nv.nvmlSystemGetCudaDriverVersion_v2),
        "count": count,
        "devices": [device_inventory(h, handles[(i + 1) % count]) for i, h in enumerate(handles)],
    }
    if count:
        uuid = nv.nvmlDeviceGetUUID(handles[-1])
        bus_id = nv.nvmlDeviceGetPciInfo(handles[-1]).busId
        last = address(handles[-1])
        result["by_uuid_is_last"] = address(nv.nvmlDeviceGetHandleByUUID(uuid)) == last
        result["by_bus_id_is_last"] = address(nv.nvmlDeviceGetHandleByPciBusId(bus_id)) == last
        result["by_bus_id_lower_is_last"] = (
            address(nv.nvmlDeviceGetHandleByPciBusId(bus_id.lower())) == last
        )
    result["unknown_uuid"] = attempt(lambda: nv.nvmlDeviceGetHandleByUUID("GPU-nope"))
    nv.nvmlShutdown()
    result["after_shutdown"] = attempt(nv.nvmlDeviceGetCount)
    return result


def events(timeout_ms: int, waits: int) -> dict[str, Any]:
    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    event_set = nv.nvmlEventSetCreate()
    for h in handles:
        nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, event_set)
    results = []
    for _ in range(waits):
        start = time.monotonic()
        try:
            data = nv.nvmlEventSetWait(event_set, timeout_ms)
            results.append(
                {
                    "event_type": data.eventType,
                    "xid": data.eventData,
                    "gpu": [address(h) for h in handles].index(address(data.device)),
                    "elapsed": time.monotonic() - start,
                }
            )
        except nv.NVMLError as error:
            results.append({"error": error.value, "elapsed": time.monotonic() - start})
    nv.nvmlEventSetFree(event_set)
    nv.nvmlShutdown()
    return {"waits": results}


def failure(index: int, calls: int) -> dict[str, Any]:
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(index)
    results = [attempt(lambda: nv.nvmlDeviceGetTemperature(h, 0)) for _ in range(calls)]
    ecc = attempt(
        lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
        )
    )
    ecc_again = attempt(
        lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
        )
    )
    identity = {"uuid": attempt(lambda: nv.nvmlDeviceGetUUID(h))}
    nv.nvmlShutdown()
    return {"calls": results, "ecc": ecc, "ecc_again": ecc_again, "identity": identity}


def reread() -> dict[str, Any]:
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    before = nv.nvmlDeviceGetName(h)
    print("READY", flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + 5
    after = before
    while after == before and time.monotonic() < deadline:
        time.sleep(0.05)
        after = nv.nvmlDeviceGetName(h)
    nv.nvmlShutdown()
    return {"before": before, "after": after}


def hammer(threads: int, seconds: float) -> dict[str, Any]:
    nv.nvmlInit()
    count = nv.nvmlDeviceGetCount()
    stop = time.monotonic() + seconds
    totals = {"calls": 0, "errors": []}
    lock = threading.Lock()

    def work(seed: int) -> None:
        calls, errors = 0, []
        while time.monotonic() < stop:
            h = nv.nvmlDeviceGetHandleByIndex((seed + calls) % count)
            for call, args in (
                (nv.nvmlDeviceGetName, (h,)),
                (nv.nvmlDeviceGetMemoryInfo, (h,)),
                (nv.nvmlDeviceGetTemperature, (h, 0)),
                (nv.nvmlDeviceGetPowerUsage, (h,)),
            ):
                try:
                    call(*args)
                except nv.NVMLError as error:
                    errors.append(error.value)
                calls += 1
        with lock:
            totals["calls"] += calls
            totals["errors"].extend(errors)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    nv.nvmlShutdown()
    return totals


def main(argv: list[str]) -> None:
    command, args = argv[0], argv[1:]
    if command == "inventory":
        result = inventory()
    elif command == "events":
        result = events(int(args[0]), int(args[1]))
    elif command == "failure":
        result = failure(int(args[0]), int(args[1]))
    elif command == "reread":
        result = reread()
    elif command == "hammer":
        result = hammer(int(args[0]), float(args[1]))
    else:
        raise SystemExit(f"nvml_probe: unknown command {command!r}")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
