"""The mock NVML library through NVIDIA's own Python bindings (nvidia-ml-py).

Each check runs in a child interpreter (tests/nvml_probe.py) because NVML
state is process-global.  Expected values come from the compiled State of
built-in profiles, so a profile change and the library stay in step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from mokka import layout
from mokka.state.compile import compile_profile
from mokka.state.model import Failure, Gpu, State, Xid
from tests.nvml_support import PROBE, node_path, nvml_env, probe, write_config

pytestmark = pytest.mark.realclient

NOT_SUPPORTED, NOT_FOUND, UNINITIALIZED, TIMEOUT, GPU_IS_LOST = 3, 6, 1, 10, 15
DRIVER_NOT_LOADED, UNKNOWN = 9, 999
ARCH = {"turing": 6, "ampere": 7, "ada": 8, "hopper": 9, "blackwell": 10}
FABRIC_STATE = {"completed": 3, "in_progress": 2, "not_started": 1}
#: What a getter the claimed driver branch removed answers (``native/nvml/deprecation.c``).
DEPRECATED = {"error": 26}


def state_of(profile: str) -> State:
    return compile_profile(profile, node_name="worker-1")


def with_gpu(state: State, index: int, **changes) -> State:
    gpus = tuple(attrs.evolve(g, **changes) if g.index == index else g for g in state.gpus)
    return attrs.evolve(state, gpus=gpus)


def field(gpu: Gpu, dotted: str):
    value = gpu.fields
    for part in dotted.split("."):
        value = value[part]
    return value


@pytest.mark.parametrize("profile", ["h100", "a100", "gb200", "t4", "l40s"])
def test_every_implemented_call_reports_the_profile(native: Path, tmp_path: Path, profile: str):
    state = state_of(profile)
    branch = int(state.system.driver_version.split(".")[0])
    config = write_config(tmp_path, state)
    got = probe(native, config, "inventory")

    assert got["driver_version"] == state.system.driver_version
    assert got["nvml_version"] == state.system.nvml_version
    assert got["cuda_driver_version"] == state.system.cuda_driver_version
    assert got["cuda_driver_version_v2"] == state.system.cuda_driver_version
    assert got["count"] == len(state.gpus)
    assert got["by_uuid_is_last"]
    assert got["by_bus_id_is_last"]
    assert got["by_bus_id_lower_is_last"]
    assert got["unknown_uuid"] == {"error": NOT_FOUND}
    assert got["after_shutdown"] == {"error": UNINITIALIZED}

    for position, (gpu, dev) in enumerate(zip(state.gpus, got["devices"], strict=True)):
        arch = "ada" if gpu.architecture == "ada_lovelace" else gpu.architecture
        assert dev["index"] == position
        assert dev["name"] == gpu.name
        assert dev["uuid"] == gpu.uuid
        assert dev["serial"] == gpu.serial
        assert dev["minor"] == gpu.minor
        assert dev["brand"] == 14  # NVML_BRAND_NVIDIA
        assert dev["architecture"] == ARCH[arch]
        assert dev["board_id"] == field(gpu, "board_id")  # the profile's, not derived
        pcie = field(gpu, "pcie")
        assert dev["pcie_max_gen"] == pcie["max_link_gen"]
        # the GPU's own top generation, above the link's on GB200 (Gen 6 GPU, Gen 5 Grace port)
        assert dev["gpu_max_pcie_gen"] == pcie.get("max_device_link_gen", pcie["max_link_gen"])
        module = gpu.fields.get("module_power")
        assert dev["module_power_limits"] == [
            {"ret": 0, "value": module[key]} if module else {"ret": NOT_SUPPORTED, "value": 0}
            for key in ("min_limit_mw", "max_limit_mw", "default_limit_mw", "enforced_limit_mw")
        ]
        assert dev["board_part_number"] == field(gpu, "board_part_number")
        assert dev["vbios"] == field(gpu, "vbios_version")
        assert dev["inforom_image"] == field(gpu, "inforom.image_version")
        assert dev["compute_capability"] == [
            field(gpu, "compute_capability.major"),
            field(gpu, "compute_capability.minor"),
        ]
        pci = dev["pci"]
        assert pci["busId"] == gpu.nvml_bus_id
        assert pci["busIdLegacy"] == gpu.nvml_bus_id[4:]
        assert pci["bus"] == gpu.bus
        assert pci["pciDeviceId"] == (gpu.pci_device_id << 16) | gpu.pci_vendor_id
        assert pci["pciSubSystemId"] == (gpu.pci_subsystem_device_id << 16) | (
            gpu.pci_subsystem_vendor_id
        )
        assert dev["pcie_gen"] == field(gpu, "pcie.current_link_gen")
        assert dev["pcie_width"] == field(gpu, "pcie.max_link_width")

        total = field(gpu, "memory.total_bytes")
        reserved = field(gpu, "memory.reserved_bytes")
        used = field(gpu, "memory.used_bytes")
        free = total - reserved - used
        assert dev["memory"] == {"total": total, "free": free, "used": used + reserved}
        assert dev["memory_v2"]["reserved"] == reserved
        assert dev["memory_v2"]["used"] == used
        assert dev["memory_v2"]["free"] == dev["memory"]["free"]
        assert dev["bar1"]["bar1Total"] == field(gpu, "bar1_memory.total_bytes")

        assert dev["power_usage"] == field(gpu, "power.current_draw_mw")
        assert dev["power_limit"] == field(gpu, "power.enforced_limit_mw")
        assert dev["power_enforced"] == field(gpu, "power.enforced_limit_mw")
        assert dev["power_default"] == field(gpu, "power.default_limit_mw")
        assert dev["power_constraints"] == [
            field(gpu, "power.min_limit_mw"),
            field(gpu, "power.max_limit_mw"),
        ]
        assert dev["temperature"] == field(gpu, "thermal.temperature_gpu_c")
        assert dev["temp_shutdown"] == field(gpu, "thermal.shutdown_threshold_c")
        assert dev["temp_slowdown"] == field(gpu, "thermal.slowdown_threshold_c")
        assert dev["fan"] == {"error": NOT_SUPPORTED}  # data center boards have no fans
        assert dev["clock_sm"] == field(gpu, "clocks.sm_current")
        assert dev["max_clock_graphics"] == field(gpu, "clocks.graphics_max")
        assert dev["max_clock_memory"] == field(gpu, "clocks.memory_max")
        assert dev["app_clock_graphics"] == (
            DEPRECATED if branch >= 595 else field(gpu, "clocks.graphics_app"))
        assert dev["supported_memory_clocks"] == [
            m["freq_mhz"] for m in field(gpu, "supported_clocks.memory_clocks")
        ]
        idle = 1 if field(gpu, "clocks_throttle_reasons.gpu_idle") else 0
        assert dev["throttle_reasons"] & 1 == idle
        assert dev["supported_throttle_reasons"] == 0x1FF
        assert dev["pstate"] == int(field(gpu, "performance_state")[1:])
        assert dev["utilization"] == {
            "gpu": field(gpu, "utilization.gpu"),
            "memory": field(gpu, "utilization.memory"),
        }
        assert dev["encoder"][0] == field(gpu, "utilization.encoder")
        assert dev["processes"] == []
        assert dev["ecc_mode"] == [1, 1]
        assert dev["ecc_uncorrected_volatile"] == 0
        assert dev["persistence"] == (field(gpu, "persistence_mode") == "enabled")
        assert dev["compute_mode"] == 0
        assert dev["display_mode"] == (
            DEPRECATED if branch >= 580 else field(gpu, "display.mode") == "enabled")
        assert dev["is_mig"] == 0
        if "mig" in gpu.fields:
            assert dev["mig_mode"] == [0, 0]
            assert dev["mig_handle"] == {"error": NOT_FOUND}
        else:  # not MIG capable: what GFD reads as "no MIG"
            assert dev["mig_mode"] == {"error": NOT_SUPPORTED}
        assert dev["supported_events"] & 0x8  # XID_CRITICAL_ERROR: the device plugin needs it

        links = state.nvlink.links_per_gpu if state.nvlink else 0
        if links:
            assert dev["nvlink_state_0"] == 1
            assert dev["nvlink_version_0"] == state.nvlink.version
            assert dev["nvlink_capability_0"] == 1
        else:
            assert dev["nvlink_state_0"] == {"error": NOT_SUPPORTED}
        if state.nvlink and state.nvlink.switches:
            assert dev["nvlink_remote_0"].lower().endswith(state.nvlink.switches[0].bdf.lower())
        values = {v["id"]: v for v in dev["field_values"]}
        assert values[187]["value"] == field(gpu, "power.min_limit_mw")
        assert values[188]["value"] == field(gpu, "power.max_limit_mw")
        assert values[189]["value"] == field(gpu, "power.default_limit_mw")
        assert values[190]["value"] == field(gpu, "power.enforced_limit_mw")
        memory_temp = field(gpu, "thermal.temperature_memory_c")
        if isinstance(memory_temp, int):
            assert (values[82]["ret"], values[82]["value"]) == (0, memory_temp)
        else:  # the profile says N/A (GDDR boards report no memory temperature)
            assert values[82]["ret"] == NOT_SUPPORTED
        assert values[91]["value"] == links
        assert values[9999]["ret"] == NOT_SUPPORTED
        assert all(v["ret"] == 0 for i, v in values.items() if i not in (82, 9999))

        if gpu.fabric is None:
            assert dev["fabric"] == {"error": NOT_SUPPORTED}
        else:
            fabric = dev["fabric"]
            expected = "in_progress" if gpu.fabric.state == "auto" else gpu.fabric.state
            assert fabric["state"] == FABRIC_STATE[expected]
            assert fabric["cliqueId"] == gpu.fabric.clique_id
            assert bytes(fabric["clusterUuid"]).hex() == gpu.fabric.cluster_uuid.replace("-", "")


def test_topology_follows_root_complexes_and_numa_nodes(native: Path, tmp_path: Path):
    state = state_of("h100")
    config = write_config(tmp_path, state)
    devices = probe(native, config, "inventory")["devices"]
    # Pairs (i, i+1): same root complex -> HOSTBRIDGE (30), same NUMA node -> NODE (40),
    # else SYSTEM (50).
    for i, dev in enumerate(devices):
        a, b = state.gpus[i], state.gpus[(i + 1) % len(state.gpus)]
        if a.root_complex == b.root_complex:
            expected = 30
        elif a.numa_node == b.numa_node:
            expected = 40
        else:
            expected = 50
        assert dev["common_ancestor"] == expected, (i, a.root_complex, b.root_complex)
        assert dev["nearest_gpus_system"] == len(state.gpus) - 1
        cpus = next(r.cpulist for r in state.pcie_roots if r.id == a.root_complex)
        first, last = (int(x) for x in cpus.split(",")[0].split("-"))
        mask = sum(word << (64 * i) for i, word in enumerate(dev["cpu_affinity"]))
        assert mask >> first & 1
        assert mask >> last & 1
        assert not mask >> (last + 1) & 1


def test_fabric_auto_completes_when_the_fabric_manager_marker_appears(native: Path, tmp_path: Path):
    config = write_config(tmp_path, state_of("h100"))
    assert probe(native, config, "inventory")["devices"][0]["fabric"]["state"] == 2
    # the mirror beside the config is the one the library reads (no ".." in its path)
    marker = node_path(tmp_path, layout.FABRIC_READY_MIRROR)
    marker.touch()
    fabric = probe(native, config, "inventory")["devices"][0]["fabric"]
    assert fabric["state"] == 3
    assert fabric["status"] == 0


def test_fabric_completes_through_a_copy_of_the_driver_root_alone(native: Path, tmp_path: Path):
    """The driver root bind-mounted (or mounted alone into a container) still sees the marker."""
    config = write_config(tmp_path / "node", state_of("h100"))
    node_path(tmp_path / "node", layout.FABRIC_READY_MIRROR).touch()
    node_path(tmp_path / "node", layout.FABRIC_READY_MARKER).parent.mkdir(parents=True)
    node_path(tmp_path / "node", layout.FABRIC_READY_MARKER).touch()
    # Only the driver root travels: nothing beside it, as in /run/nvidia/driver.
    alone = tmp_path / "run-nvidia-driver"
    shutil.copytree(node_path(tmp_path / "node", layout.DRIVER_ROOT), alone)
    moved = alone / config.relative_to(node_path(tmp_path / "node", layout.DRIVER_ROOT))
    fabric = probe(native, moved, "inventory")["devices"][0]["fabric"]
    assert fabric["state"] == 3


def test_event_wait_blocks_for_its_timeout_and_records_only_later_xids(native: Path,
                                                                      tmp_path: Path):
    idle = write_config(tmp_path / "idle", state_of("h100"))
    waits = probe(native, idle, "events", "100", "2")["waits"]
    assert [w["error"] for w in waits] == [TIMEOUT, TIMEOUT]
    # A real clock: the library must actually block (the device plugin spins otherwise).
    assert all(w["elapsed"] >= 0.095 for w in waits)

    # Xids listed before the set registered happened before it: as in NVML, not
    # recorded (tests/test_nvml_events.py: later ones, a copy to each set).
    state = attrs.evolve(
        state_of("h100"),
        xids=(Xid(id="x-79-a", gpu_index=3, code=79), Xid(id="x-48-b", gpu_index=5, code=48)),
    )
    config = write_config(tmp_path / "xid", state)
    waits = probe(native, config, "events", "0", "1")["waits"]
    assert waits[0]["error"] == TIMEOUT


def test_lost_gpu_fails_guarded_calls_after_n_calls(native: Path, tmp_path: Path):
    state = with_gpu(state_of("h100"), 2, failure=Failure(mode="lost", after_calls=3))
    config = write_config(tmp_path, state)
    got = probe(native, config, "failure", "2", "6")
    temperature = field(state.gpus[2], "thermal.temperature_gpu_c")
    assert got["calls"] == [temperature] * 3 + [{"error": GPU_IS_LOST}] * 3
    assert got["identity"]["uuid"] == state.gpus[2].uuid  # identity still answers
    healthy = probe(native, config, "failure", "1", "6")
    assert healthy["calls"] == [field(state.gpus[1], "thermal.temperature_gpu_c")] * 6


def test_fallen_off_bus_with_probability_is_reproducible_and_sticky(native: Path, tmp_path: Path):
    failure = Failure(mode="fallen_off_bus", probability=0.3, seed=7)
    config = write_config(tmp_path, with_gpu(state_of("h100"), 0, failure=failure))
    first = probe(native, config, "failure", "0", "30")["calls"]
    second = probe(native, config, "failure", "0", "30")["calls"]
    assert first == second  # the seed makes the draw reproducible
    lost = [i for i, c in enumerate(first) if c == {"error": GPU_IS_LOST}]
    assert lost, "probability 0.3 over 30 calls never tripped"
    assert lost == list(range(lost[0], 30))  # sticky once tripped


def test_ecc_uncorrectable_is_one_error_that_holds(native: Path, tmp_path: Path):
    config = write_config(
        tmp_path, with_gpu(state_of("h100"), 1, failure=Failure(mode="ecc_uncorrectable"))
    )
    got = probe(native, config, "failure", "1", "4")
    assert all(isinstance(c, int) for c in got["calls"])  # calls keep working
    assert got["ecc"] == got["ecc_again"] == 1  # node state: no count per call


def test_visible_devices_follow_the_device_nodes_present(native: Path, tmp_path: Path):
    state = state_of("h100")
    config = write_config(tmp_path, state)
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia1").touch()
    got = probe(native, config, "inventory", MOCK_NVML_DEV_DIR=str(dev))
    assert got["count"] == 1
    assert got["devices"][0]["uuid"] == state.gpus[1].uuid
    assert got["devices"][0]["index"] == 0  # renumbered, as in a pod given one GPU
    for i in range(len(state.gpus)):
        (dev / f"nvidia{i}").touch()
    assert probe(native, config, "inventory", MOCK_NVML_DEV_DIR=str(dev))["count"] == 8


def test_config_is_reread_when_it_changes(native: Path, tmp_path: Path):
    state = state_of("t4")
    config = write_config(tmp_path, state)
    child = subprocess.Popen(
        [sys.executable, str(PROBE), "reread"],
        env=nvml_env(native, config),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "READY"
        write_config(tmp_path, with_gpu(state, state.gpus[0].index, name="Renamed T4"))
        child.stdin.write("go\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"before": "Tesla T4", "after": "Renamed T4"}


@pytest.mark.parametrize(
    ("content", "code"),
    [(None, DRIVER_NOT_LOADED), ("format: 2\ndevice_count: 0\n", UNKNOWN), ("x\n", UNKNOWN)],
)
def test_missing_or_invalid_config_fails_init_with_a_message(
    native: Path, tmp_path: Path, content: str | None, code: int
):
    config = tmp_path / "config.yaml"
    if content is not None:
        config.write_text(content)
    script = (
        "import pynvml\n"
        "try:\n    pynvml.nvmlInit()\nexcept pynvml.NVMLError as e:\n    print(e.value)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=nvml_env(native, config, MOCK_NVML_DEBUG="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == str(code)
    assert "mock-nvml:" in result.stderr
    assert str(config) in result.stderr


def test_config_found_relative_to_the_library(native: Path, tmp_path: Path):
    """A library at <root>/usr/lib64 reads <root>/config/config.yaml (no env needed)."""
    root = node_path(tmp_path, layout.DRIVER_ROOT)
    lib = root / "usr" / "lib64"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.1").write_bytes((native / "libnvidia-ml.so.1").read_bytes())
    write_config(tmp_path, state_of("t4"))
    env = {k: v for k, v in os.environ.items() if k != "MOCK_NVML_CONFIG"}
    env["LD_LIBRARY_PATH"] = str(lib)
    result = subprocess.run(
        [sys.executable, "-c", "import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetCount())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "1", result.stderr


def test_eight_threads_hammering_calls(native: Path, tmp_path: Path):
    config = write_config(tmp_path, state_of("h100"))
    got = probe(native, config, "hammer", "8", "1")
    assert got["errors"] == []
    assert got["calls"] > 1000
