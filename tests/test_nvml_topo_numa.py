"""`nvidia-smi topo -i <gpu> -C`: the NUMA node of the CPUs nearest a GPU.

nvidia-smi 535 asks through its private export table (slot 223, the
(device, words, node mask, scope) call of nvmlDeviceGetMemoryAffinity) and
prints "NUMA IDs of closest CPU: <nodes>"; without an answer it prints
"Failed to display NUMA ID of nearest CPU" and exits 255.  Every GPU of
every built-in profile answers its profile's `numa_node`, which is also its
memory affinity (`topo -M`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mokka.state.compile import compile_profile
from mokka.state.profile import BUILTIN_PROFILES
from tests.engine_config_oracle import parse_engine_config
from tests.nvml_support import run_smi, state_with_overrides, write_config

pytestmark = pytest.mark.realclient


@pytest.mark.timeout(120)
@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_topo_nearest_cpu_numa_node(native: Path, smi: Path, tmp_path: Path, profile: str):
    config = write_config(tmp_path, compile_profile(profile, node_name="worker-1"))
    values = parse_engine_config(config.read_bytes())
    assert values is not None
    count = int(values[b"device_count"])
    nodes = set()
    for index in range(count):
        node = int(values.get(f"device.{index}.numa_node".encode(), b"0"))
        nodes.add(node)
        cpu = run_smi(smi, native, config, "topo", "-i", str(index), "-C")
        assert (cpu.returncode, cpu.stdout) == (0, f"NUMA IDs of closest CPU: {node}\n"), (
            index, cpu.stdout + cpu.stderr)
        memory = run_smi(smi, native, config, "topo", "-i", str(index), "-M")
        assert (memory.returncode, memory.stdout) == (0, f"NUMA IDs of closest memory: {node}\n")
    if profile in ("h100", "b200", "gb200"):
        assert len(nodes) == 2, "two-socket boards put GPUs on both nodes"


def test_topo_nearest_cpu_of_a_lost_gpu_fails_as_nvidia_smi_says(
    native: Path, smi: Path, tmp_path: Path
):
    state = state_with_overrides("t4", tmp_path, ["fail", "--gpu", "0", "--mode", "lost"])
    config = write_config(tmp_path / "root", state)
    cpu = run_smi(smi, native, config, "topo", "-i", "0", "-C")
    assert cpu.returncode == 255
    assert "Failed to display NUMA ID of nearest CPU" in cpu.stdout + cpu.stderr
