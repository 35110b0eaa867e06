"""The NVML setters change the node: the real nvidia-smi 535 and nvidia-ml-py
against a real daemon, each change seen by another process.

One daemon (h100 profile, the real nvidia-smi staged) serves the whole
module's checks in one test, in order, as a person configuring a node would
type them; the daemon is stopped at the end and the root must be empty.
``nvidia-smi -r`` stats ``/dev/nvidia<minor>`` before it resets, so every
nvidia-smi here runs in a private mount namespace where the driver root's
``dev`` is ``/dev``, as in a container given the GPU.  Non-root callers are
``setpriv --reuid=nobody``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import yaml

from mokka import layout
from mokka.simulators.gpudriver import nvml_socket
from tests.daemon_support import run_mokka, running_daemon, stop_daemon
from tests.nvml_support import library_without_config
from tests.support import real_nvidia_smi, require_tool

#: Every nvidia-smi call's bound (one answers in well under a second).
SMI_TIMEOUT = 60
#: How many processes race to set the power limit.
RACERS = 8

RACE_SCRIPT = """
import sys, pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
pynvml.nvmlDeviceSetPowerManagementLimit(handle, int(sys.argv[1]))
print(pynvml.nvmlDeviceGetHandleByIndex(0) is not None)
"""

NVML_SCRIPT = """
import json, sys, pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
out = {}
try:
    pynvml.nvmlDeviceSetPowerManagementLimit(handle, 10 ** 9)
except pynvml.NVMLError as exc:
    out["huge"] = exc.value
try:
    pynvml.nvmlDeviceSetComputeMode(handle, 2)
    # the caller's own next query sees its change at once
    out["compute"] = pynvml.nvmlDeviceGetComputeMode(handle)
except pynvml.NVMLError as exc:
    out["compute"] = -exc.value
print(json.dumps(out))
"""


class Node:
    """The staged node: nvidia-smi and Python run as the driver root's clients."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.driver = root / layout.DRIVER_ROOT.lstrip("/")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MOCK_NVML")}
        self.env["LD_LIBRARY_PATH"] = str(self.driver / "usr/lib64")

    def _argv(self, command: str, user: str | None) -> list[str]:
        prefix = "" if user is None else (
            f"{require_tool('setpriv')} --reuid={user} --regid=nogroup --clear-groups ")
        script = (f"mount --bind {shlex.quote(str(self.driver / 'dev'))} /dev && "
                  f"exec {prefix}{command}")
        return [require_tool("unshare"), "--mount", "--propagation", "private", "sh", "-c",
                script]

    def smi(self, *args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
        command = shlex.join([str(self.driver / "usr/bin/nvidia-smi"), *args])
        return subprocess.run(self._argv(command, user), capture_output=True, text=True,
                              env=self.env, timeout=SMI_TIMEOUT, check=False)

    def query(self, what: str) -> str:
        """``nvidia-smi -q -i 0 -d WHAT`` of a fresh process."""
        result = self.smi("-q", "-i", "0", "-d", what)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def python(self, script: str, *args: str) -> subprocess.Popen[str]:
        command = shlex.join([sys.executable, "-c", script, *args])
        return subprocess.Popen(self._argv(command, None), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env)


def field(text: str, label: str, after: str | None = None) -> str:
    """The value of ``label :`` in nvidia-smi's ``-q`` text (the first after ``after``)."""
    if after is not None:
        text = text[text.index(after):]
    match = re.search(rf"^\s*{re.escape(label)}\s*:\s*(.+?)\s*$", text, re.M)
    assert match, f"no {label!r} in:\n{text}"
    return match[1]


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def run_sync(fn, *args):
    return trio.to_thread.run_sync(lambda: fn(*args))


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may search (pytest's ``tmp_path`` is root's alone): a
    caller that is not root must reach the staged library to be refused by it."""
    path = Path(tempfile.mkdtemp(prefix="mokka-setters-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.mark.timeout(280)
async def test_setters_change_the_node_for_every_process(tmp_path: Path, open_dir: Path) -> None:
    node_root = open_dir / "node"
    node_root.mkdir()
    node = Node(node_root)
    with trio.fail_after(260):
        async with running_daemon(
            "--root", str(node_root), "--profile", "h100", "--health-addr", "127.0.0.1:0",
            "--nvidia-smi-binary", str(real_nvidia_smi()), cwd=tmp_path,
        ) as daemon:
            await daemon.wait_for_line(r"reconcile pass ok generation=1")
            await daemon.wait_for_line(r"engine config served at")
            await run_sync(_check_setters, node)
            await run_sync(_check_non_root, node)
            await run_sync(_check_nvml_py_and_races, node)
            await run_sync(_check_busy_reset, node, tmp_path)
            await run_sync(_check_from_a_container, node, tmp_path)
            assert await stop_daemon(daemon, 15) == 0
    # Teardown forgot every change, and took every file with it.
    assert list(node_root.iterdir()) == []


def _check_setters(node: Node) -> None:
    # persistence mode (the profile's is Enabled)
    assert field(ok(node.smi("-q", "-i", "0")), "Persistence Mode") == "Enabled"
    ok(node.smi("-pm", "0", "-i", "0"))
    assert field(node.smi("-q", "-i", "0").stdout, "Persistence Mode") == "Disabled"

    # power limit: within the board's constraints, refused outside them
    power = node.query("POWER")
    low = float(field(power, "Min Power Limit").split()[0])
    high = float(field(power, "Max Power Limit").split()[0])
    assert field(power, "Current Power Limit") != f"{low:.2f} W"
    ok(node.smi("-pl", f"{low:.0f}", "-i", "0"))
    assert field(node.query("POWER"), "Current Power Limit") == f"{low:.2f} W"
    refused = node.smi("-pl", f"{high + 1000:.0f}", "-i", "0")
    assert refused.returncode != 0
    assert "not a valid power limit" in refused.stdout
    assert field(node.query("POWER"), "Current Power Limit") == f"{low:.2f} W"
    # another GPU kept its own
    assert field(node.smi("-q", "-i", "1", "-d", "POWER").stdout,
                 "Current Power Limit") == f"{high:.2f} W"

    # compute mode
    ok(node.smi("-c", "3", "-i", "0"))
    assert field(node.query("COMPUTE"), "Compute Mode") == "Exclusive_Process"

    # applications clocks and their reset
    clocks = node.query("CLOCK")
    default_gfx = field(clocks, "Graphics", after="Default Applications Clocks")
    default_mem = field(clocks, "Memory", after="Default Applications Clocks")
    mem = default_mem.split()[0]
    ok(node.smi("-ac", f"{mem},1000", "-i", "0"))
    assert field(node.query("CLOCK"), "Graphics", after="\n    Applications Clocks") == "1000 MHz"
    ok(node.smi("-rac", "-i", "0"))
    assert field(node.query("CLOCK"), "Graphics",
                 after="\n    Applications Clocks") == default_gfx

    # locked clocks: set and reset (nvidia-smi 535's -q shows none; the engine config does)
    config = node.driver / "config/config.yaml"
    ok(node.smi("-lgc", "300,1500", "-i", "0"))
    assert "device.0.clocks.locked_graphics_max: 1500" in config.read_text()
    ok(node.smi("-rgc", "-i", "0"))
    assert "device.0.clocks.locked_graphics_max: 0" in config.read_text()

    # ECC mode: pending until the reset, which applies it
    ok(node.smi("-e", "0", "-i", "0"))
    ecc = node.query("ECC")
    assert field(ecc, "Current", after="ECC Mode") == "Enabled"
    assert field(ecc, "Pending", after="ECC Mode") == "Disabled"
    reset = ok(node.smi("-r", "-i", "0"))
    assert "was successfully reset" in reset
    ecc = node.query("ECC")
    assert field(ecc, "Current", after="ECC Mode") == "Disabled"

    # the changes are node state: in the overrides file, under the GPU's UUID
    doc = yaml.safe_load((node.root / layout.OVERRIDES.lstrip("/")).read_text())
    (patch,) = doc["devices"].values()
    assert patch["persistence_mode"] == "disabled"
    assert patch["compute_mode"] == "exclusive_process"


def _check_non_root(node: Node) -> None:
    before = (node.driver / "config/config.yaml").read_text()
    for args in (["-pm", "1"], ["-pl", "400"], ["-c", "0"], ["-ac", "2619,1000"], ["-rac"],
                 ["-lgc", "300,1500"], ["-rgc"], ["-e", "1"], ["-r"]):
        result = node.smi(*args, "-i", "0", user="nobody")
        assert result.returncode != 0, (args, result.stdout)
        # nvidia-smi's words for NVML_ERROR_NO_PERMISSION (its clock commands have their own)
        assert re.search(r"Insufficient Permissions|user does not have permission",
                         result.stdout + result.stderr), (args, result.stdout)
    assert (node.driver / "config/config.yaml").read_text() == before


def _check_nvml_py_and_races(node: Node) -> None:
    probe = node.python(NVML_SCRIPT)
    out, err = probe.communicate(timeout=SMI_TIMEOUT)
    assert probe.returncode == 0, err
    assert out.strip() == '{"huge": 2, "compute": 2}'
    assert field(node.query("COMPUTE"), "Compute Mode") == "Prohibited"

    power = node.query("POWER")
    low = int(float(field(power, "Min Power Limit").split()[0]))
    values = [(low + 10 * i) * 1000 for i in range(1, RACERS + 1)]
    racers = [node.python(RACE_SCRIPT, str(v)) for v in values]
    for racer in racers:
        out, err = racer.communicate(timeout=SMI_TIMEOUT)
        assert racer.returncode == 0, err
    current = field(node.query("POWER"), "Current Power Limit")
    assert current in {f"{v / 1000:.2f} W" for v in values}, current
    doc = yaml.safe_load((node.root / layout.OVERRIDES.lstrip("/")).read_text())
    (patch,) = doc["devices"].values()
    assert f"{patch['power']['enforced_limit_mw'] / 1000:.2f} W" == current


def _check_busy_reset(node: Node, cwd: Path) -> None:
    """A process on the GPU (listed through ``mokka ctl``) refuses the reset: IN_USE."""
    ok(node.smi("-e", "0", "-i", "1"))
    ctl = run_mokka("ctl", "--root", str(node.root), "set", "--gpu", "1",
                    "processes=[{pid: 4242, type: compute, used_memory_bytes: 1048576}]", cwd=cwd)
    assert ctl.returncode == 0, ctl.stderr
    deadline = time.monotonic() + 20
    while "4242" not in ok(node.smi("-q", "-i", "1", "-d", "PIDS")):
        assert time.monotonic() < deadline, "the process never showed on GPU 1"
    refused = node.smi("-r", "-i", "1")
    assert refused.returncode == 19, refused.stdout  # NVML_ERROR_IN_USE
    assert "In use by another client" in refused.stdout
    # nothing of the reset happened: the pending mode is still pending
    ecc = ok(node.smi("-q", "-i", "1", "-d", "ECC"))
    assert field(ecc, "Current", after="ECC Mode") == "Enabled"
    assert field(ecc, "Pending", after="ECC Mode") == "Disabled"


CONTAINER_SCRIPT = """
import pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(2)
low, _ = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
pynvml.nvmlDeviceSetPowerManagementLimit(handle, low)
print(low)
"""


def _check_from_a_container(node: Node, scratch: Path) -> None:
    """A client with no config beside its library, the daemon's socket at
    ``/run/nvidia-persistenced/socket`` (what a container from the toolkit's own
    CDI spec has): its change is the node's too."""
    library = library_without_config(scratch / "container")
    socket_path = node.root / nvml_socket.SOCKET.lstrip("/")
    script = " && ".join([
        "mount -t tmpfs mokka-test /run", "mkdir -p /run/nvidia-persistenced",
        "touch /run/nvidia-persistenced/socket",
        f"mount --bind {shlex.quote(str(socket_path))} /run/nvidia-persistenced/socket",
        "exec " + shlex.join([sys.executable, "-c", CONTAINER_SCRIPT]),
    ])
    env = {k: v for k, v in node.env.items() if k != "LD_LIBRARY_PATH"}
    env["LD_LIBRARY_PATH"] = str(library.parent)
    result = subprocess.run(
        [require_tool("unshare"), "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True, text=True, env=env, timeout=SMI_TIMEOUT, check=False)
    assert result.returncode == 0, result.stderr
    low = int(result.stdout)
    power = ok(node.smi("-q", "-i", "2", "-d", "POWER"))
    assert field(power, "Current Power Limit") == f"{low / 1000:.2f} W"
    assert field(power, "Min Power Limit") != field(power, "Max Power Limit")
