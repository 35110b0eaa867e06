"""The GPUs of a CPU: ``nvmlSystemGetTopologyGpuSet`` of the mock NVML library.

nvml.h: "Retrieve the set of GPUs that have a CPU affinity with the given
CPU number"; ``*count`` zero asks for how many there are, non-zero fills
``deviceArray`` with that many handles; ``NVML_ERROR_INVALID_ARGUMENT`` for
an invalid ``cpuNumber`` or ``count``, or a NULL ``deviceArray`` with a
non-zero ``count``.  A GPU belongs to a CPU's set exactly when its CPU
affinity (``nvmlDeviceGetCpuAffinity``: the profile's root complex CPU
list, every online CPU when the profile gives none) holds that CPU; a CPU
past the highest one any GPU's affinity names is no CPU of the node.

Expected sets come from the staged engine config's ``cpu_affinity`` lines
(what the library reads), expanded here independently, at the edges of
every range: first and last CPU, the CPUs either side, a CPU in no range,
the first CPU past every range, and far beyond.  Each check runs in a child
interpreter (NVML state is process-global) through nvidia-ml-py, through
the C ABI with ctypes for the count contract, and through the real
nvidia-smi 535 (``topo -c``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs
import pytest

from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.nvml_support import run_script, run_smi, write_config

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(120)]

SUCCESS, UNINITIALIZED, INVALID_ARGUMENT = 0, 1, 2
UINT_MAX = 2**32 - 1

#: The child: one command, one JSON document on stdout.
CHILD = r"""
import ctypes, json, os, sys
import pynvml as nv

def gpu_set(cpu):
    try:
        return [nv.nvmlDeviceGetIndex(h) for h in nv.nvmlSystemGetTopologyGpuSet(cpu)]
    except nv.NVMLError as error:
        return {"error": error.value}

def affinity(h, words):
    mask = nv.nvmlDeviceGetCpuAffinity(h, words)
    return [w * 64 + b for w, word in enumerate(mask) for b in range(64) if word >> b & 1]

command, *args = sys.argv[1:]
if command == "sets":
    cpus, words = json.loads(args[0]), int(args[1])
    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    out = {
        "sets": {str(cpu): gpu_set(cpu) for cpu in cpus},
        "affinity": [affinity(h, words) for h in handles],
        "online": os.sysconf("SC_NPROCESSORS_ONLN"),
    }
    nv.nvmlShutdown()
elif command == "raw":
    cpu, bad_cpu = int(args[0]), int(args[1])
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    fn = lib.nvmlSystemGetTopologyGpuSet
    fn.argtypes = (ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p)
    SENTINEL = 0x5A5A5A5A

    def index(h):
        i = ctypes.c_uint(99)
        r = lib.nvmlDeviceGetIndex(ctypes.c_void_p(h), ctypes.byref(i))
        return i.value if r == 0 else {"error": r}

    def call(count, room, with_array=True, cpu_number=cpu):
        # room slots plus one past them, all holding a sentinel
        array = (ctypes.c_void_p * (room + 1))(*([SENTINEL] * (room + 1)))
        n = ctypes.c_uint(count)
        r = fn(cpu_number, ctypes.byref(n), array if with_array else None)
        handles = [index(h) if h != SENTINEL else "untouched" for h in array[:room + 1]]
        return {"ret": r, "count": n.value, "array": handles}

    out = {"uninitialized": call(0, 0, with_array=False)}
    lib.nvmlInit_v2()
    total = call(0, 0, with_array=False)["count"]
    out.update(
        total=total,
        null_count=fn(cpu, None, None),
        size_query=call(0, 0, with_array=False),
        size_query_with_array=call(0, 2),
        null_array=call(1, 0, with_array=False),
        exact=call(total, total),
        one_fewer=call(total - 1, total - 1),
        one_more=call(total + 1, total + 1),
        bad_cpu=call(7, 7, cpu_number=bad_cpu),
        bad_cpu_query=call(0, 0, with_array=False, cpu_number=bad_cpu),
    )
    lib.nvmlShutdown()
print(json.dumps(out))
"""


def child(native: Path, config: Path, *args: str, **extra: str) -> Any:
    return run_script(native, config, CHILD, *args, **extra)


def state_of(profile: str) -> State:
    return compile_profile(profile, node_name="worker-1")


def with_cpulists(state: State, lists: list[str | None]) -> State:
    """The state with root complex ``i``'s CPU list replaced by ``lists[i]``."""
    roots = tuple(attrs.evolve(root, cpulist=lists[i]) for i, root in enumerate(state.pcie_roots))
    return attrs.evolve(state, pcie_roots=roots)


def ranges(cpulist: str) -> list[tuple[int, int]]:
    """``0-55,112-167`` -> [(0, 55), (112, 167)]."""
    out = []
    for item in cpulist.split(","):
        first, _, last = item.partition("-")
        out.append((int(first), int(last or first)))
    return out


def staged_affinity(config: Path) -> dict[int, list[tuple[int, int]]]:
    """Each device position's ``cpu_affinity`` ranges, read from the staged file."""
    found = re.findall(r'^device\.(\d+)\.cpu_affinity: "([^"]*)"$', config.read_text(), re.M)
    return {int(pos): ranges(text) for pos, text in found}


def expected_set(affinity: dict[int, list[tuple[int, int]]], cpu: int) -> list[int] | dict:
    """The GPUs whose ranges hold ``cpu``; INVALID_ARGUMENT past the node's CPUs."""
    highest = max(hi for spans in affinity.values() for _, hi in spans)
    if cpu > highest:
        return {"error": INVALID_ARGUMENT}
    return sorted(
        pos for pos, spans in affinity.items() if any(lo <= cpu <= hi for lo, hi in spans)
    )


def edge_cpus(affinity: dict[int, list[tuple[int, int]]]) -> list[int]:
    """First and last CPU of every range and the CPUs either side of it,
    the first CPU past every range, and CPU numbers far beyond."""
    highest = max(hi for spans in affinity.values() for _, hi in spans)
    cpus = {highest + 1, highest + 2, 9999, UINT_MAX}
    for spans in affinity.values():
        for lo, hi in spans:
            cpus.update({lo, hi, hi + 1} | ({lo - 1} if lo > 0 else set()))
    return sorted(cpus)


def check_sets(native: Path, config: Path, **extra: str) -> dict[str, Any]:
    """Run the child over the edge CPUs; assert every set; the child's answer."""
    affinity = staged_affinity(config)
    cpus = edge_cpus(affinity)
    highest = max(hi for spans in affinity.values() for _, hi in spans)
    words = highest // 64 + 1  # room for every CPU of the node
    got = child(native, config, "sets", json.dumps(cpus), str(words), **extra)
    for cpu in cpus:
        assert got["sets"][str(cpu)] == expected_set(affinity, cpu), f"CPU {cpu}"
    return got


@pytest.mark.parametrize("profile", ["h100", "gb200"])
def test_a_cpu_s_gpus_are_the_ones_whose_affinity_holds_it(
    native: Path, tmp_path: Path, profile: str
):
    config = write_config(tmp_path, state_of(profile))
    got = check_sets(native, config)
    # nvmlDeviceGetCpuAffinity reports the same CPUs, so every GPU is in the
    # set of the first and the last CPU of each of its ranges
    affinity = staged_affinity(config)
    for pos, cpus in enumerate(got["affinity"]):
        assert cpus == [c for lo, hi in affinity[pos] for c in range(lo, hi + 1)]
        for lo, hi in affinity[pos]:
            assert pos in got["sets"][str(lo)]
            assert pos in got["sets"][str(hi)]


def test_h100_sockets_split_the_gpus(native: Path, tmp_path: Path):
    """The defect as reported: CPU 0 and CPU 56 each see their own socket's
    four GPUs, and CPU 9999 is no CPU of the node."""
    config = write_config(tmp_path, state_of("h100"))
    got = child(native, config, "sets", json.dumps([0, 56, 9999]), "4")
    assert got["sets"] == {
        "0": [0, 1, 2, 3],
        "56": [4, 5, 6, 7],
        "9999": {"error": INVALID_ARGUMENT},
    }


def test_gb200_each_grace_sees_its_two_gpus(native: Path, tmp_path: Path):
    config = write_config(tmp_path, state_of("gb200"))
    got = child(native, config, "sets", json.dumps([0, 71, 72, 143, 144]), "3")
    assert got["sets"] == {
        "0": [0, 1],
        "71": [0, 1],
        "72": [2, 3],
        "143": [2, 3],
        "144": {"error": INVALID_ARGUMENT},
    }


@pytest.mark.parametrize("profile", ["h100", "gb200"])
def test_a_cpu_in_no_range_has_no_gpus(native: Path, tmp_path: Path, profile: str):
    """CPU lists with gaps: a CPU in a gap belongs to the node (below its
    highest CPU) but to no GPU's affinity, so its set is empty, not an error."""
    state = state_of(profile)
    lists = ["0-15", "0-15", "32-47,64-71", "32-47,64-71"][: len(state.pcie_roots)]
    config = write_config(tmp_path, with_cpulists(state, lists))
    got = check_sets(native, config)
    assert got["sets"]["16"] == got["sets"]["48"] == []
    assert got["sets"]["72"] == {"error": INVALID_ARGUMENT}


def test_without_cpu_lists_every_online_cpu_has_every_gpu(native: Path, tmp_path: Path):
    """No CPU list in the profile: nvmlDeviceGetCpuAffinity's default (every
    online CPU of this machine) is the set's too."""
    state = state_of("gb200")
    config = write_config(tmp_path, with_cpulists(state, [None] * len(state.pcie_roots)))
    assert staged_affinity(config) == {}
    probe = child(native, config, "sets", "[0]", "1")
    online = probe["online"]
    cpus = sorted({0, online - 1, online, online + 1, 9999})
    got = child(native, config, "sets", json.dumps(cpus), str(online // 64 + 1))
    everyone = list(range(len(state.gpus)))
    assert got["affinity"] == [list(range(online))] * len(state.gpus)
    for cpu in cpus:
        assert got["sets"][str(cpu)] == (everyone if cpu < online else {"error": INVALID_ARGUMENT})


def test_only_visible_gpus_are_listed(native: Path, tmp_path: Path):
    """A process shown GPUs 1 and 6 (h100: socket 0 and socket 1) lists them
    under their own indices; a CPU near none of them still is the node's."""
    state = state_of("h100")
    config = write_config(tmp_path, state)
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in (1, 6):
        (dev / f"nvidia{state.gpus[i].minor}").touch()
    got = child(
        native, config, "sets", json.dumps([0, 56, 223, 224]), "4", MOCK_NVML_DEV_DIR=str(dev)
    )
    assert got["sets"] == {"0": [0], "56": [1], "223": [1], "224": {"error": INVALID_ARGUMENT}}
    # with GPU 6 alone, CPU 0 is a CPU of the node that no visible GPU is near
    (dev / f"nvidia{state.gpus[1].minor}").unlink()
    got = child(native, config, "sets", json.dumps([0, 223]), "4", MOCK_NVML_DEV_DIR=str(dev))
    assert got["sets"] == {"0": [], "223": [0]}


@pytest.mark.parametrize("profile", ["h100", "gb200"])
def test_count_contract(native: Path, tmp_path: Path, profile: str):
    """nvml.h's count semantics through the C ABI: zero asks for the size,
    non-zero fills that many handles; no slot past them is written."""
    config = write_config(tmp_path, state_of(profile))
    affinity = staged_affinity(config)
    members = expected_set(affinity, 0)
    total = len(members)
    got = child(native, config, "raw", "0", "9999")
    assert got["uninitialized"]["ret"] == UNINITIALIZED
    assert got["total"] == total
    assert got["null_count"] == INVALID_ARGUMENT
    assert got["size_query"] == {"ret": SUCCESS, "count": total, "array": ["untouched"]}
    # a zero count asks for the size even with an array, which stays untouched
    assert got["size_query_with_array"] == {
        "ret": SUCCESS,
        "count": total,
        "array": ["untouched"] * 3,
    }
    assert got["null_array"]["ret"] == INVALID_ARGUMENT
    assert got["null_array"]["count"] == 1
    assert got["exact"] == {"ret": SUCCESS, "count": total, "array": [*members, "untouched"]}
    # "filled with count number of device handles": the first count of them
    assert got["one_fewer"] == {
        "ret": SUCCESS,
        "count": total - 1,
        "array": [*members[:-1], "untouched"],
    }
    # more room than GPUs: the count says how many were written
    assert got["one_more"] == {
        "ret": SUCCESS,
        "count": total,
        "array": [*members, "untouched", "untouched"],
    }
    # an invalid CPU writes nothing
    assert got["bad_cpu"] == {"ret": INVALID_ARGUMENT, "count": 7, "array": ["untouched"] * 8}
    assert got["bad_cpu_query"] == {"ret": INVALID_ARGUMENT, "count": 0, "array": ["untouched"]}


def smi_gpu_set(text: str, cpu: int) -> list[int] | None:
    """The GPU indices `nvidia-smi topo -c` lists ([] for none), None when it failed."""
    if f"No GPUs were found to have an affinity with CPU {cpu}." in text:
        return []
    match = re.search(rf"The GPUs that have an affinity with CPU {cpu} are:\n([0-9, ]+)\n", text)
    return [int(i) for i in match[1].split(",")] if match else None


@pytest.mark.parametrize("profile", ["h100", "gb200"])
def test_nvidia_smi_topo_c_lists_the_set(native: Path, smi: Path, tmp_path: Path, profile: str):
    state = state_of(profile)
    lists = [root.cpulist for root in state.pcie_roots]
    # the first socket's CPUs cut to four, so the rest of them are near no GPU
    lo = ranges(lists[0])[0][0]
    gapped = [f"{lo}-{lo + 3}" if cpulist == lists[0] else cpulist for cpulist in lists]
    config = write_config(tmp_path, with_cpulists(state, gapped))
    affinity = staged_affinity(config)
    last_lo, highest = max(span for spans in affinity.values() for span in spans)
    for cpu in (lo, lo + 3, lo + 4, last_lo, highest, highest + 1, 9999):
        result = run_smi(smi, native, config, "topo", "-c", str(cpu))
        expected = expected_set(affinity, cpu)
        if isinstance(expected, dict):
            assert result.returncode != 0, result.stdout
            assert "Failed to display GPUs with affinity" in result.stdout
        else:
            assert result.returncode == 0, result.stdout + result.stderr
            assert smi_gpu_set(result.stdout, cpu) == expected, (cpu, result.stdout)
