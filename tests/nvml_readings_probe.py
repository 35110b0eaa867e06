"""Reads the moving readings of every GPU through nvidia-ml-py, in a child process.

``python tests/nvml_readings_probe.py [INSTANT ...]`` prints one JSON list:
one entry per instant (seconds since the epoch, set as
``MOCK_NVML_CLOCK_OVERRIDE`` before each read, so one process can sweep a
pattern), or a single entry for the real clock when no instant is given.
Each entry maps the device index to its readings and compute processes
(with the names ``nvmlSystemGetProcessName`` gives).  The library must have
been loaded with ``MOCK_NVML_CLOCK_OVERRIDE`` set for the sweep to take.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pynvml as nv


def readings(handle: Any) -> dict[str, Any]:
    # _v2: `used` without the driver's reservation, as nvidia-smi prints it
    memory = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
    util = nv.nvmlDeviceGetUtilizationRates(handle)
    low, high = nv.nvmlDeviceGetPowerManagementLimitConstraints(handle)
    processes = [
        {"pid": p.pid, "used": p.usedGpuMemory, "name": nv.nvmlSystemGetProcessName(p.pid)}
        for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)
    ]
    return {
        "memory_used": memory.used,
        "memory_total": memory.total,
        "util_gpu": util.gpu,
        "util_memory": util.memory,
        "power_mw": nv.nvmlDeviceGetPowerUsage(handle),
        "power_limit_mw": nv.nvmlDeviceGetEnforcedPowerLimit(handle),
        "power_min_mw": low,
        "power_max_mw": high,
        "temperature_c": nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
        "shutdown_c": nv.nvmlDeviceGetTemperatureThreshold(
            handle, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
        "slowdown_c": nv.nvmlDeviceGetTemperatureThreshold(
            handle, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        "sm_clock_mhz": nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
        "sm_max_mhz": nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM),
        "reasons": nv.nvmlDeviceGetCurrentClocksEventReasons(handle),
        "processes": processes,
    }


def main() -> None:
    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    supported = nv.nvmlDeviceGetSupportedGraphicsClocks(
        handles[0], nv.nvmlDeviceGetMaxClockInfo(handles[0], nv.NVML_CLOCK_MEM))
    out = []
    for instant in sys.argv[1:] or [None]:
        if instant is not None:
            os.environ["MOCK_NVML_CLOCK_OVERRIDE"] = instant
        out.append({str(i): readings(h) for i, h in enumerate(handles)})
    nv.nvmlShutdown()
    json.dump({"instants": out, "supported_sm_clocks": supported}, sys.stdout)


if __name__ == "__main__":
    main()
