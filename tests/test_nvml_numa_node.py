"""``nvmlDeviceGetNumaNodeId``: the GPU's own NUMA node, where it has one.

nvml.h documents the call for platforms where the GPUs are NUMA nodes:
Grace-attached GPUs (GB200, GB300, over coherent NVLink-C2C, addressing
mode ATS) whose memory the driver onlines as system memory.  There the
nodes are the Grace sockets' first, then eight per GPU (its memory and its
MIG partitions'): `nvidia-smi topo -m` on a GB200 tray prints the GPU NUMA
IDs 2, 10, 18, 26.  On x86 boards real drivers answer NOT_SUPPORTED (the
column reads N/A); the CPU's node nearest the GPU stays the memory
affinity's answer on every board.  Every built-in profile, through
nvidia-ml-py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mokka.state.compile import compile_profile
from mokka.state.profile import BUILTIN_PROFILES
from tests.engine_config_oracle import parse_engine_config
from tests.nvml_support import write_config
from tests.test_nvml_samples import run_pynvml

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(60)]

NOT_SUPPORTED = 3
#: NUMA nodes the driver gives each GPU whose memory is a node.
NODES_PER_GPU = 8

# nvidia-ml-py binds no wrapper of its own: the C call through its loader
SCRIPT = """
import ctypes
numa_node_id = nv._nvmlGetFunctionPointer("nvmlDeviceGetNumaNodeId")
out = []
for index in range(nv.nvmlDeviceGetCount()):
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    value = ctypes.c_uint(0xFFFF)
    ret = numa_node_id(handle, ctypes.byref(value))
    node = value.value if ret == 0 else {"error": ret}
    memory = nv.nvmlDeviceGetMemoryAffinity(handle, 1, nv.NVML_AFFINITY_SCOPE_NODE)[0]
    out.append([node, memory])
print(json.dumps(out))
"""


def expected_answers(config: Path) -> list[list[object]]:
    """Per GPU: its NUMA node id (or the error) and its memory affinity mask."""
    values = parse_engine_config(config.read_bytes())
    assert values is not None, config
    count = int(values[b"device_count"])
    cpu_nodes = [int(values.get(f"device.{i}.numa_node".encode(), b"0")) for i in range(count)]
    first_gpu_node = max(cpu_nodes) + 1  # the sockets' nodes come first
    answers: list[list[object]] = []
    for index, cpu_node in enumerate(cpu_nodes):
        grace = values.get(f"device.{index}.addressing_mode".encode()) == b"ats"
        node = (first_gpu_node + NODES_PER_GPU * index if grace
                else {"error": NOT_SUPPORTED})
        answers.append([node, 1 << cpu_node])
    return answers


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_numa_node_id_only_where_the_gpu_memory_is_a_node(native: Path, tmp_path: Path,
                                                          profile: str):
    config = write_config(tmp_path, compile_profile(profile, node_name="worker-1"))
    expected = expected_answers(config)
    got = run_pynvml(native, config, SCRIPT)
    assert got == expected
    grace = profile in ("gb200", "gb300")
    # the Grace trays as a real GB200 tray numbers them; x86 boards have none
    assert [node for node, _ in got] == (
        [2, 10, 18, 26] if grace else [{"error": NOT_SUPPORTED}] * len(got))
