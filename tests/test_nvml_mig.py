"""MIG on a simulated node: the boards' profile tables, the MIG mode setter
and the listing, through the real nvidia-smi 535 against a real daemon.

One daemon per board (h100: the mode applies at once on an idle GPU; a100:
it waits for ``nvidia-smi -r``, as the MIG user guide says of the A100),
each check in order as a person enabling MIG would type it.  The daemon
is stopped at the end and the root must be empty: teardown forgets the
mode, as a driver reload does.  nvidia-smi runs as in
``test_nvml_setters`` (a private mount namespace, ``setpriv`` for a caller
that is not root).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import trio
import yaml

from mokka import layout
from mokka.state import mig_profiles
from tests.daemon_support import run_mokka, running_daemon, stop_daemon
from tests.support import real_nvidia_smi
from tests.test_nvml_setters import RACERS, SMI_TIMEOUT, Node, field, ok, open_dir, run_sync

__all__ = ["open_dir"]  # the fixture, shared with the setters' test


def mig_mode(node: Node, gpu: int) -> tuple[str, str]:
    """``(current, pending)`` MIG mode of ``nvidia-smi -q`` in a fresh process."""
    text = ok(node.smi("-q", "-i", str(gpu)))
    return (field(text, "Current", after="MIG Mode"), field(text, "Pending", after="MIG Mode"))


async def _with_daemon(open_dir: Path, tmp_path: Path, profile: str, checks) -> None:
    node_root = open_dir / "node"
    node_root.mkdir()
    node = Node(node_root)
    with trio.fail_after(200):
        async with running_daemon(
            "--root", str(node_root), "--profile", profile, "--health-addr", "127.0.0.1:0",
            "--nvidia-smi-binary", str(real_nvidia_smi()), cwd=tmp_path,
        ) as daemon:
            await daemon.wait_for_line(r"reconcile pass ok generation=1")
            await daemon.wait_for_line(r"engine config served at")
            for check in checks:
                await run_sync(check, node, tmp_path)
            assert await stop_daemon(daemon, 15) == 0
    # Teardown forgot the mode, and took every file with it.
    assert list(node_root.iterdir()) == []


@pytest.mark.timeout(220)
async def test_h100_mig_mode_and_profiles(tmp_path: Path, open_dir: Path) -> None:
    await _with_daemon(open_dir, tmp_path, "h100",
                       [_check_h100_mode, _check_listing, _check_nvml_py, _check_instances,
                        _check_racing_mode_changes, _check_busy_gpu_stays_pending])


@pytest.mark.timeout(220)
async def test_a100_mig_mode_waits_for_reset(tmp_path: Path, open_dir: Path) -> None:
    await _with_daemon(open_dir, tmp_path, "a100",
                       [_check_a100_mode, _check_listing, _check_instances])


@pytest.mark.timeout(220)
async def test_t4_is_not_mig_capable(tmp_path: Path, open_dir: Path) -> None:
    await _with_daemon(open_dir, tmp_path, "t4", [_check_not_capable])


def _check_h100_mode(node: Node, _cwd: Path) -> None:
    assert mig_mode(node, 0) == ("Disabled", "Disabled")
    refused = node.smi("-mig", "1", "-i", "0", user="nobody")
    assert refused.returncode != 0
    assert "Insufficient Permissions" in refused.stdout + refused.stderr, refused.stdout
    assert mig_mode(node, 0) == ("Disabled", "Disabled")
    out = ok(node.smi("-mig", "1", "-i", "0"))
    assert "Enabled MIG Mode" in out, out
    # an idle H100 resets itself: in force at once, for every process
    assert mig_mode(node, 0) == ("Enabled", "Enabled")
    assert mig_mode(node, 1) == ("Disabled", "Disabled")
    # no GPU instance yet: -L lists the GPUs and no MIG device, as a real board does
    listing = ok(node.smi("-L"))
    assert len(re.findall(r"^GPU \d+: ", listing, re.M)) == 8, listing
    assert "MIG" not in listing, listing


#: ``nvidia-smi mig -lgip`` on an A100-SXM4-40GB, as the MIG user guide
#: prints it ("List GPU Instance Profiles"): name, id, instances, GiB.
A100_40GB_LGIP = [
    ("1g.5gb", 19, 7, "4.75"), ("1g.5gb+me", 20, 1, "4.75"), ("1g.10gb", 15, 4, "9.62"),
    ("2g.10gb", 14, 3, "9.62"), ("3g.20gb", 9, 2, "19.62"), ("4g.20gb", 5, 1, "19.62"),
    ("7g.40gb", 0, 1, "39.50"),
]
#: ``nvidia-smi mig -lgipp`` on the same board, from the guide: id -> (starts, size).
A100_LGIPP = {19: ((0, 1, 2, 3, 4, 5, 6), 1), 20: ((0, 1, 2, 3, 4, 5, 6), 1),
              15: ((0, 2, 4, 6), 2), 14: ((0, 2, 4), 2), 9: ((0, 4), 4), 5: ((0,), 4),
              0: ((0,), 8)}

_LGIP_ROW = re.compile(r"^\|\s+0\s+MIG (\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+No\s+(\d+)",
                       re.M)
_LGIPP_ROW = re.compile(r"Profile ID\s+(\d+) Placements?\s*: \{([\d,]+)\}:(\d+)")


def _check_listing(node: Node, _cwd: Path) -> None:
    """``mig -lgip``/``-lgipp`` print the board's table, as NVIDIA publishes it."""
    name = field(ok(node.smi("-q", "-i", "0")), "Product Name")
    table = mig_profiles.board(name)
    assert table is not None, name
    rows = _LGIP_ROW.findall(ok(node.smi("mig", "-lgip", "-i", "0")))
    assert [(n, int(i), int(free), int(total), gib, int(sm))
            for n, i, free, total, gib, sm in rows] == [
        (p.name + ("+me" if p.media else ""), p.smi_id, p.instances, p.instances,
         f"{p.memory_mib / 1024:.2f}", p.multiprocessors) for p in table.profiles]
    placements = {int(i): (tuple(int(s) for s in starts.split(",")), int(size))
                  for i, starts, size in _LGIPP_ROW.findall(
                      ok(node.smi("mig", "-lgipp", "-i", "0")))}
    # every board here has the A100's placements (the guide's figures)
    assert placements == A100_LGIPP
    if name == "NVIDIA A100-SXM4-40GB":
        assert [(n, int(i), int(t), g) for n, i, _f, t, g, _sm in rows] == A100_40GB_LGIP


NVML_SCRIPT = """
import json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
def code(call):
    try:
        call()
        return 0
    except pynvml.NVMLError as exc:
        return exc.value
info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
print(json.dumps({
    "one_slice": [info.id, info.sliceCount, info.instanceCount, info.name],
    "bad_mode": code(lambda: pynvml.nvmlDeviceSetMigMode(h, 7)),
    "eight_slices": code(lambda: pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, 5)),
    "beyond": code(lambda: pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, 99)),
    "capacity": pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9),
    "no_profile_capacity": code(
        lambda: pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 7)),
    "enable_again": pynvml.nvmlDeviceSetMigMode(h, 1),
}))
"""


def _check_nvml_py(node: Node, _cwd: Path) -> None:
    """nvidia-ml-py: the table by NVML profile id, and hostile inputs' codes."""
    probe = node.python(NVML_SCRIPT)
    out, err = probe.communicate(timeout=SMI_TIMEOUT)
    assert probe.returncode == 0, err
    answers = json.loads(out)
    assert answers["one_slice"] == [19, 1, 7, "MIG 1g.10gb"]
    assert answers["bad_mode"] == 2  # NVML_ERROR_INVALID_ARGUMENT
    assert answers["eight_slices"] == 3  # NOT_SUPPORTED: no such profile on the board
    assert answers["beyond"] == 2
    assert answers["capacity"] == 2  # two 3g.40gb
    assert answers["no_profile_capacity"] == 2
    assert answers["enable_again"] == 0  # activation status: in force, nothing pending


RACE_SCRIPT = """
import sys, pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(2)
print(pynvml.nvmlDeviceSetMigMode(handle, int(sys.argv[1])))
"""


def _check_racing_mode_changes(node: Node, _cwd: Path) -> None:
    """Eight processes toggling one GPU's mode at once: each is answered, the
    node keeps one of their values and a readable state."""
    racers = [node.python(RACE_SCRIPT, str(i % 2)) for i in range(RACERS)]
    for racer in racers:
        out, err = racer.communicate(timeout=SMI_TIMEOUT)
        assert racer.returncode == 0, err
        # NVML_SUCCESS (an idle H100 applies it at once), or NVML_ERROR_IN_USE when
        # another racer's mode was in force by the time it read the mode back
        assert out.strip() in ("0", "19"), out
    current, pending = mig_mode(node, 2)
    assert current == pending
    assert current in ("Enabled", "Disabled")
    doc = yaml.safe_load((node.root / layout.OVERRIDES.lstrip("/")).read_text())
    uuid = field(ok(node.smi("-q", "-i", "2")), "GPU UUID")
    assert doc["devices"][uuid]["mig"]["mode_current"] == current.lower()


def _check_not_capable(node: Node, _cwd: Path) -> None:
    """A board without MIG refuses the mode: NOT_SUPPORTED, as real hardware does."""
    assert mig_mode(node, 0) == ("N/A", "N/A")
    # nvidia-smi treats NVML_ERROR_NOT_SUPPORTED here as a warning (exit 0)
    refused = ok(node.smi("-mig", "1", "-i", "0"))
    assert "Unable to enable MIG Mode" in refused, refused
    assert "Not Supported" in refused, refused
    assert mig_mode(node, 0) == ("N/A", "N/A")


def _check_busy_gpu_stays_pending(node: Node, cwd: Path) -> None:
    """A process on the GPU keeps the change pending: the driver cannot reset it."""
    ctl = run_mokka("ctl", "--root", str(node.root), "set", "--gpu", "1",
                    "processes=[{pid: 4242, type: compute, used_memory_bytes: 1048576}]", cwd=cwd)
    assert ctl.returncode == 0, ctl.stderr
    deadline = time.monotonic() + 20
    while "4242" not in ok(node.smi("-q", "-i", "1", "-d", "PIDS")):
        assert time.monotonic() < deadline, "the process never showed on GPU 1"
    out = ok(node.smi("-mig", "1", "-i", "1"))
    assert "pending enable state" in out, out
    assert "In use by another client" in out, out
    assert mig_mode(node, 1) == ("Disabled", "Enabled")
    refused = node.smi("-r", "-i", "1")
    assert refused.returncode == 19, refused.stdout  # NVML_ERROR_IN_USE
    assert mig_mode(node, 1) == ("Disabled", "Enabled")


_LGI_ROW = re.compile(r"^\|\s+0\s+MIG (\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s+\|$", re.M)
_LCI_ROW = re.compile(r"^\|\s+0\s+(\d+)\s+MIG (\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s+\|$", re.M)


def _check_instances(node: Node, _cwd: Path) -> None:
    """Seven 1g GPU instances with their compute instances, as ``nvidia-smi mig
    -cgi 19,... -C`` makes them; the eighth does not fit; ``-dci``/``-dgi`` undo it."""
    table = mig_profiles.board(field(ok(node.smi("-q", "-i", "0")), "Product Name"))
    assert table is not None
    by_id = {p.smi_id: p for p in table.profiles}
    one, three, four = by_id[19].name, by_id[9].name, by_id[5].name
    out = ok(node.smi("mig", "-cgi", ",".join(["19"] * 7), "-C", "-i", "0"))
    assert out.count("Successfully created GPU instance") == 7, out
    assert out.count("Successfully created compute instance") == 7, out
    # another process lists them: NVML's ids follow the placements
    gis = _LGI_ROW.findall(ok(node.smi("mig", "-lgi", "-i", "0")))
    assert [(n, int(p), int(i), int(s), int(z)) for n, p, i, s, z in gis] == [
        (one, 19, 7 + k, k, 1) for k in range(7)]
    cis = _LCI_ROW.findall(ok(node.smi("mig", "-lci", "-i", "0")))
    assert [(int(g), n, int(p), int(i)) for g, n, p, i, _s, _z in cis] == [
        (7 + k, one, 0, 0) for k in range(7)]
    # -L lists them as MIG devices, with UUIDs another process sees the same
    listing = ok(node.smi("-L"))
    row = rf"^  MIG {re.escape(one)}\s+Device\s+(\d): \(UUID: (MIG-[0-9a-f-]{{36}})\)$"
    uuids = re.findall(row, listing, re.M)
    assert [int(i) for i, _ in uuids] == list(range(7)), listing
    assert len({u for _, u in uuids}) == 7
    assert ok(node.smi("-L")) == listing
    _check_mig_handles(node, [u for _, u in uuids], by_id[19].memory_mib)
    assert "Enabled" in mig_mode(node, 0)  # -q of a GPU with MIG devices still answers
    # a layout the board cannot hold: NVML_ERROR_INSUFFICIENT_RESOURCES, nothing changes
    for profile in ("19", "9", "0"):
        full = node.smi("mig", "-cgi", profile, "-i", "0")
        assert full.returncode != 0
        assert "Insufficient Resources" in full.stdout, full.stdout
    # a GPU instance with compute instances, and MIG mode with instances, stay
    busy = node.smi("mig", "-dgi", "-gi", "7", "-i", "0")
    assert busy.returncode != 0
    assert "In use by another client" in busy.stdout, busy.stdout
    refused = node.smi("-mig", "0", "-i", "0")
    assert "In use by another client" in refused.stdout, refused.stdout
    assert mig_mode(node, 0) == ("Enabled", "Enabled")
    # the layout is node state, under the GPU's UUID
    doc = yaml.safe_load((node.root / layout.OVERRIDES.lstrip("/")).read_text())
    uuid = field(ok(node.smi("-q", "-i", "0")), "GPU UUID")
    assert [gi["start"] for gi in doc["devices"][uuid]["mig"]["instances"]] == list(range(7))
    # -dci then -dgi undo it all
    assert ok(node.smi("mig", "-dci", "-i", "0")).count("Successfully destroyed") == 7
    assert ok(node.smi("mig", "-dgi", "-i", "0")).count("Successfully destroyed") == 7
    assert "No GPU instances found" in node.smi("mig", "-lgi", "-i", "0").stdout
    # a mixed layout, placed by hand: 4g at 0, then 3g (which only fits at 4), then nothing
    ok(node.smi("mig", "-cgi", "5,9", "-i", "0"))
    gis = _LGI_ROW.findall(ok(node.smi("mig", "-lgi", "-i", "0")))
    assert sorted((int(s), n, int(z)) for n, _p, _i, s, z in gis) == [
        (0, four, 4), (4, three, 4)]
    assert "Insufficient Resources" in node.smi("mig", "-cgi", "19", "-i", "0").stdout
    ok(node.smi("mig", "-dgi", "-i", "0"))


MIG_HANDLES_SCRIPT = """
import json, pynvml
pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
def number(value):  # some of nvidia-ml-py's getters hand back the c_uint itself
    return getattr(value, "value", value)
out = {"max": pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu), "devices": []}
for index in range(out["max"]):
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index)
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    attributes = pynvml.nvmlDeviceGetAttributes(mig)
    out["devices"].append([
        pynvml.nvmlDeviceGetUUID(mig), number(pynvml.nvmlDeviceIsMigDeviceHandle(mig)),
        pynvml.nvmlDeviceGetUUID(parent) == pynvml.nvmlDeviceGetUUID(gpu),
        number(pynvml.nvmlDeviceGetGpuInstanceId(mig)),
        number(pynvml.nvmlDeviceGetComputeInstanceId(mig)),
        attributes.gpuInstanceSliceCount, attributes.memorySizeMB])
try:
    pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, out["max"])
except pynvml.NVMLError as exc:
    out["beyond"] = exc.value
out["gpu_is_mig"] = number(pynvml.nvmlDeviceIsMigDeviceHandle(gpu))
print(json.dumps(out))
"""


def _check_mig_handles(node: Node, uuids: list[str], memory: int) -> None:
    """nvidia-ml-py walks the MIG devices as the device plugin and GFD do."""
    probe = node.python(MIG_HANDLES_SCRIPT)
    out, err = probe.communicate(timeout=SMI_TIMEOUT)
    assert probe.returncode == 0, err
    answers = json.loads(out)
    assert answers["max"] == 7
    assert answers["devices"] == [
        [uuid, 1, True, 7 + k, 0, 1, memory] for k, uuid in enumerate(uuids)]
    assert answers["beyond"] == 6  # NVML_ERROR_NOT_FOUND
    assert answers["gpu_is_mig"] == 0


def _check_a100_mode(node: Node, _cwd: Path) -> None:
    assert mig_mode(node, 0) == ("Disabled", "Disabled")
    out = ok(node.smi("-mig", "1", "-i", "0"))
    # the A100 waits for a reset ("Deployment Considerations")
    assert "pending enable state" in out, out
    assert "GPU requires reset" in out, out
    assert mig_mode(node, 0) == ("Disabled", "Enabled")
    assert "was successfully reset" in ok(node.smi("-r", "-i", "0"))
    assert mig_mode(node, 0) == ("Enabled", "Enabled")
    # and back, the same way
    ok(node.smi("-mig", "0", "-i", "0"))
    assert mig_mode(node, 0) == ("Enabled", "Disabled")
    ok(node.smi("-r", "-i", "0"))
    assert mig_mode(node, 0) == ("Disabled", "Disabled")
    ok(node.smi("-mig", "1", "-i", "0"))
    ok(node.smi("-r", "-i", "0"))
