"""The InfoROM black box's last flush (``nvmlDeviceGetLastBBXFlushTime``).

Real H100 and GB200 boards report one flush shortly after the driver loaded
(``inforom_bbx_flush`` in ``tests/data/nvidia-smi/qx-h100.xml``); A100 and B200
boards print N/A.  The mock times the flush from the node's boot time
(``btime`` of ``/proc/stat``) plus the profile's ``inforom.bbx_flush_after_boot_ms``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mokka.state.compile import compile_profile
from tests.nvml_support import nvml_env, write_config

pytestmark = pytest.mark.realclient

#: Reads the flush of every GPU with nvidia-ml-py in a child (NVML state is per process).
CHILD = """
import json, pynvml
pynvml.nvmlInit()
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(i)
    try:
        out.append(pynvml.nvmlDeviceGetLastBBXFlushTime(handle))
    except pynvml.NVMLError as e:
        out.append(e.value)
print(json.dumps(out))
"""

NOT_SUPPORTED, NOT_READY = 3, 27


def boot_time() -> int:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    raise AssertionError("/proc/stat has no btime line")


def flushes(native: Path, config: Path, **env: str) -> list:
    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=nvml_env(native, config, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("profile", ["h100", "gb200"])
def test_flush_is_timed_from_the_boot(native: Path, tmp_path: Path, profile: str):
    state = compile_profile(profile, node_name="worker-1")
    got = flushes(native, write_config(tmp_path, state))
    inforom = state.gpus[0].fields["inforom"]
    expected_us = (boot_time() * 1000 + inforom["bbx_flush_after_boot_ms"]) * 1000
    assert got == [[expected_us, inforom["bbx_flush_duration_us"]]] * len(state.gpus)


def test_not_ready_before_the_flush(native: Path, tmp_path: Path):
    state = compile_profile("h100", node_name="worker-1")
    config = write_config(tmp_path, state)
    # One second after the boot: the flush (two minutes after it) has not happened.
    early = flushes(native, config, MOCK_NVML_CLOCK_OVERRIDE=str(boot_time() + 1))
    assert early == [NOT_READY] * len(state.gpus)


@pytest.mark.parametrize("profile", ["a100", "b200"])
def test_boards_without_a_reported_flush(native: Path, tmp_path: Path, profile: str):
    state = compile_profile(profile, node_name="worker-1")
    assert "bbx_flush_after_boot_ms" not in state.gpus[0].fields["inforom"]
    got = flushes(native, write_config(tmp_path, state))
    assert got == [NOT_SUPPORTED] * len(state.gpus)


def test_real_nvidia_smi_prints_the_flush(native: Path, smi: Path, tmp_path: Path):
    state = compile_profile("h100", node_name="worker-1")
    config = write_config(tmp_path, state)
    result = subprocess.run(
        [str(smi), "-q", "-x"],
        env=nvml_env(native, config, TZ="UTC"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    inforom = state.gpus[0].fields["inforom"]
    at_ms = boot_time() * 1000 + inforom["bbx_flush_after_boot_ms"]
    when = datetime.fromtimestamp(at_ms // 1000, UTC).strftime("%Y/%m/%d %H:%M:%S")
    gpus = ET.fromstring(result.stdout).findall("gpu")
    assert len(gpus) == len(state.gpus)
    for gpu in gpus:
        assert gpu.findtext("inforom_bbx_flush/latest_timestamp") == f"{when}.{at_ms % 1000:03d}"
        assert gpu.findtext("inforom_bbx_flush/latest_duration") == (
            f"{inforom['bbx_flush_duration_us']} us"
        )
