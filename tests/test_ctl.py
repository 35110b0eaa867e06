"""``mokka ctl``: every verb, strict validation, targets, status, concurrent writers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mokka import cli
from mokka.ctl import command as ctl
from mokka.layout import CONFIG_DIR, OVERRIDES
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state.compile import compile_profile
from mokka.state.overrides import load_overrides
from tests.support import ROOT


@pytest.fixture
def file(tmp_path: Path) -> Path:
    return tmp_path / "overrides.yaml"


def run(file: Path, *args: str) -> int:
    verb, *rest = args
    return ctl.main([verb, "--file", str(file), *rest])


def doc(file: Path) -> dict[str, Any]:
    overrides = load_overrides(file)
    assert overrides is not None
    return overrides.to_mapping()


VERBS = [
    (["fail", "--gpu", "0", "--mode", "lost", "--after-calls", "5"],
     {"devices": {"0": {"failure": {"mode": "lost", "after_calls": 5}}}}),
    (["fail", "--gpu", "1", "--mode", "ecc_uncorrectable", "--probability", "0.5", "--seed", "7"],
     {"devices": {"1": {"failure": {"mode": "ecc_uncorrectable", "probability": 0.5,
                                    "seed": 7}}}}),
    (["temp", "--gpu", "all", "--celsius", "85"],
     {"all": {"thermal": {"temperature_gpu_c": 85}}}),
    (["power", "--gpu", "2", "--watts", "412.5"],
     {"devices": {"2": {"power": {"current_draw_mw": 412500}}}}),
    (["util", "--gpu", "0", "--gpu-pct", "90", "--mem-pct", "40"],
     {"devices": {"0": {"utilization": {"gpu": 90, "memory": 40}}}}),
    (["clocks", "--gpu", "0", "--graphics", "1500", "--memory", "2619"],
     {"devices": {"0": {"clocks": {"graphics_current": 1500, "sm_current": 1500,
                                   "memory_current": 2619}}}}),
    (["pstate", "--gpu", "3", "--state", "p8"],
     {"devices": {"3": {"performance_state": "P8", "power": {"power_state": "P8"}}}}),
    (["set", "--gpu", "4", "thermal.temperature_memory_c=60",
      "clocks_throttle_reasons.sync_boost=true"],
     {"devices": {"4": {"thermal": {"temperature_memory_c": 60},
                        "clocks_throttle_reasons": {"sync_boost": True}}}}),
    (["set", "ecc.errors.volatile.double_bit.device_memory=2"],
     {"all": {"ecc": {"errors": {"volatile": {"double_bit": {"device_memory": 2}}}}}}),
]


@pytest.mark.parametrize(("args", "expected"), VERBS, ids=[" ".join(v[0][:3]) for v in VERBS])
def test_verb_writes_its_override(file: Path, args: list[str], expected: dict) -> None:
    assert run(file, *args) == 0
    assert doc(file) == {"version": 1, **expected}


def test_throttle_sets_exactly_the_named_reasons(file: Path) -> None:
    assert run(file, "throttle", "--gpu", "0", "--reasons", "sw_power_cap,hw-slowdown") == 0
    reasons = doc(file)["devices"]["0"]["clocks_throttle_reasons"]
    assert {k for k, v in reasons.items() if v} == {"sw_power_cap", "hw_slowdown"}
    assert len(reasons) == 9
    assert run(file, "throttle", "--gpu", "0", "--reasons", "none") == 0
    assert not any(doc(file)["devices"]["0"]["clocks_throttle_reasons"].values())


def test_nvlink_errors_accumulate(file: Path) -> None:
    assert run(file, "nvlink-error", "--gpu", "1", "--link", "3") == 0
    assert run(file, "nvlink-error", "--gpu", "1", "--link", "3", "--count", "4") == 0
    assert doc(file)["devices"]["1"]["nvlink_errors"] == {"3": 5}


def test_fabric_health(file: Path) -> None:
    assert run(file, "fabric-health", "--gpu", "0", "--state", "degraded-bandwidth") == 0
    assert doc(file)["devices"]["0"]["fabric"]["health"] == {
        "summary": "unhealthy", "bandwidth": "degraded", "route_recovery_in_progress": False,
        "route_unhealthy": False, "access_timeout_recovery": False,
        "incorrect_configuration": False}


def test_each_xid_call_is_a_new_xid(file: Path) -> None:
    assert run(file, "xid", "--gpu", "2", "--code", "79") == 0
    assert run(file, "xid", "--gpu", "2", "--code", "79") == 0
    assert run(file, "fail", "--gpu", "2", "--mode", "fallen_off_bus", "--xid", "79") == 0
    entries = doc(file)["devices"]["2"]["xids"]
    assert [e["code"] for e in entries] == [79, 79]
    state = compile_profile("h100", node_name="n", overrides=file)
    ids = [x.id for x in state.xids]
    assert [x.gpu_index for x in state.xids] == [2, 2, 2]
    assert len(set(ids)) == 3
    assert state.gpu(2).failure.mode == "fallen_off_bus"


def test_rejects_unknown_keys_and_leaves_the_file(file: Path, capsys) -> None:
    assert run(file, "temp", "--gpu", "0", "--celsius", "50") == 0
    before = file.read_bytes()
    assert run(file, "set", "--gpu", "0", "thermal.temprature_gpu_c=51") == 2
    err = capsys.readouterr().err
    assert f"mokka ctl: error: {file}: devices.0.thermal.temprature_gpu_c: unknown key, " \
           "expected one of: " in err
    assert run(file, "set", "uuid=GPU-x") == 2
    assert "all.uuid: not hot-reloadable" in capsys.readouterr().err
    assert run(file, "set", "--gpu", "0", "oops") == 2
    assert capsys.readouterr().err == (
        "mokka ctl: error: 'oops' is not key.path=value (e.g. thermal.temperature_gpu_c=80)\n")
    assert run(file, "pstate", "--gpu", "0", "--state", "P16") == 2
    assert run(file, "util", "--gpu", "0", "--gpu-pct", "101") == 2
    assert run(file, "throttle", "--gpu", "0", "--reasons", "warp_drive") == 2
    assert "--reasons: warp_drive unknown" in capsys.readouterr().err
    assert run(file, "fabric-health", "--gpu", "0", "--state", "meh") == 2
    assert run(file, "nvlink-error", "--gpu", "0", "--link", "18") == 2
    assert file.read_bytes() == before


@pytest.mark.parametrize("target", ["x", "-1", "GPU-123", "gpu0", "\u00b2", "9" * 40])
def test_rejects_bad_targets(file: Path, target: str, capsys) -> None:
    assert run(file, "temp", "--gpu", target, "--celsius", "50") == 2
    assert capsys.readouterr().err == (
        f"mokka ctl: error: --gpu: {target!r} is not a GPU index, 'all' or a GPU UUID "
        "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)\n")
    assert not file.exists()


def test_targets_checked_against_the_engine_config(file: Path, capsys) -> None:
    state = compile_profile("l40s", node_name="n")  # one GPU: index 0
    (file.parent / "config.yaml").write_text(render_engine_config(state))
    uuid = state.gpus[0].uuid
    assert run(file, "temp", "--gpu", uuid.upper(), "--celsius", "50") == 0
    assert doc(file)["devices"] == {uuid: {"thermal": {"temperature_gpu_c": 50}}}
    assert run(file, "temp", "--gpu", "0", "--celsius", "51") == 0
    assert run(file, "temp", "--gpu", "GPU-cccccccc-0000-0000-0000-000000000000",
               "--celsius", "50") == 2
    assert run(file, "temp", "--gpu", "5", "--celsius", "50") == 2
    assert capsys.readouterr().err.splitlines() == [
        "mokka ctl: error: --gpu: no GPU with UUID GPU-cccccccc-0000-0000-0000-000000000000 "
        "on this node",
        "mokka ctl: error: --gpu: no GPU with index 5 on this node (indices: 0)",
    ]


def test_nested_device_list_is_read_too(file: Path) -> None:
    uuids = ["GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000001"]
    (file.parent / "config.yaml").write_text(yaml.safe_dump(
        {"devices": [{"index": i, "uuid": u} for i, u in enumerate(uuids)]}))
    assert run(file, "temp", "--gpu", uuids[1], "--celsius", "50") == 0
    assert run(file, "temp", "--gpu", "2", "--celsius", "50") == 2


def test_any_uuid_is_a_key_without_an_engine_config(file: Path) -> None:
    uuid = "GPU-dddddddd-0000-0000-0000-000000000000"
    assert run(file, "temp", "--gpu", uuid, "--celsius", "61") == 0
    assert list(doc(file)["devices"]) == [uuid]


def test_status_table_and_json(file: Path, capsys) -> None:
    assert run(file, "status") == 0
    assert capsys.readouterr().out == f"no overrides in {file}\n"
    run(file, "temp", "--gpu", "all", "--celsius", "70")
    run(file, "fail", "--gpu", "0", "--mode", "lost")
    # each write says what it changed (``mokka.ctl.report``); status only shows
    assert capsys.readouterr().out.splitlines() == [
        "every GPU: temperature 70 C; written to --file; whether a daemon reads it is not checked",
        "gpu 0: failure mode lost; written to --file; whether a daemon reads it is not checked",
    ]
    assert run(file, "status") == 0
    assert capsys.readouterr().out.splitlines() == [
        "TARGET  FIELD                      VALUE",
        "all     thermal.temperature_gpu_c  70",
        "0       failure.mode               lost",
    ]
    assert run(file, "status", "--gpu", "0", "--json") == 0
    assert json.loads(capsys.readouterr().out) == {
        "version": 1, "devices": {"0": {"failure": {"mode": "lost"}}}}


def test_reset_one_target_or_everything(file: Path) -> None:
    run(file, "temp", "--gpu", "all", "--celsius", "70")
    run(file, "temp", "--gpu", "0", "--celsius", "71")
    run(file, "temp", "--gpu", "1", "--celsius", "72")
    assert run(file, "reset", "--gpu", "0") == 0
    assert set(doc(file)["devices"]) == {"1"}
    assert run(file, "reset", "--gpu", "all") == 0
    assert "all" not in doc(file)
    assert run(file, "reset") == 0
    assert doc(file) == {"version": 1}


def test_through_the_cli_with_a_node_root(tmp_path: Path, capsys) -> None:
    root = tmp_path / "node"
    (root / CONFIG_DIR.lstrip("/")).mkdir(parents=True)
    assert cli.main(["ctl", "fail", "--root", str(root), "--gpu", "0", "--mode", "lost"]) == 0
    path = root / OVERRIDES.lstrip("/")
    assert doc(path)["devices"]["0"]["failure"] == {"mode": "lost"}
    # a root without the driver config directory: the agent has not staged it
    assert cli.main(["ctl", "temp", "--root", str(tmp_path / "empty"), "--gpu", "0",
                     "--celsius", "1"]) == 1
    assert "no such directory, expected the node's driver config directory" in (
        capsys.readouterr().err)
    assert not (tmp_path / "empty").exists()


def test_location_may_stand_before_the_verb(tmp_path: Path) -> None:
    root = tmp_path / "node"
    (root / CONFIG_DIR.lstrip("/")).mkdir(parents=True)
    assert cli.main(["ctl", "--root", str(root), "fail", "--gpu", "1", "--mode", "lost"]) == 0
    assert doc(root / OVERRIDES.lstrip("/"))["devices"]["1"]["failure"] == {"mode": "lost"}
    # given after the verb as well, the later one wins (argparse order)
    other = tmp_path / "other.yaml"
    assert cli.main(["ctl", "--root", str(root), "xid", "--file", str(other),
                     "--gpu", "0", "--code", "79"]) == 0
    assert other.exists()


WRITER = """
import sys
from mokka.ctl import command as ctl
path, gpu = sys.argv[1], sys.argv[2]
for code in range(1, 21):
    assert ctl.main(["xid", "--file", path, "--gpu", gpu, "--code", str(code)]) == 0
"""


def test_concurrent_writers_lose_no_update(file: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(file), str(gpu)], env=env)
             for gpu in range(8)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    devices = doc(file)["devices"]
    assert sorted(devices, key=int) == [str(g) for g in range(8)]
    for gpu in range(8):
        assert [e["code"] for e in devices[str(gpu)]["xids"]] == list(range(1, 21))
    assert sorted(p.name for p in file.parent.iterdir()) == [
        "overrides.yaml", "overrides.yaml.lock"]


def test_set_reads_values_as_the_file_is_read(file: Path, capsys) -> None:
    """No YAML 1.1 base-60 (``1:20`` is not 80), and a value the loader cannot
    build (a date that is none, a recursive alias) is text, not a traceback."""
    assert run(file, "set", "thermal.temperature_gpu_c=1:20") == 2
    assert capsys.readouterr().err == (
        f"mokka ctl: error: {file}: all.thermal.temperature_gpu_c: '1:20' is not an integer\n")
    assert not file.exists()
    assert run(file, "set", "processes=2024-13-45", "fan=&a [*a]") == 0
    assert doc(file)["all"] == {"processes": "2024-13-45", "fan": "&a [*a]"}


def test_status_json_with_keys_of_several_types(file: Path, capsys) -> None:
    # an open subtree may mix int and string keys
    assert run(file, "set", "fan={0: 40, speed_pct: 50}", "processes=[{pid: 7}]") == 0
    capsys.readouterr()
    assert run(file, "status", "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"version": 1, "all": {
        "fan": {"0": 40, "speed_pct": 50}, "processes": [{"pid": 7}]}}
    assert run(file, "status") == 0
    assert "processes      [{\"pid\":7}]" in capsys.readouterr().out
    # but no date: the engine config has no spelling for one, and its writer would refuse it
    assert run(file, "set", "processes=[{since: 2024-01-31}]") == 2
    assert capsys.readouterr().err == (
        f"mokka ctl: error: {file}: all.processes[0].since: got a date, expected a string, "
        "number or boolean\n")


def test_power_that_is_not_a_number_is_refused(file: Path, capsys) -> None:
    for watts in ("nan", "inf"):
        assert run(file, "power", "--gpu", "0", "--watts", watts) == 2
    assert capsys.readouterr().err.splitlines() == [
        "mokka ctl: error: --watts: nan, expected a number of watts",
        "mokka ctl: error: --watts: inf, expected a number of watts",
    ]
    assert run(file, "fail", "--gpu", "0", "--mode", "lost", "--probability", "nan") == 2
    assert capsys.readouterr().err == (
        f"mokka ctl: error: {file}: devices.0.failure.probability: nan is not a number\n")
    assert not file.exists()


def test_a_file_that_cannot_be_written_is_exit_1_with_a_message(file: Path, capsys) -> None:
    lock = file.with_name(file.name + ".lock")
    lock.mkdir()  # in the lock file's place: open() fails even for root
    assert run(file, "temp", "--gpu", "0", "--celsius", "50") == 1
    err = capsys.readouterr().err
    assert err.startswith(f"mokka ctl: error: {lock}: ")
    assert "Traceback" not in err
    assert not file.exists()
