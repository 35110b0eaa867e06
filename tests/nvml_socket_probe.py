"""A long-lived NVML client for the socket tests: one command a line on stdin,
one JSON answer a line on stdout, each with the seconds the call took.

    python nvml_socket_probe.py LIBRARY
    init | temp <index> | count | uuid <index> | holders <index> | shutdown
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

TEMPERATURE_GPU = 0


def main() -> None:
    lib = ctypes.CDLL(sys.argv[1])
    for line in sys.stdin:
        verb, *args = line.split()
        started = time.monotonic()
        answer: dict[str, object] = {}
        if verb == "init":
            answer["rc"] = lib.nvmlInit_v2()
        elif verb == "shutdown":
            answer["rc"] = lib.nvmlShutdown()
        elif verb == "count":
            count = ctypes.c_uint()
            answer["rc"] = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
            answer["value"] = count.value
        elif verb in ("temp", "uuid", "holders"):
            handle = ctypes.c_void_p()
            answer["rc"] = lib.nvmlDeviceGetHandleByIndex_v2(int(args[0]), ctypes.byref(handle))
            if answer["rc"] == 0 and verb == "temp":
                value = ctypes.c_uint()
                answer["rc"] = lib.nvmlDeviceGetTemperature(
                    handle, TEMPERATURE_GPU, ctypes.byref(value))
                answer["value"] = value.value
            elif answer["rc"] == 0 and verb == "uuid":
                buf = ctypes.create_string_buffer(96)
                answer["rc"] = lib.nvmlDeviceGetUUID(handle, buf, 96)
                answer["value"] = buf.value.decode()
            elif answer["rc"] == 0:
                count = ctypes.c_uint(0)
                answer["rc"] = lib.nvmlDeviceGetComputeRunningProcesses_v3(
                    handle, ctypes.byref(count), None)
                answer["value"] = count.value
        answer["seconds"] = time.monotonic() - started
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
