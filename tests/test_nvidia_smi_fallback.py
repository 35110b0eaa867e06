"""The fallback nvidia-smi: same wording and layout as the real 535 for what it supports.

Both binaries run against the same mock library and engine config and their
outputs are compared line by line (timestamps and the tool's own version
aside).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import attrs
import pytest

from mokka import layout
from mokka.state.compile import compile_profile
from mokka.state.model import Failure, State
from tests.nvml_support import node_path, run_smi, write_config
from tests.support import require_tool

pytestmark = pytest.mark.realclient

FIELDS = (
    "index,name,uuid,serial,pci.bus_id,pci.domain,pci.bus,pci.device,pci.device_id,"
    "pci.sub_device_id,driver_version,count,vbios_version,inforom.img,persistence_mode,"
    "display_mode,display_active,pstate,memory.total,memory.reserved,memory.used,memory.free,"
    "compute_mode,compute_cap,utilization.gpu,utilization.memory,ecc.mode.current,"
    "ecc.mode.pending,temperature.gpu,temperature.memory,power.draw,power.limit,"
    "power.default_limit,power.min_limit,power.max_limit,clocks.gr,clocks.sm,clocks.mem,"
    "clocks.video,clocks.max.gr,clocks.max.sm,clocks.max.mem,mig.mode.current,"
    "mig.mode.pending,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,"
    "pcie.link.width.max,fan.speed,gpu_name,gpu_uuid,gpu_bus_id"
)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path, compile_profile("h100", node_name="worker-1"))


def both(native: Path, smi: Path, config: Path, *args: str):
    real = run_smi(smi, native, config, *args)
    return real, run_smi(native / "nvidia-smi", native, config, *args)


def test_list_gpus_is_identical(native: Path, smi: Path, config: Path):
    real, ours = both(native, smi, config, "-L")
    assert ours.returncode == real.returncode == 0
    assert ours.stdout == real.stdout
    assert len(ours.stdout.splitlines()) == 8


@pytest.mark.parametrize("profile", ["h100", "gb200", "t4"])
@pytest.mark.parametrize("fmt", ["csv", "csv,noheader", "csv,nounits", "csv,noheader,nounits"])
def test_query_gpu_is_identical(native: Path, smi: Path, tmp_path: Path, profile: str, fmt: str):
    config = write_config(tmp_path, compile_profile(profile, node_name="worker-1"))
    real, ours = both(native, smi, config, f"--query-gpu={FIELDS}", f"--format={fmt}")
    assert ours.returncode == real.returncode == 0
    assert ours.stdout == real.stdout
    assert "[N/A]" in ours.stdout  # fan.speed: data center boards have none


def test_query_gpu_selects_with_id(native: Path, smi: Path, config: Path):
    real, ours = both(native, smi, config, "--query-gpu=index,uuid", "--format=csv", "-i", "0,3")
    assert ours.stdout == real.stdout
    assert [line.split(",")[0] for line in ours.stdout.splitlines()[1:]] == ["0", "3"]


def test_summary_table_has_the_real_layout(native: Path, smi: Path, tmp_path: Path):
    """On a node claiming a 535 driver the table is 535's, banner included
    (tests/test_fallback_smi_layout.py covers every profile and the wide layout)."""
    config = write_config(tmp_path, claiming_535(compile_profile("h100", node_name="worker-1")))
    real, ours = both(native, smi, config)
    assert ours.returncode == real.returncode == 0
    real_lines, our_lines = real.stdout.splitlines(), ours.stdout.splitlines()
    assert our_lines[1:] == real_lines[1:]  # line 0 is the clock
    assert "Driver Version: 535.309.01" in our_lines[2]


@pytest.mark.parametrize(
    "args",
    [
        ("--bogus",),
        ("--query-gpu=name",),
        ("--query-gpu=bogus", "--format=csv"),
        ("-L", "-i", "0"),
        ("--query-gpu=index", "--format=csv", "-i", "9,bogus"),
        ("-q", "-i", "9"),
        ("--query-gpu=index", "--format=bogus,csv"),
        ("--query-gpu=index", "--format=noheader"),
        ("--query-gpu=index", "--format="),
    ],
)
def test_errors_match_the_real_tool(native: Path, smi: Path, config: Path, args: tuple[str, ...]):
    real, ours = both(native, smi, config, *args)
    assert real.returncode != 0
    assert (ours.returncode, ours.stdout) == (real.returncode, real.stdout)


def test_long_report_basic_sections(native: Path, smi: Path, config: Path):
    real, ours = both(native, smi, config, "-q")
    assert ours.returncode == 0
    real_lines = set(real.stdout.splitlines())
    # Every line the fallback prints, except the timestamp, is a line of the real report.
    ours_lines = [line for line in ours.stdout.splitlines() if not line.startswith("Timestamp")]
    extra = [line for line in ours_lines if line and line not in real_lines]
    assert extra == []
    for section in ("FB Memory Usage", "GPU Power Readings", "Max Clocks", "Fabric", "PCI"):
        assert f"    {section}" in ours_lines


def test_version(native: Path, config: Path):
    result = run_smi(native / "nvidia-smi", native, config, "--version")
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        "NVIDIA-SMI version  : 580.105.08",
        "NVML version        : 580.105.08",
        "DRIVER version      : 580.105.08",
        "CUDA Version        : 13.0",
    ]


def test_runs_from_the_driver_root_without_environment(native: Path, tmp_path: Path):
    """RPATH $ORIGIN/../lib64 finds the library in a driver tree ($ORIGIN in the
    wheel, where the two sit side by side); the library finds its config."""
    readelf = require_tool("readelf")
    dynamic = subprocess.run(
        [readelf, "-d", str(native / "nvidia-smi")], capture_output=True, text=True, check=True
    ).stdout
    assert "[$ORIGIN/../lib64:$ORIGIN]" in dynamic
    state = compile_profile("t4", node_name="worker-1")
    write_config(tmp_path, state)
    root = node_path(tmp_path, layout.DRIVER_ROOT)
    (root / "usr" / "lib64").mkdir(parents=True)
    (root / "usr" / "bin").mkdir(parents=True)
    shutil.copy2(native / "libnvidia-ml.so.1", root / "usr" / "lib64")
    shutil.copy2(native / "nvidia-smi", root / "usr" / "bin")
    env = {k: v for k, v in os.environ.items() if k not in ("MOCK_NVML_CONFIG", "LD_LIBRARY_PATH")}
    result = subprocess.run(
        [str(root / "usr" / "bin" / "nvidia-smi"), "-L"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout == f"GPU 0: Tesla T4 (UUID: {state.gpus[0].uuid})\n", result.stderr


def test_missing_config_says_the_driver_is_missing(native: Path, smi: Path, tmp_path: Path):
    real, ours = both(native, smi, tmp_path / "absent.yaml", "-L")
    assert (ours.returncode, ours.stdout) == (real.returncode, real.stdout) == (
        9,
        real.stdout,
    )


def claiming_535(state: State) -> State:
    """``state`` on a node claiming driver 535, whose table the real 535 prints."""
    system = attrs.evolve(state.system, driver_version="535.309.01",
                          nvml_version="12.535.309.01")
    return attrs.evolve(state, system=system)


def failing(profile: str, mode: str, *indices: int) -> State:
    """``profile`` claiming driver 535 with ``mode`` on the GPUs at ``indices``."""
    state = claiming_535(compile_profile(profile, node_name="worker-1"))
    gpus = tuple(
        attrs.evolve(g, failure=Failure(mode=mode)) if g.index in indices else g
        for g in state.gpus
    )
    return attrs.evolve(state, gpus=gpus)


@pytest.mark.parametrize("mode", ["lost", "fallen_off_bus"])
def test_a_lost_gpu_prints_as_the_real_tool_prints_it(
    native: Path, smi: Path, tmp_path: Path, mode: str
):
    config = write_config(tmp_path, failing("h100", mode, 1, 6))
    real, ours = both(native, smi, config)
    assert ours.returncode == real.returncode == 0
    real_lines, our_lines = real.stdout.splitlines(), ours.stdout.splitlines()
    assert len(our_lines) == len(real_lines)
    for number, (a, b) in enumerate(zip(real_lines, our_lines, strict=True)):
        if number not in (0, 2):
            assert a == b, number
    assert any("ERR!" in line for line in our_lines)
    assert sum("| GPU is lost          |" in line for line in our_lines) == 2

    real, ours = both(native, smi, config, f"--query-gpu={FIELDS}", "--format=csv")
    assert (ours.returncode, ours.stdout) == (real.returncode, real.stdout)
    assert ours.stdout.count("[GPU is lost]") > 2 * 20

    real, ours = both(native, smi, config, "-q", "-i", "1")
    real_lines = set(real.stdout.splitlines())
    extra = [
        line for line in ours.stdout.splitlines()
        if line and not line.startswith("Timestamp") and line not in real_lines
    ]
    assert extra == []
    assert "    Performance State                     : GPU is lost" in ours.stdout.splitlines()


def test_ecc_storm_prints_the_same_table(native: Path, smi: Path, tmp_path: Path):
    """An injected uncorrectable error reads alike in both tools, and so
    does the layout."""
    config = write_config(tmp_path, failing("h100", "ecc_uncorrectable", 1))
    real, ours = both(native, smi, config)
    strip = re.compile(r"\|\s+\d+ \|$")
    for number, (a, b) in enumerate(
        zip(real.stdout.splitlines(), ours.stdout.splitlines(), strict=True)
    ):
        if number not in (0, 2):
            assert strip.sub("| ECC |", a) == strip.sub("| ECC |", b), number


def test_no_field_or_argument_length_limit(native: Path, smi: Path, config: Path):
    """More than 128 fields in an argument of several kilobytes, as the real
    tool takes them, and a long -i list."""
    fields = ",".join([FIELDS] * 5)
    assert len(fields.split(",")) > 128
    assert len(fields) > 1024
    ids = ",".join(["0", "1"] * 300)
    assert len(ids) > 1024
    real, ours = both(native, smi, config, f"--query-gpu={fields}", "--format=csv", "-i", ids)
    assert ours.returncode == real.returncode == 0
    assert ours.stdout == real.stdout


def test_fields_the_real_tool_refuses_are_refused(native: Path, smi: Path, config: Path):
    real, ours = both(native, smi, config, "--query-gpu=clocks.max.video", "--format=csv")
    assert real.returncode != 0
    assert (ours.returncode, ours.stdout) == (real.returncode, real.stdout)


def test_id_list_selects_each_gpu_once_in_nvml_order(native: Path, smi: Path, config: Path):
    real, ours = both(native, smi, config, "--query-gpu=index", "--format=csv,noheader",
                      "-i", "5,1,bogus,1,9,3")
    assert (ours.returncode, ours.stdout) == (real.returncode, real.stdout) == (0, "1\n3\n5\n")
