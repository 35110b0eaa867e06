"""A running node's idle readings (docs/nvml.md, "Idle readings"): on by default, each
GPU at its own place in the board's idle range; ``--idle-signature off`` gives every
GPU exactly the profile's figures.

A real daemon stages the h100 profile with NVIDIA's real nvidia-smi 535, which reads
the node's own library and engine config.  nvidia-smi runs at one pinned instant
(``MOCK_NVML_CLOCK_OVERRIDE``), so what it reads does not depend on when the test runs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import trio

from mokka import layout
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state.compile import compile_profile
from tests.daemon_support import PROCESS_TIMEOUT, running_daemon, stop_daemon
from tests.support import real_nvidia_smi, snapshot

NODE = "idle-node"
#: 2026-12-01T00:00:00Z, the instant nvidia-smi reads at.
INSTANT = "1795996800"
#: The H100's idle range around the profile's figures (native/nvml/idle_signature.c,
#: IDLE_RANGES and IDLE_POWER_JITTER): temperature half-width in C, draw half-width
#: as a share of the profile's draw; PCIe TX and RX in KB/s.
HALF_C, POWER_SHARE, PCIE_KBPS = 3, 0.06 + 0.015, (100, 1500)


def profile_figures() -> tuple[int, float, int, int]:
    """The h100 profile's idle temperature (C), draw (W) and PCIe TX and RX (KB/s)."""
    fields = compile_profile("h100", node_name=NODE).gpus[0].fields
    return (fields["thermal"]["temperature_gpu_c"], fields["power"]["current_draw_mw"] / 1000,
            fields["pcie"]["tx_throughput_kbps"], fields["pcie"]["rx_throughput_kbps"])


def smi(root: Path, *args: str) -> str:
    """The node's staged nvidia-smi, against the library beside it, at ``INSTANT``."""
    driver = root / layout.DRIVER_ROOT.lstrip("/")
    env = {**os.environ, "LD_LIBRARY_PATH": str(driver / "usr/lib64"),
           "MOCK_NVML_CLOCK_OVERRIDE": INSTANT}
    done = subprocess.run([str(driver / "usr/bin/nvidia-smi"), *args], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, f"nvidia-smi {args} exited {done.returncode}:\n{done.stdout}"
    return done.stdout


def readings(root: Path) -> tuple[list[tuple[int, float]], tuple[int, int]]:
    """Every GPU's (temperature C, draw W), and GPU 0's PCIe (TX, RX) in KB/s."""
    table = smi(root, "--query-gpu=temperature.gpu,power.draw", "--format=csv,noheader,nounits")
    gpus = [(int(t), float(w)) for t, w in (line.split(", ") for line in table.splitlines())]
    report = smi(root, "-q", "-i", "0")
    tx, rx = (int(re.search(rf"{way} Throughput\s+: (\d+) KB/s", report).group(1))
              for way in ("Tx", "Rx"))
    return gpus, (tx, rx)


async def node_readings(tmp_path: Path, *flags: str) -> tuple[list[tuple[int, float]],
                                                                tuple[int, int]]:
    """The readings of a running h100 node started with ``flags``; the node is torn
    down afterwards and its root left as it was found."""
    root = tmp_path / "node"
    root.mkdir()
    before = snapshot(root)
    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon("--root", str(root), "--profile", "h100", "--health-addr",
                                  "127.0.0.1:0", "--nvidia-smi-binary", str(real_nvidia_smi()),
                                  *flags, cwd=tmp_path, node_name=NODE) as daemon:
            await daemon.wait_for_line(r"reconcile pass ok generation=1")
            seen = await trio.to_thread.run_sync(readings, root)
            code = await stop_daemon(daemon, signal.SIGTERM)
    assert code == 0, "\n".join(daemon.lines)
    assert snapshot(root) == before
    return seen


@pytest.mark.timeout(90)
async def test_by_default_each_gpu_idles_at_its_own_readings(tmp_path: Path) -> None:
    temperature, draw, _, _ = profile_figures()
    gpus, (tx, rx) = await node_readings(tmp_path)
    assert len(gpus) == 8, gpus
    (t0, w0), (t1, w1) = gpus[:2]
    assert t0 != t1, gpus
    assert w0 != w1, gpus
    # not one GPU's figures repeated: a real node's eight spread
    assert len({t for t, _ in gpus}) >= 3, gpus
    assert len({w for _, w in gpus}) == 8, gpus
    for t, w in gpus:
        assert abs(t - temperature) <= HALF_C, gpus
        assert abs(w - draw) <= POWER_SHARE * draw, gpus
    low, high = PCIE_KBPS
    assert low <= tx <= high, tx
    assert low <= rx <= high, rx


@pytest.mark.timeout(90)
async def test_with_the_signature_off_every_gpu_reads_the_profiles_figures(
    tmp_path: Path,
) -> None:
    temperature, draw, tx, rx = profile_figures()
    gpus, pcie = await node_readings(tmp_path, "--idle-signature", "off")
    assert gpus == [(temperature, draw)] * 8
    assert pcie == (tx, rx)


def test_the_renderer_writes_the_node_level_line_only_when_asked() -> None:
    state = compile_profile("h100", node_name=NODE)
    plain = render_engine_config(state)
    signed = render_engine_config(state, idle_signature=True)
    assert "idle_signature" not in plain
    assert signed.count("\nidle_signature: true\n") == 1
    # a node-level key: before the GPUs' blocks, and nothing else changes
    assert signed.index("idle_signature") < signed.index("device.0.")
    assert signed.replace("idle_signature: true\n", "") == plain
