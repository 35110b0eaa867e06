"""Overrides that agree with each other: a pinned reading drives the ones linked to it.

``mokka ctl util`` loads a board as a workload at that utilization would: the
SM clock boosts, the draw and the temperature rise toward their loaded
values, the performance state is P0 and the GPU-idle reason goes; a draw
pinned at or over the enforced limit is the SW power cap.  A reading pinned
itself always reads as pinned (docs/nvml.md, "Linked readings").  Checked
through nvidia-ml-py and the real nvidia-smi 535 on one h100 node whose
profile idles in P8, so the move to P0 shows.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mokka.state.compile import compile_profile
from mokka.state.profile import read_profile_text
from tests.nvml_support import nvml_env, run_smi, write_config

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(120)]

READINGS = Path(__file__).resolve().parent / "nvml_readings_probe.py"
SW_POWER_CAP, GPU_IDLE = 0x4, 0x1
P0, P8 = 0, 8
#: The h100 profile's figures the checks lean on.
IDLE_MW, LIMIT_MW, SM_MAX, SM_IDLE, IDLE_C = 68920, 700000, 1980, 345, 29

#: What each GPU of the node is told (``mokka ctl`` verb and flags); GPU 1 is
#: held by one pod at 80 % instead (the workload file), GPU 2 is left idle.
CTL = {
    0: [["util", "--gpu-pct", "80"]],
    3: [["power", "--watts", "750"]],
    4: [["power", "--watts", "750"], ["util", "--gpu-pct", "80"]],
    5: [["util", "--gpu-pct", "100"], ["temp", "--celsius", "40"],
        ["clocks", "--graphics", "1005"], ["power", "--watts", "300"]],
    6: [["power", "--watts", "750"], ["throttle", "--reasons", "none"]],
    7: [["util", "--gpu-pct", "80"], ["pstate", "--state", "P8"]],
}
WORKLOAD = ("format: 1\nworkload.memory_share_per_holder: 0\n"
            "workload.utilization_per_holder: 80\ndevice_count: 8\n"
            'device.1.process_count: 1\ndevice.1.process.0.pid: 310001\n'
            'device.1.process.0.name: "k8s:ns/pod/main"\n')


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine config of the node above, with its workload file beside it."""
    from mokka.ctl import command as ctl

    where = tmp_path_factory.mktemp("linked")
    doc = yaml.safe_load(read_profile_text("h100")[1])
    doc["device_defaults"]["performance_state"] = "P8"
    doc["device_defaults"]["power"]["power_state"] = "P8"
    (where / "p8.yaml").write_text(yaml.safe_dump(doc))
    overrides = where / "overrides.yaml"
    for gpu, calls in CTL.items():
        for verb, *flags in calls:
            assert ctl.main([verb, "--file", str(overrides), "--gpu", str(gpu), *flags]) == 0
    state = compile_profile(where / "p8.yaml", node_name="node-a", overrides=overrides)
    config = write_config(where / "root", state)
    (config.parent / "workload.yaml").write_text(WORKLOAD)
    return config


def nvml_readings(native: Path, config: Path) -> dict[str, Any]:
    script = ("import json, pynvml as nv\nnv.nvmlInit()\n"
              "print(json.dumps([nv.nvmlDeviceGetPerformanceState(nv.nvmlDeviceGetHandleByIndex(i))"
              " for i in range(nv.nvmlDeviceGetCount())]))\n")
    states = subprocess.run([sys.executable, "-c", script], env=nvml_env(native, config),
                            capture_output=True, text=True, timeout=60)
    assert states.returncode == 0, states.stderr
    result = subprocess.run([sys.executable, str(READINGS)], env=nvml_env(native, config),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    readings = json.loads(result.stdout)["instants"][0]
    for index, pstate in enumerate(json.loads(states.stdout)):
        readings[str(index)]["pstate"] = pstate
        readings[str(index)].pop("processes")
    return readings


def linked(reading: dict[str, Any]) -> dict[str, Any]:
    keys = ("util_gpu", "util_memory", "power_mw", "temperature_c", "sm_clock_mhz", "reasons",
            "pstate")
    return {key: reading[key] for key in keys}


def test_pinned_utilization_drives_the_board_as_a_workload_does(native: Path, node: Path):
    got = nvml_readings(native, node)
    pinned, held, idle = got["0"], got["1"], got["2"]
    assert linked(idle) == {"util_gpu": 0, "util_memory": 0, "power_mw": IDLE_MW,
                            "temperature_c": IDLE_C, "sm_clock_mhz": SM_IDLE, "reasons": GPU_IDLE,
                            "pstate": P8}
    # the same board at the same load, pinned or held: the same readings
    assert linked(pinned) == linked(held)
    assert pinned["util_gpu"] == 80
    assert pinned["sm_clock_mhz"] == SM_MAX  # boost: no limit holds it at 80 %
    assert IDLE_MW < pinned["power_mw"] < LIMIT_MW
    assert IDLE_C < pinned["temperature_c"] < pinned["slowdown_c"]
    assert pinned["pstate"] == P0
    assert pinned["reasons"] & GPU_IDLE == 0


def test_a_pinned_reading_always_wins(native: Path, node: Path):
    got = nvml_readings(native, node)
    everything = got["5"]  # utilization, temperature, clocks and draw all pinned
    assert linked(everything) == {"util_gpu": 100, "util_memory": 50, "power_mw": 300000,
                                  "temperature_c": 40, "sm_clock_mhz": 1005, "reasons": 0,
                                  "pstate": P0}
    state_pinned = got["7"]  # busy, but ``mokka ctl pstate P8`` says P8
    assert state_pinned["pstate"] == P8
    assert state_pinned["sm_clock_mhz"] == SM_MAX


def test_a_draw_pinned_over_the_limit_is_the_sw_power_cap(native: Path, node: Path):
    got = nvml_readings(native, node)
    idle_capped, busy_capped, reasons_pinned = got["3"], got["4"], got["6"]
    assert idle_capped["power_mw"] == busy_capped["power_mw"] == 750000  # as pinned
    assert idle_capped["reasons"] & SW_POWER_CAP
    assert idle_capped["sm_clock_mhz"] == SM_IDLE
    # the cap holds a busy board's clock below boost, as a capped workload's
    assert busy_capped["reasons"] & SW_POWER_CAP
    assert SM_IDLE < busy_capped["sm_clock_mhz"] < SM_MAX
    assert busy_capped["pstate"] == P0
    # ``mokka ctl throttle --reasons none`` pinned the reasons: they stay off
    assert reasons_pinned["reasons"] == 0
    assert reasons_pinned["power_mw"] == 750000


def test_nvidia_smi_sees_the_linked_readings(native: Path, smi: Path, node: Path):
    query = ("--query-gpu=index,pstate,utilization.gpu,clocks.sm,power.draw,temperature.gpu,"
             "clocks_throttle_reasons.sw_power_cap,clocks_throttle_reasons.gpu_idle")
    result = run_smi(smi, native, node, query, "--format=csv,noheader,nounits")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {row[0]: row[1:] for row in
            ([cell.strip() for cell in line] for line in csv.reader(io.StringIO(result.stdout)))
            if row}
    assert rows["0"] == rows["1"]  # pinned at 80 %, held at 80 %
    pstate, util, sm, _draw, _temperature, cap, idle = rows["0"]
    assert (pstate, util, sm, cap, idle) == ("P0", "80", str(SM_MAX), "Not Active", "Not Active")
    assert rows["2"][:3] == ["P8", "0", str(SM_IDLE)]
    assert rows["3"][5] == rows["4"][5] == "Active"
    assert rows["5"][:5] == ["P0", "100", "1005", "300.00", "40"]
    performance = run_smi(smi, native, node, "-q", "-i", "3", "-d", "PERFORMANCE")
    assert performance.returncode == 0, performance.stdout + performance.stderr
    cap_lines = [line.split(":")[1].strip() for line in performance.stdout.splitlines()
                 if line.strip().startswith("SW Power Cap")]
    assert cap_lines == ["Active"]
