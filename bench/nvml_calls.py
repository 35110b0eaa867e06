"""Per-call cost of the mock NVML getters a polling consumer calls, against an
indirect-call floor.

A C harness dlopens the library built from the tree, initializes it on an
8x H100 engine config, and times each getter in a tight loop; in the same
run it times a call through a function pointer to a function that does
nothing (the floor every exported NVML call pays at least).  The getters
are every one the device plugin's health loop and DCGM-style exporters
call in their loops: identity (UUID, handle by UUID, minor, name, PCI
info), power, temperature, clocks, utilization, memory, clocks event
reasons, performance state, energy, ECC counters, remapped rows,
violation status, PCIe throughput, NVLink state, field values, running
processes and the Xid event wait (a zero timeout on a set registered for
Xids, the health loop's call).  Each is timed on four boards:

* **idle**: no workload file, no pattern (every reading is the profile's);
* **signature**: idle under the idle signature (``idle_signature: true``:
  each GPU's own idle readings, derived once per clock tick);
* **held**: a workload file with two pods holding the GPU (readings derived);
* **dynamic**: a `dynamics` noise pattern on utilization (readings derived
  from the pattern at the current CLOCK_REALTIME_COARSE tick).

The signature, held and dynamic boards' readings come from per-tick caches
(docs/workloads.md), so they should cost about what the idle board's do.

Prints ns per call (the best of five rounds) and the ratio to the floor.

Then **change -> visible**: a client process holding the library open spins
on ``nvmlDeviceGetUUID`` while this process makes the engine config say
other UUIDs, and the time from the change to the first call that answers
the new value is taken, ``--changes`` times (p50, p99).  Two ways:

* **bump -> visible**: the config renamed into place, then the change
  notice's counter bumped (``notice.bump``); the clock starts at the bump:
  the library's own share;
* **stage -> visible**: the daemon's whole path for the config batch
  (``notice.converge_announced``: Host's converge, fsync and manifest
  included, then the bump); the clock starts before the converge.

Asserts nothing.
Run: ``.venv/bin/python bench/nvml_calls.py [--calls 200000] [--changes 200]``;
``--library DIR`` times a library built elsewhere (``libnvidia-ml.so.1`` in
DIR, say another commit's) in place of the tree's: the "before" column of
a comparison, with the same harness and boards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import yaml
from figures import percentile, report
from nvml_init import HARNESS_PRELUDE, build_harnesses

from mokka import layout
from mokka.noderoot.host import File, Host
from mokka.simulators.gpudriver import notice
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state.compile import compile_profile
from mokka.state.profile import read_profile_text

QUICK_ARGS = ["--calls", "20000", "--changes", "20"]
BENCH = "nvml_calls"
#: What a simple getter may cost: within 20 indirect calls.
GOAL = "<= 20x"
#: How soon a running client must see a change (after the command returns).
VISIBLE_GOAL = "p99 <= 100 ms"

HARNESS = HARNESS_PRELUDE + r"""
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* The floor: an indirect call to a function that only stores its answer. */
__attribute__((noinline)) static nvmlReturn_t nothing(nvmlDevice_t d, unsigned *out)
{
    (void)d;
    *out = 1;
    return NVML_SUCCESS;
}

typedef nvmlReturn_t (*uint_fn)(nvmlDevice_t, unsigned *);
typedef nvmlReturn_t (*temp_fn)(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned *);
typedef nvmlReturn_t (*clock_fn)(nvmlDevice_t, nvmlClockType_t, unsigned *);
typedef nvmlReturn_t (*util_fn)(nvmlDevice_t, nvmlUtilization_t *);
typedef nvmlReturn_t (*mem_fn)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*u64_fn)(nvmlDevice_t, unsigned long long *);
typedef nvmlReturn_t (*str_fn)(nvmlDevice_t, char *, unsigned);
typedef nvmlReturn_t (*proc_fn)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
typedef nvmlReturn_t (*pci_fn)(nvmlDevice_t, nvmlPciInfo_t *);
typedef nvmlReturn_t (*by_uuid_fn)(const char *, nvmlDevice_t *);
typedef nvmlReturn_t (*ecc_fn)(nvmlDevice_t, nvmlMemoryErrorType_t, nvmlEccCounterType_t,
                               unsigned long long *);
typedef nvmlReturn_t (*rows_fn)(nvmlDevice_t, unsigned *, unsigned *, unsigned *, unsigned *);
typedef nvmlReturn_t (*violation_fn)(nvmlDevice_t, nvmlPerfPolicyType_t, nvmlViolationTime_t *);
typedef nvmlReturn_t (*pcie_fn)(nvmlDevice_t, nvmlPcieUtilCounter_t, unsigned *);
typedef nvmlReturn_t (*link_fn)(nvmlDevice_t, unsigned, nvmlEnableState_t *);
typedef nvmlReturn_t (*fields_fn)(nvmlDevice_t, int, nvmlFieldValue_t *);
typedef nvmlReturn_t (*set_create_fn)(nvmlEventSet_t *);
typedef nvmlReturn_t (*register_fn)(nvmlDevice_t, unsigned long long, nvmlEventSet_t);
typedef nvmlReturn_t (*wait_fn)(nvmlEventSet_t, nvmlEventData_t *, unsigned);

static volatile uint_fn g_floor = nothing;

int main(int argc, char **argv)
{
    long calls = argc > 1 ? atol(argv[1]) : 200000;
    int failed = open_nvml();
    if (failed)
        return failed;
    nvmlReturn_t (*handle)(unsigned, nvmlDevice_t *) = (nvmlReturn_t (*)(
        unsigned, nvmlDevice_t *))nvml_symbol("nvmlDeviceGetHandleByIndex_v2");
    nvmlDevice_t dev;
    handle(0, &dev);
    uint_fn power = (uint_fn)nvml_symbol("nvmlDeviceGetPowerUsage");
    temp_fn temp = (temp_fn)nvml_symbol("nvmlDeviceGetTemperature");
    clock_fn clock = (clock_fn)nvml_symbol("nvmlDeviceGetClockInfo");
    util_fn util = (util_fn)nvml_symbol("nvmlDeviceGetUtilizationRates");
    mem_fn memory = (mem_fn)nvml_symbol("nvmlDeviceGetMemoryInfo");
    u64_fn reasons = (u64_fn)nvml_symbol("nvmlDeviceGetCurrentClocksEventReasons");
    str_fn name = (str_fn)nvml_symbol("nvmlDeviceGetName");
    uint_fn minor = (uint_fn)nvml_symbol("nvmlDeviceGetMinorNumber");
    proc_fn procs = (proc_fn)nvml_symbol("nvmlDeviceGetComputeRunningProcesses_v3");
    uint_fn pstate = (uint_fn)nvml_symbol("nvmlDeviceGetPerformanceState");
    u64_fn energy = (u64_fn)nvml_symbol("nvmlDeviceGetTotalEnergyConsumption");
    pci_fn pci = (pci_fn)nvml_symbol("nvmlDeviceGetPciInfo_v3");
    str_fn uuid = (str_fn)nvml_symbol("nvmlDeviceGetUUID");
    by_uuid_fn by_uuid = (by_uuid_fn)nvml_symbol("nvmlDeviceGetHandleByUUID");
    ecc_fn ecc = (ecc_fn)nvml_symbol("nvmlDeviceGetTotalEccErrors");
    rows_fn rows = (rows_fn)nvml_symbol("nvmlDeviceGetRemappedRows");
    violation_fn violation = (violation_fn)nvml_symbol("nvmlDeviceGetViolationStatus");
    pcie_fn pcie = (pcie_fn)nvml_symbol("nvmlDeviceGetPcieThroughput");
    link_fn link = (link_fn)nvml_symbol("nvmlDeviceGetNvLinkState");
    fields_fn fields = (fields_fn)nvml_symbol("nvmlDeviceGetFieldValues");
    uint_fn limit = (uint_fn)nvml_symbol("nvmlDeviceGetEnforcedPowerLimit");
    set_create_fn set_create = (set_create_fn)nvml_symbol("nvmlEventSetCreate");
    register_fn register_events = (register_fn)nvml_symbol("nvmlDeviceRegisterEvents");
    wait_fn wait = (wait_fn)nvml_symbol("nvmlEventSetWait_v2");
    char own_uuid[96];
    uuid(dev, own_uuid, sizeof own_uuid);
    nvmlEventSet_t set;
    set_create(&set);
    register_events(dev, nvmlEventTypeXidCriticalError, set);
    nvmlPciInfo_t pci_info;
    nvmlDevice_t found;
    nvmlViolationTime_t violated;
    nvmlEnableState_t state;
    nvmlEventData_t event;
    nvmlFieldValue_t values[1];
    unsigned a, b, c, d;

    unsigned u;
    unsigned long long ull;
    char text[96];
    nvmlUtilization_t ut;
    nvmlMemory_t mem;
    nvmlProcessInfo_t infos[8];
    double t, best;
    /* the best of five rounds: the machine's other load only ever adds */
#define TIME(label, expr)                                                   \
    best = 1e30;                                                            \
    for (int round = 0; round < 5; round++) {                               \
        t = now();                                                          \
        for (long i = 0; i < calls; i++)                                    \
            (void)(expr);                                                   \
        t = (now() - t) / calls;                                            \
        best = t < best ? t : best;                                         \
    }                                                                       \
    printf("%s %.1f\n", label, best);
    TIME("floor", g_floor(dev, &u));
    TIME("nvmlDeviceGetMinorNumber", minor(dev, &u));
    TIME("nvmlDeviceGetName", name(dev, text, sizeof text));
    TIME("nvmlDeviceGetPowerUsage", power(dev, &u));
    TIME("nvmlDeviceGetTemperature", temp(dev, NVML_TEMPERATURE_GPU, &u));
    TIME("nvmlDeviceGetClockInfo(SM)", clock(dev, NVML_CLOCK_SM, &u));
    TIME("nvmlDeviceGetUtilizationRates", util(dev, &ut));
    TIME("nvmlDeviceGetMemoryInfo", memory(dev, &mem));
    TIME("nvmlDeviceGetCurrentClocksEventReasons", reasons(dev, &ull));
    unsigned n;
    TIME("nvmlDeviceGetComputeRunningProcesses_v3", (n = 8, procs(dev, &n, infos)));
    TIME("nvmlDeviceGetPerformanceState", pstate(dev, &u));
    TIME("nvmlDeviceGetTotalEnergyConsumption", energy(dev, &ull));
    TIME("nvmlDeviceGetPciInfo_v3", pci(dev, &pci_info));
    TIME("nvmlDeviceGetUUID", uuid(dev, text, sizeof text));
    TIME("nvmlDeviceGetHandleByUUID", by_uuid(own_uuid, &found));
    TIME("nvmlDeviceGetClockInfo(MEM)", clock(dev, NVML_CLOCK_MEM, &u));
    TIME("nvmlDeviceGetEnforcedPowerLimit", limit(dev, &u));
    TIME("nvmlDeviceGetTotalEccErrors", ecc(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                            NVML_VOLATILE_ECC, &ull));
    TIME("nvmlDeviceGetRemappedRows", rows(dev, &a, &b, &c, &d));
    TIME("nvmlDeviceGetViolationStatus(POWER)", violation(dev, NVML_PERF_POLICY_POWER,
                                                          &violated));
    TIME("nvmlDeviceGetPcieThroughput(TX)", pcie(dev, NVML_PCIE_UTIL_TX_BYTES, &u));
    TIME("nvmlDeviceGetNvLinkState", link(dev, 0, &state));
    TIME("nvmlDeviceGetFieldValues(memory temperature)",
         (values[0].fieldId = NVML_FI_DEV_MEMORY_TEMP, fields(dev, 1, values)));
    TIME("nvmlEventSetWait_v2(Xid, 0 ms)", wait(set, &event, 0));
    return 0;
}
"""

#: A client that spins on one reading: after "go" (answered "ARMED") it calls
#: nvmlDeviceGetUUID until the answer changes, then prints CLOCK_MONOTONIC ns
#: (the clock time.monotonic_ns reads) and the number of calls it made.
VISIBLE_HARNESS = HARNESS_PRELUDE + r"""

static unsigned long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

int main(void)
{
    int failed = open_nvml();
    if (failed)
        return failed;
    nvmlReturn_t (*handle)(unsigned, nvmlDevice_t *) = (nvmlReturn_t (*)(
        unsigned, nvmlDevice_t *))nvml_symbol("nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned) =
        (nvmlReturn_t (*)(nvmlDevice_t, char *, unsigned))nvml_symbol("nvmlDeviceGetUUID");
    nvmlDevice_t dev;
    char prev[96], cur[96], line[16];
    if (handle(0, &dev) != NVML_SUCCESS || uuid(dev, prev, sizeof prev) != NVML_SUCCESS)
        return 3;
    printf("READY\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        printf("ARMED\n");
        fflush(stdout);
        unsigned long long calls = 0, give_up = now_ns() + 10000000000ULL;
        for (;;) {
            calls++;
            if (uuid(dev, cur, sizeof cur) == NVML_SUCCESS && strcmp(cur, prev) != 0)
                break;
            if ((calls & 1023) == 0 && now_ns() > give_up)
                break;
        }
        printf("%llu %llu\n", strcmp(cur, prev) ? now_ns() : 0ULL, calls);
        fflush(stdout);
        strcpy(prev, cur);
    }
    return 0;
}
"""

WORKLOAD = """format: 1
workload.memory_share_per_holder: 0.4
workload.utilization_per_holder: 60
device_count: 8
device.0.process_count: 2
device.0.process.0.pid: 200001
device.0.process.0.name: "k8s:team/train/main"
device.0.process.1.pid: 200002
device.0.process.1.name: "k8s:lab/infer/server"
"""


def run(harness: Path, lib_dir: Path, config: Path, calls: int) -> dict[str, float]:
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib_dir), MOCK_NVML_CONFIG=str(config))
    out = subprocess.run([str(harness), str(calls)], env=env, capture_output=True, text=True,
                         check=True, timeout=600).stdout
    return {label: float(ns) for label, ns in (line.rsplit(" ", 1) for line in out.splitlines())}


def change_to_visible(harness: Path, lib_dir: Path, root: Path,
                      changes: int) -> dict[str, list[float]]:
    """Milliseconds from each change to the spinning client's first new answer."""
    host = Host(root)
    texts = [render_engine_config(compile_profile("h100", node_name=f"bench-{i}"))
             for i in range(2)]
    owner = "bench-visible"
    notice.converge_announced(host, owner, [File(layout.ENGINE_CONFIG, texts[0])])
    config = host.resolve(layout.ENGINE_CONFIG)
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib_dir), MOCK_NVML_CONFIG=str(config))
    client = subprocess.Popen([str(harness)], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    samples: dict[str, list[float]] = {"bump -> visible": [], "stage -> visible": []}
    try:
        assert client.stdout.readline().strip() == "READY"
        for i in range(2 * changes):
            way = "bump -> visible" if i % 2 == 0 else "stage -> visible"
            text = texts[(i + 1) % 2]
            client.stdin.write("go\n")
            client.stdin.flush()
            assert client.stdout.readline().strip() == "ARMED"
            if way == "bump -> visible":
                tmp = config.with_name("config.yaml.bench")
                tmp.write_text(text)
                os.replace(tmp, config)
                start = time.monotonic_ns()
                notice.bump(host)
            else:
                start = time.monotonic_ns()
                notice.converge_announced(host, owner, [File(layout.ENGINE_CONFIG, text)])
            seen, _calls = (int(x) for x in client.stdout.readline().split())
            samples[way].append((seen - start) / 1e6 if seen else float("nan"))
    finally:
        client.stdin.close()
        client.wait(timeout=60)
        host.discard(owner)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200000)
    parser.add_argument("--changes", type=int, default=200,
                        help="changes timed for change -> visible (each way)")
    parser.add_argument("--library", type=Path,
                        help="a directory holding the libnvidia-ml.so.1 to time "
                             "(default: the one built from the tree)")
    args = parser.parse_args()
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    with tempfile.TemporaryDirectory(prefix="mokka-nvml-calls-") as scratch:
        work = Path(scratch)
        built = build_harnesses(work / "lib", cc,
                                {"harness": HARNESS, "visible": VISIBLE_HARNESS}, work)
        lib_dir = args.library.resolve() if args.library else work / "lib"
        if not (lib_dir / "libnvidia-ml.so.1").is_file():
            parser.error(f"--library {lib_dir}: no libnvidia-ml.so.1 there")

        boards: dict[str, Path] = {}
        for board in ("idle", "signature", "held", "dynamic"):
            directory = work / board
            directory.mkdir()
            if board == "dynamic":
                doc = yaml.safe_load(read_profile_text("h100")[1])
                doc["device_defaults"]["dynamics"] = {
                    "utilization": {"pattern": "noise", "mean": 50, "amplitude": 40, "seed": 1}}
                (directory / "profile.yaml").write_text(yaml.safe_dump(doc))
                state = compile_profile(directory / "profile.yaml", node_name="bench")
            else:
                state = compile_profile("h100", node_name="bench")
            text = render_engine_config(state)
            if board == "signature":
                text += "idle_signature: true\n"
            (directory / "config.yaml").write_text(text)
            if board == "held":
                (directory / "workload.yaml").write_text(WORKLOAD)
            boards[board] = directory / "config.yaml"

        results = {board: run(built["harness"], lib_dir, config, args.calls)
                   for board, config in boards.items()}
        (work / "node").mkdir()
        visible = change_to_visible(built["visible"], lib_dir, work / "node", args.changes)
    # each board's figures against the floor of its own run
    floor = results["idle"]["floor"]
    print(f"per call, {args.calls} calls each; floor: an indirect call to a function "
          f"that does nothing ({floor:.1f} ns)")
    for board, figures in results.items():
        print(f"{board} board:")
        for label, ns in figures.items():
            if label != "floor":
                report(BENCH, f"{board}: {label}", ns, "ns", floor=figures["floor"],
                       floor_name="indirect call", goal=GOAL)
    print(f"change -> visible to a client spinning on nvmlDeviceGetUUID, {args.changes} "
          "changes each (ms)")
    for way, samples in visible.items():
        missed = sum(1 for s in samples if s != s)
        seen = [s for s in samples if s == s]
        for q in (50, 99):
            report(BENCH, f"{way} p{q}", percentile(seen, q), "ms", goal=VISIBLE_GOAL)
        if missed:
            print(f"  {way}: {missed} change(s) not seen within 10 s")

if __name__ == "__main__":
    main()
