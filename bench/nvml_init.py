"""What the mock NVML library costs a consumer.

1. **Init**: wall time of a process that loads the library, initializes it
   and reads name, UUID and memory of every GPU (8x H100 engine config),
   against the same binary doing nothing (the floor: process start alone),
   as a ratio.
2. **Size** of the built ``libnvidia-ml.so.1``.
3. **Per-call latency** of ``nvmlDeviceGetMemoryInfo`` in a tight loop, from
   a tiny C driver and through ctypes (what Python consumers pay).

Run: ``.venv/bin/python bench/nvml_init.py [--rounds 50] [--calls 1000000]``.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state.compile import compile_profile

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--rounds", "10", "--calls", "100000"]

ROOT = Path(__file__).resolve().parent.parent

#: What every C harness of the NVML benchmarks starts with: the library loaded
#: the way a consumer loads it (``dlopen`` by soname, entry points by
#: ``dlsym``) and initialized.  ``open_nvml`` returns 0, or the harness's exit
#: code: 2 without the library, 3 when ``nvmlInit_v2`` fails.
HARNESS_PRELUDE = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "nvml.h"

static void *g_nvml;

static void *nvml_symbol(const char *name)
{
    return dlsym(g_nvml, name);
}

static int open_nvml(void)
{
    g_nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!g_nvml)
        return 2;
    nvmlReturn_t (*init)(void) = (nvmlReturn_t (*)(void))nvml_symbol("nvmlInit_v2");
    return init() == NVML_SUCCESS ? 0 : 3;
}
"""

DRIVER = HARNESS_PRELUDE + r"""
typedef nvmlReturn_t (*init_fn)(void);
typedef nvmlReturn_t (*count_fn)(unsigned *);
typedef nvmlReturn_t (*handle_fn)(unsigned, nvmlDevice_t *);
typedef nvmlReturn_t (*str_fn)(nvmlDevice_t, char *, unsigned);
typedef nvmlReturn_t (*mem_fn)(nvmlDevice_t, nvmlMemory_t *);

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "floor") == 0)
        return 0;
    int failed = open_nvml();
    if (failed)
        return failed;
    count_fn count = (count_fn)nvml_symbol("nvmlDeviceGetCount_v2");
    handle_fn handle = (handle_fn)nvml_symbol("nvmlDeviceGetHandleByIndex_v2");
    str_fn name = (str_fn)nvml_symbol("nvmlDeviceGetName");
    str_fn uuid = (str_fn)nvml_symbol("nvmlDeviceGetUUID");
    mem_fn memory = (mem_fn)nvml_symbol("nvmlDeviceGetMemoryInfo");
    init_fn shutdown = (init_fn)nvml_symbol("nvmlShutdown");
    unsigned n = 0;
    count(&n);
    char buf[96];
    nvmlMemory_t m;
    nvmlDevice_t h;
    for (unsigned i = 0; i < n; i++) {
        handle(i, &h);
        name(h, buf, sizeof buf);
        uuid(h, buf, sizeof buf);
        memory(h, &m);
    }
    if (strcmp(argv[1], "loop") == 0) {
        long calls = atol(argv[2]);
        struct timespec a, b;
        handle(0, &h);
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (long i = 0; i < calls; i++)
            memory(h, &m);
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / calls);
    }
    shutdown();
    return 0;
}
"""


def build_harnesses(lib_dir: Path, cc: str, sources: dict[str, str], into: Path) -> dict[str, Path]:
    """The mock library built from the tree into ``lib_dir``, then each C harness
    (name -> source) compiled into ``into`` against the header it was built from."""
    if str(ROOT) not in sys.path:  # the targets import ``native.toolchain``
        sys.path.insert(0, str(ROOT))
    from native.toolchain import load_target

    nvml = load_target("nvml")
    nvml.build(lib_dir, cc)
    header = nvml._exports().find_header()
    built = {}
    for name, text in sources.items():
        source = into / f"{name}.c"
        source.write_text(text)
        built[name] = into / name
        subprocess.run(
            [cc, "-O2", f"-I{header.parent}", str(source), "-o", str(built[name]), "-ldl"],
            check=True,
        )
    return built


def timed_runs(argv: list[str], env: dict[str, str], rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--calls", type=int, default=1_000_000)
    args = parser.parse_args()
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        driver = build_harnesses(out, cc, {"driver": DRIVER}, out)["driver"]
        config = out / "config.yaml"
        config.write_text(render_engine_config(compile_profile("h100", node_name="bench")))
        env = dict(os.environ, LD_LIBRARY_PATH=str(out), MOCK_NVML_CONFIG=str(config))

        floor = timed_runs([str(driver), "floor"], env, args.rounds)
        work = timed_runs([str(driver), "work"], env, args.rounds)
        f, w = statistics.median(floor), statistics.median(work)
        print(f"process floor (start + exit):           median {f * 1e3:7.3f} ms")
        print(f"load + init + 8 GPUs name/UUID/memory:  median {w * 1e3:7.3f} ms")
        print(f"ratio to floor:                         {w / f:7.2f}x  (+{(w - f) * 1e3:.3f} ms)")

        size = (out / "libnvidia-ml.so.1").stat().st_size
        print(f"libnvidia-ml.so.1 size:                 {size / 1024:7.1f} KiB")

        loop = subprocess.run(
            [str(driver), "loop", str(args.calls)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        print(f"nvmlDeviceGetMemoryInfo, C loop:        {float(loop.stdout):7.1f} ns/call")

        os.environ.update(MOCK_NVML_CONFIG=str(config))
        lib = ctypes.CDLL(str(out / "libnvidia-ml.so.1"))
        lib.nvmlInit_v2()
        handle = ctypes.c_void_p()
        lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
        memory = (ctypes.c_ulonglong * 3)()
        calls = max(args.calls // 10, 1)
        start = time.perf_counter()
        for _ in range(calls):
            lib.nvmlDeviceGetMemoryInfo(handle, memory)
        per_call = (time.perf_counter() - start) / calls
        lib.nvmlShutdown()
        print(f"nvmlDeviceGetMemoryInfo, ctypes loop:   {per_call * 1e9:7.1f} ns/call")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
