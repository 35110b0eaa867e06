"""End to end on a GB200 node: the real daemon as a subprocess reaches ready, a
real ``mokka ctl fail ... --xid 79`` reaches the kernel log exactly once and the
engine config, and SIGTERM leaves the node root as it was.

Real clock throughout: the daemon is a separate process, so every wait is a
bounded poll under ``trio.fail_after``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
import yaml

from mokka import layout, native
from mokka.errors import NativeArtifactMissing
from tests.support import ROOT, real_nvidia_smi, snapshot

TOPOLOGY = """\
version: 1
domains:
  - name: e2e-domain
    uuid: 00000000-0000-0000-0000-0000000000ab
    cliques:
      - id: 0
        nodes: [node-a, node-b]
"""
KMSG = layout.KMSG.lstrip("/")
ENGINE_CONFIG = layout.ENGINE_CONFIG.lstrip("/")
#: Polling period while waiting on the daemon process (real clock).
POLL = 0.1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def require_native() -> None:
    try:
        native.artifact(native.NVML_LIBRARY)
        native.artifact(native.MOCKFS_LIBRARY)
    except NativeArtifactMissing as exc:
        pytest.fail(f"{exc}; build it with: .venv/bin/python native/build.py {ROOT}/mokka/_native")


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


async def wait_ready(client: httpx.AsyncClient, url: str, proc: trio.Process, log: Path) -> dict:
    while True:
        if proc.returncode is not None:
            pytest.fail(f"daemon exited with {proc.returncode}:\n{tail(log)}")
        try:
            response = await client.get(url)
        except httpx.TransportError:
            response = None
        if response is not None and response.status_code == 200:
            return response.json()
        await trio.sleep(POLL)


async def wait_for(predicate) -> None:
    # Polling is the only way to watch another process's files here.
    while not predicate():  # noqa: ASYNC110
        await trio.sleep(POLL)


def tail(log: Path) -> str:
    return log.read_text()[-4000:]


def xid_lines(kmsg: Path) -> list[str]:
    return [line for line in kmsg.read_text().splitlines() if "Xid" in line]


def engine_config(root: Path) -> dict:
    path = root / ENGINE_CONFIG
    return yaml.safe_load(path.read_text()) if path.is_file() else {}


async def test_gb200_daemon_xid_via_ctl_and_clean_teardown(tmp_path: Path) -> None:
    require_native()
    smi = real_nvidia_smi()
    root = tmp_path / "node"
    (root / "dev").mkdir(parents=True)
    kmsg = root / KMSG
    kmsg.write_bytes(b"")  # the node's kernel log; the daemon never creates it
    topology = tmp_path / "topology.yaml"
    topology.write_text(TOPOLOGY)
    before = snapshot(root)
    port = free_port()
    log = tmp_path / "daemon.log"

    argv = [
        sys.executable, "-m", "mokka", "daemon", "--root", str(root), "--profile", "gb200",
        "--topology", str(topology), "--node-name", "node-a",
        "--health-addr", f"127.0.0.1:{port}", "--nvidia-smi-binary", str(smi),
    ]
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        proc = await trio.lowlevel.open_process(
            argv, stdout=log_fd, stderr=subprocess.STDOUT, cwd=ROOT, env=subprocess_env()
        )
    finally:
        os.close(log_fd)
    readyz = f"http://127.0.0.1:{port}/readyz"
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            with trio.fail_after(120):
                ready = await wait_ready(client, readyz, proc, log)
            sims = ready["simulators"]
            assert sims["imex"]["ready"]
            assert "2048 channels" in sims["imex"]["reason"]
            assert sims["kernellog"]["ready"]
            channel = root / "var/lib/nvml-mock/driver/dev/nvidia-caps-imex-channels/channel2047"
            assert channel.is_char_device()
            assert xid_lines(kmsg) == []
            assert engine_config(root)["device.1.failure.mode"] == "healthy"
            assert engine_config(root)["xid_count"] == 0

            ctl = await trio.run_process(
                [sys.executable, "-m", "mokka", "ctl", "fail", "--root", str(root), "--gpu", "1",
                 "--mode", "fallen_off_bus", "--xid", "79"],
                capture_stdout=True, capture_stderr=True, check=False, cwd=ROOT,
                env=subprocess_env(),
            )
            assert ctl.returncode == 0, ctl.stderr.decode()

            with trio.fail_after(60):
                await wait_for(
                    lambda: engine_config(root).get("device.1.failure.mode") == "fallen_off_bus")
                await wait_for(lambda: xid_lines(kmsg))
                # Another pass over the new state (ready again) before counting.
                await wait_ready(client, readyz, proc, log)
        config = engine_config(root)
        assert config["device.1.failure.mode"] == "fallen_off_bus"
        assert config["device.1.failure.xid.code"] == 79
        assert (config["xid_count"], config["xid.0.gpu"], config["xid.0.code"]) == (1, 1, 79)
        gpu_bus = "PCI:0009:01:00"  # GPU 1 of the gb200 profile (bus id 0009:01:00.0)
        assert xid_lines(kmsg) == [
            f"NVRM: NVRM: Xid ({gpu_bus}): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus."
        ]
        assert kmsg.read_text().splitlines()[0].startswith(f"NVRM: NVRM: GPU at {gpu_bus}: GPU-")

        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(60):
            code = await proc.wait()
        assert code == 0, tail(log)
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.move_on_after(10, shield=True):
                await proc.wait()

    after = snapshot(root)
    assert len(xid_lines(kmsg)) == 1
    # Everything the daemon wrote is gone, and what was there is unchanged
    # (the kernel log's content is the log itself).
    # ``mokka ctl``'s overrides file is runtime state of this pod: teardown
    # drops it too, so nothing at all is left behind.
    assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in before.items()}
