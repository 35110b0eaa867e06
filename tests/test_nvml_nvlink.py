"""NVLink as real tools read it: link state, speed, capabilities, errors and
traffic counters, through the real nvidia-smi 535 and nvidia-ml-py.

Every NVLink profile must show its links up at the profile's speed (a link
that reads down makes `nvidia-smi nvlink -s` print "all links are
inActive" and monitoring exporters report NaN throughput); boards without
NVLink show none.  Errors are the ones `mokka ctl nvlink-error` injects.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mokka.ctl import command as ctl
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.nvml_support import nvml_env, run_smi, write_config

pytestmark = pytest.mark.realclient

NVLINK_PROFILES = ["h100", "a100", "b200", "gb200", "gb300"]
NO_NVLINK_PROFILES = ["t4", "l40s"]
SUCCESS, NOT_SUPPORTED = 0, 3
ALL_LINKS = 0xFFFFFFFF

# nvml.h field ids
FI_THROUGHPUT_DATA_TX, FI_THROUGHPUT_DATA_RX = 138, 139
FI_THROUGHPUT_RAW_TX, FI_THROUGHPUT_RAW_RX = 140, 141
FI_REMOTE_LINK_ID = 146
FI_DL_REPLAY, FI_DL_RECOVERY, FI_DL_CRC = 161, 162, 163
FI_GET_SPEED, FI_GET_STATE, FI_GET_VERSION = 164, 165, 166
FI_CRC_FLIT_TOTAL, FI_REPLAY_L3 = 38, 49
FI_XMIT_BYTES, FI_RCV_ERRORS = 202, 208


def state_with(profile: str, tmp_path: Path, *ctl_calls: list[str]) -> State:
    """The profile compiled with overrides that ``mokka ctl`` wrote."""
    overrides = tmp_path / "overrides.yaml"
    for call in ctl_calls:
        verb, *rest = call
        assert ctl.main([verb, "--file", str(overrides), *rest]) == 0
    return compile_profile(
        profile, node_name="worker-1", overrides=overrides if ctl_calls else None
    )


def smi_out(smi: Path, native: Path, config: Path, *args: str) -> str:
    result = run_smi(smi, native, config, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Unknown Error" not in result.stdout
    return result.stdout


def gpu_sections(out: str) -> list[list[str]]:
    """nvidia-smi's per-GPU blocks ("GPU n: name (UUID: ...)" then tab-indented lines)."""
    sections: list[list[str]] = []
    for line in out.splitlines():
        if line.startswith("GPU "):
            sections.append([])
        elif line.strip() and sections:
            sections[-1].append(line.strip())
    return sections


@pytest.mark.parametrize("profile", NVLINK_PROFILES)
def test_status_lists_every_link_active_at_the_profile_speed(
    native: Path, smi: Path, tmp_path: Path, profile: str
):
    state = compile_profile(profile, node_name="worker-1")
    assert state.nvlink is not None
    out = smi_out(smi, native, write_config(tmp_path, state), "nvlink", "-s")
    assert "inActive" not in out
    speed = f"{state.nvlink.bandwidth_per_link_mbps / 1000:g} GB/s"
    sections = gpu_sections(out)
    assert len(sections) == len(state.gpus)
    for lines in sections:
        assert lines == [f"Link {link}: {speed}" for link in range(state.nvlink.links_per_gpu)]


def test_h100_status_is_18_links_of_26_562_gb_per_second(native: Path, smi: Path, tmp_path: Path):
    config = write_config(tmp_path, compile_profile("h100", node_name="worker-1"))
    out = smi_out(smi, native, config, "nvlink", "-s", "-i", "0")
    assert re.findall(r"Link (\d+): 26\.562 GB/s", out) == [str(n) for n in range(18)]


@pytest.mark.parametrize("profile", NO_NVLINK_PROFILES)
def test_boards_without_nvlink_show_no_links(
    native: Path, smi: Path, tmp_path: Path, profile: str
):
    config = write_config(tmp_path, compile_profile(profile, node_name="worker-1"))
    for flag in ("-s", "-c", "-e"):
        out = smi_out(smi, native, config, "nvlink", flag)
        assert "Link" not in out, (flag, out)


@pytest.mark.parametrize(("profile", "sysmem"), [("h100", "false"), ("gb200", "true")])
def test_capabilities_of_every_link(
    native: Path, smi: Path, tmp_path: Path, profile: str, sysmem: str
):
    """Grace-attached GPUs (C2C) reach system memory over NVLink; HGX boards do not."""
    state = compile_profile(profile, node_name="worker-1")
    assert state.nvlink is not None
    out = smi_out(smi, native, write_config(tmp_path, state), "nvlink", "-c", "-i", "0")
    [lines] = gpu_sections(out)
    expected = []
    for link in range(state.nvlink.links_per_gpu):
        expected += [
            f"Link {link}, P2P is supported: true",
            f"Link {link}, Access to system memory supported: {sysmem}",
            f"Link {link}, P2P atomics supported: true",
            f"Link {link}, System memory atomics supported: {sysmem}",
            f"Link {link}, SLI is supported: false",
            f"Link {link}, Link is supported: true",
        ]
    assert lines == expected


def test_errors_show_what_ctl_injected(native: Path, smi: Path, tmp_path: Path):
    state = state_with(
        "h100", tmp_path,
        ["nvlink-error", "--gpu", "0", "--link", "3"],
        ["nvlink-error", "--gpu", "0", "--link", "3", "--count", "4"],
        ["nvlink-error", "--gpu", "1", "--link", "17", "--count", "2"],
    )
    config = write_config(tmp_path, state)
    gpu0, gpu1 = gpu_sections(smi_out(smi, native, config, "nvlink", "-e", "-i", "0")) + \
        gpu_sections(smi_out(smi, native, config, "nvlink", "-e", "-i", "1"))
    for gpu, injected in ((gpu0, {3: 5}), (gpu1, {17: 2})):
        expected = []
        for link in range(18):
            n = injected.get(link, 0)
            expected += [
                f"Link {link}: Replay Errors: {n}",
                f"Link {link}: Recovery Errors: 0",
                f"Link {link}: CRC Errors: {n}",
            ]
        assert gpu == expected


FIELDS_SCRIPT = """
import json, sys
import pynvml as nv
nv.nvmlInit()
out = []
for index, requests in json.loads(sys.argv[1]):
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    values = nv.nvmlDeviceGetFieldValues(handle, [tuple(r) for r in requests])
    out.append([
        {"ret": v.nvmlReturn, "type": v.valueType, "value": v.value.ullVal}
        for v in values
    ])
print(json.dumps(out))
"""


def field_values(native: Path, config: Path, queries: list[tuple[int, list[tuple[int, int]]]]
                 ) -> list[list[dict[str, Any]]]:
    """nvmlDeviceGetFieldValues through nvidia-ml-py: per query, (field, scope) answers."""
    result = subprocess.run(
        [sys.executable, "-c", FIELDS_SCRIPT, json.dumps(queries)],
        env=nvml_env(native, config), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("profile", NVLINK_PROFILES)
def test_link_fields_answer_on_every_nvlink_profile(native: Path, tmp_path: Path, profile: str):
    state = compile_profile(profile, node_name="worker-1")
    assert state.nvlink is not None
    links = state.nvlink.links_per_gpu
    config = write_config(tmp_path, state)
    requests = []
    for link in range(links):
        requests += [(FI_GET_STATE, link), (FI_GET_SPEED, link), (FI_GET_VERSION, link),
                     (FI_THROUGHPUT_DATA_TX, link), (FI_THROUGHPUT_DATA_RX, link),
                     (FI_THROUGHPUT_RAW_TX, link), (FI_THROUGHPUT_RAW_RX, link),
                     (FI_REMOTE_LINK_ID, link), (FI_DL_REPLAY, link), (FI_DL_CRC, link)]
    requests += [(FI_THROUGHPUT_DATA_TX, ALL_LINKS), (FI_THROUGHPUT_DATA_RX, ALL_LINKS),
                 (FI_GET_STATE, links)]
    [got] = field_values(native, config, [(0, requests)])
    by_request = dict(zip(requests, got, strict=True))
    for link in range(links):
        assert by_request[(FI_GET_STATE, link)] == {"ret": SUCCESS, "type": 1, "value": 1}
        assert by_request[(FI_GET_SPEED, link)]["value"] == state.nvlink.bandwidth_per_link_mbps
        assert by_request[(FI_GET_VERSION, link)]["value"] == state.nvlink.version
        # the switch port (tests/test_nvml_nvlink_wiring.py); a link's own number without one
        assert by_request[(FI_REMOTE_LINK_ID, link)]["ret"] == SUCCESS
        if not state.nvlink.switches:
            assert by_request[(FI_REMOTE_LINK_ID, link)]["value"] == link
        for fid in (FI_THROUGHPUT_DATA_TX, FI_THROUGHPUT_DATA_RX, FI_THROUGHPUT_RAW_TX,
                    FI_THROUGHPUT_RAW_RX, FI_DL_REPLAY, FI_DL_CRC):
            answer = by_request[(fid, link)]
            assert answer["ret"] == SUCCESS, (fid, link)
            assert answer["type"] == 3  # unsigned long long
    assert by_request[(FI_THROUGHPUT_DATA_TX, ALL_LINKS)]["ret"] == SUCCESS
    assert by_request[(FI_THROUGHPUT_DATA_RX, ALL_LINKS)]["ret"] == SUCCESS
    # one past the last link: no such link
    assert by_request[(FI_GET_STATE, links)]["ret"] == NOT_SUPPORTED


@pytest.mark.parametrize("profile", NO_NVLINK_PROFILES)
def test_link_fields_are_not_supported_without_nvlink(native: Path, tmp_path: Path, profile: str):
    config = write_config(tmp_path, compile_profile(profile, node_name="worker-1"))
    requests = [(FI_GET_STATE, 0), (FI_GET_SPEED, 0), (FI_THROUGHPUT_DATA_TX, 0),
                (FI_THROUGHPUT_DATA_RX, ALL_LINKS), (FI_DL_CRC, 0)]
    [got] = field_values(native, config, [(0, requests)])
    assert [answer["ret"] for answer in got] == [NOT_SUPPORTED] * len(requests)


def test_error_fields_carry_injected_errors(native: Path, tmp_path: Path):
    state = state_with("h100", tmp_path, ["nvlink-error", "--gpu", "0", "--link", "3",
                                          "--count", "7"])
    config = write_config(tmp_path, state)
    requests = [(FI_DL_CRC, 3), (FI_DL_REPLAY, 3), (FI_DL_RECOVERY, 3), (FI_DL_CRC, 2),
                (FI_CRC_FLIT_TOTAL, 0), (FI_REPLAY_L3, 0)]
    got0, got1 = field_values(native, config, [(0, requests), (1, requests)])
    assert [a["value"] for a in got0] == [7, 7, 0, 0, 7, 7]
    assert [a["value"] for a in got1] == [0] * len(requests)
    assert {a["ret"] for a in got0 + got1} == {SUCCESS}


def test_nvlink5_counters_only_on_blackwell(native: Path, tmp_path: Path):
    requests = [(FI_XMIT_BYTES, 0), (FI_RCV_ERRORS, 0)]
    [gb200] = field_values(native, write_config(tmp_path / "gb200", compile_profile(
        "gb200", node_name="worker-1")), [(0, requests)])
    [h100] = field_values(native, write_config(tmp_path / "h100", compile_profile(
        "h100", node_name="worker-1")), [(0, requests)])
    assert [a["ret"] for a in gb200] == [SUCCESS, SUCCESS]
    assert [a["ret"] for a in h100] == [NOT_SUPPORTED, NOT_SUPPORTED]


TRAFFIC_SCRIPT = """
import json, sys, time
import pynvml as nv
nv.nvmlInit()
handle = nv.nvmlDeviceGetHandleByIndex(0)
def read():
    [tx, rx, raw] = nv.nvmlDeviceGetFieldValues(handle, [(138, 0), (139, 5), (140, ALL)])
    assert tx.nvmlReturn == rx.nvmlReturn == raw.nvmlReturn == 0
    return tx.value.ullVal, rx.value.ullVal, raw.value.ullVal
ALL = 0xFFFFFFFF
want_kib, max_reads = int(sys.argv[1]), int(sys.argv[2])
start = time.monotonic()
first = read()
reads = 1
last = first
# read until the counter has moved by want_kib (bounded in reads and time)
while last[0] - first[0] < want_kib and reads < max_reads and time.monotonic() - start < 20:
    last = read()
    reads += 1
elapsed = time.monotonic() - start
print(json.dumps({"first": first, "last": last, "elapsed": elapsed, "reads": reads}))
"""


def traffic(native: Path, config: Path, want_kib: int, max_reads: int) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", TRAFFIC_SCRIPT, str(want_kib), str(max_reads)],
        env=nvml_env(native, config), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_throughput_counters_grow_with_utilization(native: Path, tmp_path: Path):
    state = state_with("h100", tmp_path, ["util", "--gpu", "0", "--gpu-pct", "50"])
    got = traffic(native, write_config(tmp_path, state), want_kib=1024, max_reads=10**9)
    first_tx = got["first"][0]
    last_tx, last_rx, last_raw = got["last"]
    assert last_tx - first_tx >= 1024, got
    # never faster than half of one link's bandwidth over the time measured
    kib_per_second = 26562e6 / 1024 * 0.5
    assert last_tx - first_tx <= kib_per_second * got["elapsed"] + 1, got
    # every link carries the same traffic; RX was read after TX within one call
    assert last_rx >= last_tx
    assert last_rx - last_tx <= kib_per_second * got["elapsed"] + 1
    # the aggregate is all 18 links, raw adds the flit headers
    assert last_raw >= 18 * last_tx + 18 * last_tx // 16 - 18


def test_throughput_counters_stand_still_on_an_idle_board(native: Path, tmp_path: Path):
    state = state_with("h100", tmp_path, ["util", "--gpu", "0", "--gpu-pct", "0"])
    got = traffic(native, write_config(tmp_path, state), want_kib=1, max_reads=200)
    assert got["reads"] == 200
    assert got["first"] == got["last"]


@pytest.mark.parametrize("percent", [0, 50])
def test_nvidia_smi_throughput_follows_utilization(
    native: Path, smi: Path, tmp_path: Path, percent: int
):
    state = state_with("h100", tmp_path, ["util", "--gpu", "0", "--gpu-pct", str(percent)])
    out = smi_out(smi, native, write_config(tmp_path, state), "nvlink", "-gt", "d", "-i", "0")
    [lines] = gpu_sections(out)
    pattern = re.compile(r"Link (\d+): Data (Tx|Rx): (\d+) KiB")
    parsed = [pattern.fullmatch(line) for line in lines]
    assert all(parsed), lines
    assert [(int(m[1]), m[2]) for m in parsed if m] == [
        (link, direction) for link in range(18) for direction in ("Tx", "Rx")
    ]
    values = [int(m[3]) for m in parsed if m]
    if percent == 0:
        assert set(values) == {0}
    else:
        # read one after the other: the counters only climb
        assert values[0] > 0
        assert values == sorted(values)
