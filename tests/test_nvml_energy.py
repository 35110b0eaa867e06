"""The total energy counter: the integral of the power draw, read through nvidia-ml-py.

``nvmlDeviceGetTotalEnergyConsumption`` and the field values 83 and 191 answer
the profile's ``total_energy_consumption_mj`` plus the integral of the draw
since the driver loaded: from the node's boot time (``btime`` of /proc/stat),
or from the epoch when the clock is pinned before the boot (docs/workloads.md,
"Energy").  Most tests pin the clock with MOCK_NVML_CLOCK_OVERRIDE, so the
expected integral is exact; the real-clock ones only wait (bounded) for the
counter to move.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state.compile import compile_profile
from mokka.state.profile import read_profile_text
from tests.nvml_support import nvml_env, write_config


def boot_time() -> int:
    """The node's boot time, as the library reads it (``btime`` of /proc/stat); 0 if none."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    return 0


#: The node's boot time: where the counter counts from (0: the epoch).
BOOT = boot_time()
#: A pinned instant some 15 minutes after the boot, a multiple of every period below.
T0 = float((BOOT // 100 + 10) * 100)
#: The h100 profile's idle draw and enforced limit (mW).
IDLE_MW, LIMIT_MW = 68920, 700000
#: What two readings may differ from the exact integral by (mJ): each
#: answer is F(t) - F(boot) rounded down, both computed in doubles near 1e15.
TOLERANCE_MJ = 2



@pytest.fixture
def boot_time_known() -> None:
    """Linux always shows ``btime``; without it these tests cannot say what they check."""
    assert BOOT >= 10**6, "/proc/stat shows no boot time (btime): the counter's origin is unknown"

#: ``python -c PROBE STEP...``: each step is ``t=<instant>`` (pins the clock),
#: ``write=<path>=<source>`` (copies a file into place), ``rm=<path>`` or
#: ``read`` (every GPU's counter, by the getter and both field values).
PROBE = r"""
import json, os, shutil, sys
import pynvml as nv
nv.nvmlInit()
handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
out = []
for step in sys.argv[1:]:
    if step.startswith("t="):
        os.environ["MOCK_NVML_CLOCK_OVERRIDE"] = step[2:]
    elif step.startswith("write="):
        target, source = step[6:].split("=")
        shutil.copyfile(source, target + ".tmp")
        os.replace(target + ".tmp", target)
    elif step.startswith("rm="):
        os.unlink(step[3:])
    else:
        reading = []
        for h in handles:
            fields = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
                                                     (nv.NVML_FI_DEV_ENERGY, 0)])
            reading.append([nv.nvmlDeviceGetTotalEnergyConsumption(h),
                            fields[0].value.ullVal, fields[1].value.ullVal])
        out.append(reading)
nv.nvmlShutdown()
print(json.dumps(out))
"""


def profile_with(tmp_path: Path, dynamics: dict[str, Any] | None, name: str = "p.yaml") -> Path:
    doc = yaml.safe_load(read_profile_text("h100")[1])
    if dynamics is not None:
        doc["device_defaults"]["dynamics"] = dynamics
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def run_probe(native: Path, config: Path, *steps: str, **env: str) -> list[list[int]]:
    """Device 0's counter at each ``read`` step; the three ways agree."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *steps],
        env=nvml_env(native, config, MOCK_NVML_CLOCK_OVERRIDE=repr(T0), **env),
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    readings = json.loads(result.stdout)
    for reading in readings:
        for getter, field83, field191 in reading:
            assert getter == field83 == field191
    return [[device[0] for device in reading] for reading in readings]


def at(*instants: float) -> list[str]:
    return [step for t in instants for step in (f"t={t!r}", "read")]


def ramp_energy(a_w: float, b_w: float, period: float, t: float) -> float:
    """mJ from the epoch to t of a power ramp a -> b W (within the limit)."""
    whole, s = divmod(t, period)
    per_period = (a_w + b_w) / 2 * period
    partial = a_w * s + (b_w - a_w) * s * s / (2 * period)
    return (whole * per_period + partial) * 1000


def burst_energy(t: float) -> float:
    """mJ from the epoch to t of the utilization burst below: each 10 s period
    3 s at the limit, then 7 s idle."""
    whole, s = divmod(t, 10)
    return (whole * (3 * LIMIT_MW + 7 * IDLE_MW) + LIMIT_MW * min(s, 3)
            + IDLE_MW * max(0.0, s - 3))


def test_a_power_ramp_is_integrated_exactly(native: Path, node_root: Path,
                                            tmp_path: Path) -> None:
    ramp = {"power": {"pattern": "ramp", "from": 100, "to": 500, "period_s": 10}}
    config = write_config(node_root, compile_profile(profile_with(tmp_path, ramp),
                                                     node_name="node-a"))
    instants = [T0 + 0.7 * i for i in range(30)]
    counters = [reading[0] for reading in run_probe(native, config, *at(*instants))]
    for t, counter in zip(instants, counters, strict=True):
        # from the boot, the ramp in its phase from the epoch
        exact = ramp_energy(100, 500, 10, t) - ramp_energy(100, 500, 10, BOOT)
        assert abs(counter - exact) <= TOLERANCE_MJ
    for (t1, e1), (t2, e2) in itertools.pairwise(zip(instants, counters, strict=True)):
        exact = ramp_energy(100, 500, 10, t2) - ramp_energy(100, 500, 10, t1)
        assert abs((e2 - e1) - exact) <= TOLERANCE_MJ


def test_a_capped_ramp_and_a_utilization_burst_follow_the_draw(native: Path, node_root: Path,
                                                                tmp_path: Path) -> None:
    """The draw the getters report is what accrues, the limit's cap included."""
    dynamics = {"power": {"pattern": "ramp", "from": 300, "to": 900, "period_s": 20}}
    config = write_config(node_root, compile_profile(profile_with(tmp_path, dynamics),
                                                     node_name="node-a"))
    start, end = T0 + 3.0, T0 + 17.0  # 390 W .. 810 W: capped at 700 W from 16 s

    def draw_mw(t: float) -> float:
        watts = 300 + 600 * ((t - T0) % 20) / 20
        return min(max(watts * 1000, 0), LIMIT_MW)
    steps = 200_000
    width = (end - start) / steps
    exact = sum(draw_mw(start + (i + 0.5) * width) for i in range(steps)) * width
    e1, e2 = (reading[0] for reading in run_probe(native, config, *at(start, end)))
    assert abs((e2 - e1) - exact) <= TOLERANCE_MJ + 1e-6 * exact

    burst = {"utilization": {"pattern": "burst", "low": 0, "high": 100, "period_s": 10,
                             "duty": 0.3}}
    config = write_config(node_root, compile_profile(profile_with(tmp_path, burst),
                                                     node_name="node-a"))
    # 0..3 s of each period at the limit, 3..10 s idle
    e = [reading[0] for reading in run_probe(native, config, *at(T0, T0 + 2, T0 + 10, T0 + 25))]
    assert abs((e[1] - e[0]) - 2 * LIMIT_MW) <= TOLERANCE_MJ
    assert abs((e[2] - e[0]) - (3 * LIMIT_MW + 7 * IDLE_MW)) <= TOLERANCE_MJ
    assert abs((e[3] - e[2]) - (3 * LIMIT_MW + 7 * IDLE_MW + 3 * LIMIT_MW + 2 * IDLE_MW)
               ) <= TOLERANCE_MJ
    assert abs(e[0] - (burst_energy(T0) - burst_energy(BOOT))) <= TOLERANCE_MJ


def test_noise_accrues_at_the_mean_draw_of_its_values(native: Path, node_root: Path,
                                                      tmp_path: Path) -> None:
    noise = {"power": {"pattern": "noise", "mean": 600, "amplitude": 400, "seed": 11}}
    config = write_config(node_root, compile_profile(profile_with(tmp_path, noise),
                                                     node_name="node-a"))
    # values uniform over 200..1000 W, the draw capped at 700 W
    mean_mw = ((700**2 - 200**2) / 2 + 700 * 300) / 800 * 1000
    e1, e2 = (reading[0] for reading in run_probe(native, config, *at(T0, T0 + 60)))
    assert abs((e2 - e1) - 60 * mean_mw) <= TOLERANCE_MJ
    assert abs(e1 - (T0 - BOOT) * mean_mw) <= TOLERANCE_MJ


def test_two_processes_reading_the_same_instants_agree(native: Path, node_root: Path,
                                                       tmp_path: Path) -> None:
    noisy = {"step_s": 0.5,
             "utilization": {"pattern": "noise", "mean": 50, "amplitude": 50, "seed": 7}}
    config = write_config(node_root, compile_profile(profile_with(tmp_path, noisy),
                                                     node_name="node-a"))
    instants = [T0 + 0.37 * i for i in range(25)]
    first, second = run_probe(native, config, *at(*instants)), run_probe(native, config,
                                                                        *at(*instants))
    assert first == second
    for earlier, later in itertools.pairwise(first):
        assert all(b > a for a, b in zip(earlier, later, strict=True))
    # a process that starts reading later is on the same course: the origin
    # does not depend on when a process started
    assert run_probe(native, config, *at(*instants[10:])) == first[10:]
    # the utilization's values are uniform over 0..100 %: the mean draw is
    # halfway between idle and the limit
    assert abs(first[0][0] - (T0 - BOOT) * (IDLE_MW + LIMIT_MW) / 2) <= TOLERANCE_MJ


def test_the_counter_carries_on_when_holders_come_and_go(native: Path, node_root: Path,
                                                         tmp_path: Path) -> None:
    """A change of draw never makes the counter jump or go back within a process."""
    config = write_config(node_root, compile_profile("h100", node_name="node-a"))
    workload = config.parent / "workload.yaml"
    held = tmp_path / "held.yaml"
    held.write_text("format: 1\nworkload.memory_share_per_holder: 0.4\n"
                    "workload.utilization_per_holder: 60\ndevice_count: 8\n"
                    "device.0.process_count: 2\n"
                    'device.0.process.0.pid: 200001\ndevice.0.process.0.name: "k8s:a/b/c"\n'
                    'device.0.process.1.pid: 200002\ndevice.0.process.1.name: "k8s:a/d/c"\n')
    t = [T0 + 10 * i for i in range(6)]
    steps = [f"t={t[0]!r}", "read", f"t={t[1]!r}", "read",
             f"write={workload}={held}", f"t={t[2]!r}", "read", f"t={t[3]!r}", "read",
             f"rm={workload}", f"t={t[4]!r}", "read", f"t={t[5]!r}", "read"]
    # stat the files at every call, so each step's file is in force at the next read
    e = [reading[0] for reading in run_probe(native, config, *steps,
                                             MOCK_NVML_RECHECK_INTERVAL_MS="0")]
    assert e[0] == IDLE_MW * (T0 - BOOT)  # a fresh process: the shared course
    # the interval in which the file changed counts at the draw before it
    expected = [0, 10 * IDLE_MW, 20 * IDLE_MW, 20 * IDLE_MW + 10 * LIMIT_MW,
                20 * IDLE_MW + 20 * LIMIT_MW, 30 * IDLE_MW + 20 * LIMIT_MW]
    for counter, gained in zip(e, expected, strict=True):
        assert abs(counter - e[0] - gained) <= TOLERANCE_MJ
    # a process started now follows the shared course again (the documented rule)
    assert run_probe(native, config, *at(t[5])) == [[int(IDLE_MW * (t[5] - BOOT))] * 8]


def test_a_reload_that_changes_the_draw_never_goes_back(native: Path, node_root: Path,
                                                        tmp_path: Path) -> None:
    busy = {"utilization": {"pattern": "steady", "value": 100}}
    config = write_config(node_root, compile_profile(profile_with(tmp_path, busy),
                                                     node_name="node-a"))
    idle_config = tmp_path / "idle-config.yaml"
    idle_config.write_text(render_engine_config(compile_profile("h100", node_name="node-a")))
    steps = [f"t={T0!r}", "read", f"t={T0 + 5!r}", "read", f"write={config}={idle_config}",
             f"t={T0 + 10!r}", "read", f"t={T0 + 20!r}", "read"]
    e = [reading[0] for reading in run_probe(native, config, *steps,
                                             MOCK_NVML_RECHECK_INTERVAL_MS="0")]
    assert e == sorted(e)
    assert abs(e[1] - e[0] - 5 * LIMIT_MW) <= TOLERANCE_MJ
    assert abs(e[2] - e[1] - 5 * LIMIT_MW) <= TOLERANCE_MJ
    assert abs(e[3] - e[2] - 10 * IDLE_MW) <= TOLERANCE_MJ


def test_answers_kept_for_a_tick_are_the_ones_the_counter_gives(native: Path, node_root: Path,
                                                                tmp_path: Path) -> None:
    """Calls of one tick get the last answer kept for it (docs/workloads.md, "Cost");
    a new workload file within the same tick is a new answer, never the kept one.
    With MOCK_NVML_READING_CACHE=0 every answer is worked out afresh: the same."""
    noisy = {"step_s": 0.5,
             "utilization": {"pattern": "noise", "mean": 50, "amplitude": 50, "seed": 7}}
    config = write_config(node_root, compile_profile(profile_with(tmp_path, noisy),
                                                     node_name="node-a"))
    workload = config.parent / "workload.yaml"
    held = tmp_path / "held.yaml"
    held.write_text("format: 1\nworkload.memory_share_per_holder: 0.4\n"
                    "workload.utilization_per_holder: 100\ndevice_count: 8\n"
                    "device.0.process_count: 1\n"
                    'device.0.process.0.pid: 200001\ndevice.0.process.0.name: "k8s:a/b/c"\n')
    t = [T0 + 0.37 * i for i in range(6)]
    steps = [*at(t[0], t[0], t[1], t[1], t[0]), f"write={workload}={held}", "read",
             *at(t[2], t[2], t[3]), f"rm={workload}", "read", *at(t[4], t[5], t[5])]
    kept = run_probe(native, config, *steps, MOCK_NVML_RECHECK_INTERVAL_MS="0")
    fresh = run_probe(native, config, *steps, MOCK_NVML_RECHECK_INTERVAL_MS="0",
                      MOCK_NVML_READING_CACHE="0")
    assert kept == fresh
    assert [reading[0] for reading in kept] == sorted(reading[0] for reading in kept)
    assert kept[0] == kept[1]  # the same instant: the same answer
    assert kept[2][0] > kept[0][0]


@pytest.mark.usefixtures("boot_time_known")
def test_a_pinned_clock_counts_from_the_boot_or_before_it_from_the_epoch(
        native: Path, node_root: Path) -> None:
    """The documented rule: the boot time when it is not after the instant read,
    else the epoch; a process whose clock crosses the boot carries on."""
    config = write_config(node_root, compile_profile("h100", node_name="node-a"))
    before, after = float(BOOT - 100_000), float(BOOT + 1000)
    # fresh processes: a function of the instant alone
    assert run_probe(native, config, *at(before)) == [[IDLE_MW * (BOOT - 100_000)] * 8]
    assert run_probe(native, config, *at(float(BOOT))) == [[0] * 8]
    assert run_probe(native, config, *at(after)) == [[IDLE_MW * 1000] * 8]
    # one process across the boot: no jump back to the boot's count, on at the draw
    e = [reading[0] for reading in run_probe(native, config, *at(BOOT - 10.0, BOOT + 10.0,
                                                                 after))]
    assert e[0] == IDLE_MW * (BOOT - 10)
    assert e[1] - e[0] == 20 * IDLE_MW
    assert e[2] - e[1] == (1000 - 10) * IDLE_MW
    # and back before it and forward again: never backwards
    e = [reading[0] for reading in run_probe(native, config, *at(after, before, BOOT + 5.0,
                                                                 after + 60))]
    assert e[0] == IDLE_MW * 1000
    assert e == sorted(e)


#: Reads device 0's counter on the real clock, bracketed by the precise clock:
#: once, again as soon as it moves (busy-waiting at most 2 s), and once more
#: after half a second.
REAL_CLOCK = r"""
import json, time
import pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)

def read():
    before = time.time()
    counter = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    return [before, counter, time.time()]

first = read()
deadline = time.monotonic() + 2
second = first
while second[1] == first[1] and time.monotonic() < deadline:
    second = read()
time.sleep(0.5)
third = read()
print(json.dumps([first, second, third]))
"""

#: How far the library's clock (CLOCK_REALTIME_COARSE, as of the kernel's
#: last tick) may lag the precise one (s).
COARSE_LAG_S = 0.05


@pytest.mark.usefixtures("boot_time_known")
def test_on_the_real_clock_the_counter_counts_from_the_boot(native: Path,
                                                            node_root: Path) -> None:
    """An idle H100 reads its draw times the time since boot (about 4e9 mJ a
    day), not times the time since 1970 (about 1.2e14 mJ); two processes are
    on that one course, and it climbs at the draw."""
    config = write_config(node_root, compile_profile("h100", node_name="node-a"))
    children = [subprocess.Popen([sys.executable, "-c", REAL_CLOCK],
                                 env=nvml_env(native, config), stdout=subprocess.PIPE, text=True)
                for _ in range(2)]
    try:
        outs = [child.communicate(timeout=60)[0] for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait(timeout=10)
    assert [child.returncode for child in children] == [0, 0]
    assert time.time() > BOOT
    for out in outs:
        readings = json.loads(out)
        for before, counter, after in readings:
            # the instant the counter stands for, on the course from the boot
            # (the same course in both processes)
            assert before - COARSE_LAG_S <= BOOT + counter / IDLE_MW <= after
            assert counter < IDLE_MW * before / 2  # far below the draw since 1970
        (b1, e1, a1), (_, e2, _), (b3, e3, a3) = readings
        assert e1 < e2 <= e3
        # at the draw: what it drew between the reads, within the clocks' slack
        assert IDLE_MW * (b3 - a1 - COARSE_LAG_S) <= e3 - e1 <= IDLE_MW * (a3 - b1 + COARSE_LAG_S)
