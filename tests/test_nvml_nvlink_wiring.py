"""NVLink wiring of NVSwitch boards: every switch port has exactly one GPU link at its
other end, and every reader of the wiring sees the same one.

A GPU link's far end is read three ways: ``nvmlDeviceGetNvLinkRemotePciInfo(_v2)``
(which switch), field 146 ``NVML_FI_DEV_NVLINK_REMOTE_NVLINK_ID`` (which port of
it) and ``nvmlDeviceGetNvLinkRemoteDeviceType`` (a switch).  Combined over a
node they must form a real fabric: no (switch, port) used twice, each GPU's
links split over the switches as the baseboard splits them, and the switch's
PCI ids the ones the pcibus simulator stages in sysfs for that switch.  The
real nvidia-smi 535 (``nvlink -R``) must print the same endpoints.

Everything runs against a node staged under ``tmp_path``: the engine config
written by the real writer and the PCI tree the pcibus simulator plans
(``plan_tree`` + ``tree_artifacts`` converged by a ``Host``, which is what its
Stage does, minus the shim copy), with NVML in child processes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import pytest

from mokka import layout
from mokka.noderoot.host import Host
from mokka.simulators.gpudriver.engine_config import nvml_bus_id
from mokka.simulators.pcibus.hierarchy import plan_tree
from mokka.simulators.pcibus.sysfs import tree_artifacts
from mokka.state.compile import compile_profile
from mokka.state.model import NvlinkSwitch, State
from mokka.state.profile_files import BUILTIN_PROFILES
from tests.nvml_support import PYNVML_ATTEMPT, node_path, nvml_env, run_smi, write_config

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(120)]

SUCCESS, NOT_SUPPORTED = 0, 3
DEVICE_TYPE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
FI_REMOTE_LINK_ID = 146  # NVML_FI_DEV_NVLINK_REMOTE_NVLINK_ID

#: How many of each GPU's links go to each NVSwitch, in the profile's switch
#: order, on the baseboards whose split is public.  HGX H100: four
#: third-generation NVSwitch chips, 5, 4, 4 and 5 of an H100's 18 NVLink4 links
#: (NVIDIA's DGX H100 diagram, Hot Chips 34).  HGX B200: two NVLink 5 switch
#: chips, 9 of each GPU's 18 links to each (8 x 9 = a chip's 72 ports).
BOARD_SPLITS = {"h100": (5, 4, 4, 5), "b200": (9, 9)}


def even_split(links: int, switches: int) -> tuple[int, ...]:
    """A board with no public split: as even as it goes, the first switches one more."""
    base, extra = divmod(links, switches)
    return tuple(base + (s < extra) for s in range(switches))


def compiled(profile: str) -> State:
    return compile_profile(profile, node_name="worker-1")


#: Every built-in profile whose board has NVSwitches on its PCI bus.
SWITCH_PROFILES = [
    p for p in BUILTIN_PROFILES
    if (n := compiled(p).nvlink) is not None and n.switches and n.links_per_gpu > 0
]
#: NVLink boards without a switch on this node (GB200/GB300 trays, the one-GPU A100).
SWITCHLESS_PROFILES = [
    p for p in BUILTIN_PROFILES
    if (n := compiled(p).nvlink) is not None and not n.switches and n.links_per_gpu > 0
]

#: The child: every GPU's links as nvidia-ml-py and the C ABI read them, one
#: JSON document on stdout.  argv: links per GPU.
CHILD = r"""
import ctypes, json, sys
import pynvml as nv

class PciInfoV1(ctypes.Structure):
    # the 52-byte record the unversioned entry point fills (nothing past byte 36)
    _fields_ = [("busId", ctypes.c_char * 16), ("domain", ctypes.c_uint),
                ("bus", ctypes.c_uint), ("device", ctypes.c_uint),
                ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("reserved", ctypes.c_uint * 4)]

lib = ctypes.CDLL("libnvidia-ml.so.1")
v1 = lib.nvmlDeviceGetNvLinkRemotePciInfo
v1.argtypes = (ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p)

def text(value):
    return value.decode() if isinstance(value, bytes) else value

""" + PYNVML_ATTEMPT + r"""
def v2_info(h, link):
    pci = nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link)  # the _v2 symbol
    return {"bus_id": text(pci.busId),
            "domain": pci.domain, "bus": pci.bus, "device": pci.device,
            "device_id": pci.pciDeviceId, "subsystem_id": pci.pciSubSystemId}

def v1_info(h, link):
    out = PciInfoV1()
    ret = v1(ctypes.cast(h, ctypes.c_void_p), link, ctypes.byref(out))
    if ret != 0:
        return {"error": ret}
    return {"bus_id": text(out.busId), "device_id": out.pciDeviceId,
            "subsystem_id": out.pciSubSystemId}

links = int(sys.argv[1])
nv.nvmlInit()
out = []
for i in range(nv.nvmlDeviceGetCount()):
    h = nv.nvmlDeviceGetHandleByIndex(i)
    fields = nv.nvmlDeviceGetFieldValues(h, [(146, link) for link in range(links)])
    out.append({
        "bus_id": text(nv.nvmlDeviceGetPciInfo(h).busId),
        "links": [{
            "v2": attempt(lambda: v2_info(h, link)),
            "v1": v1_info(h, link),
            "type": attempt(lambda: nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)),
            "remote_link": {"ret": fields[link].nvmlReturn, "value": fields[link].value.uiVal},
        } for link in range(links)],
    })
nv.nvmlShutdown()
print(json.dumps(out))
"""


def stage(root: Path, state: State) -> Path:
    """The engine config and the pcibus simulator's PCI tree under ``root``; the config."""
    config = write_config(root, state)
    Host(root).converge("pcibus", tree_artifacts(plan_tree(state, fallback_cpus=8)))
    return config


def links_of(native: Path, config: Path, state: State, **env: str) -> list[dict[str, Any]]:
    """Per visible GPU: its bus id and, per link, what the child read."""
    assert state.nvlink is not None
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(state.nvlink.links_per_gpu)],
        env=nvml_env(native, config, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def sysfs_ids(root: Path, bus_id: str) -> tuple[int, int]:
    """NVML's packed (pciDeviceId, pciSubSystemId) of a function, from the staged sysfs files."""
    domain, rest = bus_id.split(":", 1)
    devices = node_path(root, layout.SYS_ROOT) / "bus/pci/devices"
    device = devices / f"{int(domain, 16):04x}:{rest.lower()}"

    def read(name: str) -> int:
        return int((device / name).read_text().strip(), 16)

    return (
        read("device") << 16 | read("vendor"),
        read("subsystem_device") << 16 | read("subsystem_vendor"),
    )


def endpoints(gpu: dict[str, Any]) -> list[tuple[str, int]]:
    """(remote bus id, remote link id) of every link of one GPU."""
    return [(link["v2"]["bus_id"], link["remote_link"]["value"]) for link in gpu["links"]]


def expected_split(state: State) -> tuple[int, ...]:
    assert state.nvlink is not None
    switches, links = len(state.nvlink.switches), state.nvlink.links_per_gpu
    # a built-in board's split; the same profile with other switches is another board
    split = BOARD_SPLITS.get(state.profile_name)
    if split is None or len(split) != switches or sum(split) != links:
        return even_split(links, switches)
    return split


def reused_ends(ends: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The (switch, port) pairs more than one GPU link claims."""
    return [end for end, n in Counter(ends).items() if n > 1]


def check_wiring(root: Path, state: State, gpus: list[dict[str, Any]]) -> None:
    """The fabric rules every NVSwitch board must satisfy (see the module docstring)."""
    assert state.nvlink is not None
    switches = [nvml_bus_id(s.bdf) for s in state.nvlink.switches]
    split = expected_split(state)
    assert len(gpus) == len(state.gpus)
    for gpu in gpus:
        for n, link in enumerate(gpu["links"]):
            assert link["type"] == DEVICE_TYPE_SWITCH, (gpu["bus_id"], n)
            assert link["remote_link"]["ret"] == SUCCESS, (gpu["bus_id"], n)
            assert "error" not in link["v2"], (gpu["bus_id"], n, link["v2"])
            assert link["v2"]["bus_id"] in switches, (gpu["bus_id"], n, link["v2"])

    # one peer per port: no (switch, port) twice, and each switch's ports are
    # 0 .. (links it terminates) - 1 with none left over
    all_ends = [end for gpu in gpus for end in endpoints(gpu)]
    assert not reused_ends(all_ends)
    for s, bus in enumerate(switches):
        ports = sorted(port for end_bus, port in all_ends if end_bus == bus)
        assert ports == list(range(split[s] * len(gpus))), bus

    for gpu in gpus:
        # the board's split of the GPU's links over the switches, in contiguous
        # blocks in the profile's switch order
        order = [switches.index(bus) for bus, _ in endpoints(gpu)]
        assert order == sorted(order), (gpu["bus_id"], order)
        counts = Counter(order)
        assert tuple(counts.get(s, 0) for s in range(len(switches))) == split, gpu["bus_id"]

        for n, link in enumerate(gpu["links"]):
            v2, v1 = link["v2"], link["v1"]
            # the legacy record names the same function, in its 4-digit spelling
            domain, rest = v2["bus_id"].split(":", 1)
            assert v1["bus_id"] == f"{int(domain, 16):04X}:{rest}", (gpu["bus_id"], n, v1)
            assert (v2["domain"], v2["bus"], v2["device"]) == (
                int(domain, 16), int(rest[:2], 16), int(rest[3:5], 16))
            # the switch's ids are the ones its staged sysfs files give
            ids = sysfs_ids(root, v2["bus_id"])
            assert (v2["device_id"], v2["subsystem_id"]) == ids, (gpu["bus_id"], n)
            assert (v1["device_id"], v1["subsystem_id"]) == ids, (gpu["bus_id"], n)


def smi_remote_links(out: str) -> list[list[tuple[int, str, int]]]:
    """Per GPU of `nvidia-smi nvlink -R`: (link, remote device, remote link)."""
    sections: list[list[tuple[int, str, int]]] = []
    pattern = re.compile(r"Link (\d+): Remote Device ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f.]+): "
                         r"Link (\d+)")
    for line in out.splitlines():
        if line.startswith("GPU "):
            sections.append([])
        elif line.strip():
            match = pattern.fullmatch(line.strip())
            assert match, line
            sections[-1].append((int(match[1]), match[2], int(match[3])))
    return sections


# ----------------------------------------------------------------- tests


def test_the_hgx_boards_are_among_the_switch_profiles():
    """h100 and b200 are the boards the defect was seen on: they must stay covered."""
    assert {"h100", "b200"} <= set(SWITCH_PROFILES)
    for profile in SWITCH_PROFILES:
        if profile in BOARD_SPLITS:
            nvlink = compiled(profile).nvlink
            assert nvlink is not None
            assert len(BOARD_SPLITS[profile]) == len(nvlink.switches)
            assert sum(BOARD_SPLITS[profile]) == nvlink.links_per_gpu


@pytest.mark.parametrize("profile", SWITCH_PROFILES)
def test_every_switch_port_has_one_peer(native: Path, tmp_path: Path, profile: str):
    state = compiled(profile)
    config = stage(tmp_path, state)
    check_wiring(tmp_path, state, links_of(native, config, state))


def test_h100_gpu0_and_gpu1_land_on_different_ports(native: Path, tmp_path: Path):
    """The reported defect: GPU 0 and GPU 1 both claimed port 0 of 00000000:05:00.0."""
    state = compiled("h100")
    gpus = links_of(native, stage(tmp_path, state), state)
    first, second = endpoints(gpus[0]), endpoints(gpus[1])
    assert first[0] == ("00000000:05:00.0", 0)
    assert second[0] == ("00000000:05:00.0", 5)  # after GPU 0's five ports
    assert not set(first) & set(second)
    # the switch is an NVSwitch (10de:22a3, subsystem 10de:22a3), not a bare vendor id
    link0 = gpus[0]["links"][0]["v2"]
    assert (link0["device_id"], link0["subsystem_id"]) == (0x22A310DE, 0x22A310DE)


@pytest.mark.parametrize("profile", SWITCH_PROFILES)
def test_nvidia_smi_lists_the_same_remote_ends(
    native: Path, smi: Path, tmp_path: Path, profile: str
):
    state = compiled(profile)
    config = stage(tmp_path, state)
    gpus = links_of(native, config, state)
    result = run_smi(smi, native, config, "nvlink", "-R")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Unknown Error" not in result.stdout
    listed = smi_remote_links(result.stdout)
    assert len(listed) == len(gpus)
    for gpu, lines in zip(gpus, listed, strict=True):
        assert lines == [(n, bus, port) for n, (bus, port) in enumerate(endpoints(gpu))]
    # what nvidia-smi prints is a fabric by itself: no remote device and link twice
    assert state.nvlink is not None
    assert sum(map(len, listed)) == len(gpus) * state.nvlink.links_per_gpu
    assert not reused_ends([(bus, port) for lines in listed for _, bus, port in lines])


def with_switches(state: State, bdfs: list[str]) -> State:
    assert state.nvlink is not None
    switches = tuple(
        NvlinkSwitch(bdf=bdf, uuid=f"SWITCH-TEST-0000-4000-8000-{n:012d}")
        for n, bdf in enumerate(bdfs)
    )
    return attrs.evolve(state, nvlink=attrs.evolve(state.nvlink, switches=switches))


@pytest.mark.parametrize(
    ("profile", "bdfs", "split", "switch_id"),
    [
        # 18 links over three or five switches: no known board, an even split
        ("h100", ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0"], (6, 6, 6), 0x22A3),
        ("h100", [f"0000:{b:02x}:00.0" for b in range(5, 10)], (4, 4, 4, 3, 3), 0x22A3),
        # an A100 board with six NVSwitches: two links each, the A100 NVSwitch's id
        ("a100", [f"0000:{b:02x}:00.0" for b in range(0x10, 0x16)], (2,) * 6, 0x1AF1),
    ],
    ids=["h100-3-switches", "h100-5-switches", "a100-6-switches"],
)
def test_other_switch_counts_split_links_evenly(
    native: Path, tmp_path: Path, profile: str, bdfs: list[str], split: tuple[int, ...],
    switch_id: int,
):
    state = with_switches(compiled(profile), bdfs)
    config = stage(tmp_path, state)
    assert expected_split(state) == split
    gpus = links_of(native, config, state)
    check_wiring(tmp_path, state, gpus)
    packed = switch_id << 16 | 0x10DE
    assert {link["v2"]["device_id"] for gpu in gpus for link in gpu["links"]} == {packed}


def test_a_pod_sees_the_same_ports_as_the_node(native: Path, tmp_path: Path):
    """Ports are numbered by the GPU's place on the board, not by what a process sees."""
    state = compiled("h100")
    config = stage(tmp_path, state)
    whole = links_of(native, config, state)
    dev = tmp_path / "dev"
    dev.mkdir()
    held = [5, 6]
    for index in held:
        (dev / f"nvidia{state.gpus[index].minor}").touch()
    pod = links_of(native, config, state, MOCK_NVML_DEV_DIR=str(dev))
    assert [gpu["bus_id"] for gpu in pod] == [whole[i]["bus_id"] for i in held]
    assert [endpoints(gpu) for gpu in pod] == [endpoints(whole[i]) for i in held]


@pytest.mark.parametrize("profile", SWITCHLESS_PROFILES)
def test_boards_without_a_switch_on_the_node_keep_their_answers(
    native: Path, tmp_path: Path, profile: str
):
    """GB200/GB300 trays (the switch trays are other nodes) and the one-GPU A100: the
    far end is a switch with no PCI function here, so RemotePciInfo has nothing to
    name; field 146 stays the link's own number."""
    state = compiled(profile)
    gpus = links_of(native, stage(tmp_path, state), state)
    for gpu in gpus:
        for n, link in enumerate(gpu["links"]):
            assert link["type"] == DEVICE_TYPE_SWITCH
            assert link["v2"] == {"error": NOT_SUPPORTED}
            assert link["v1"] == {"error": NOT_SUPPORTED}
            assert link["remote_link"] == {"ret": SUCCESS, "value": n}
