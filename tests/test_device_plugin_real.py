"""The real NVIDIA device plugin (k8s-device-plugin v0.17.4) against a Mokka node.

One real ``mokka daemon`` stages an h100 node on a temp root; the plugin runs
on the host against its published driver root, in a private mount namespace
that gives it the node's PCI tree (``tests/kubelet_support.py``), and
registers with a test kubelet.  It must see what it sees on a real node: the
GPUs ``nvidia-smi -L`` lists, their NUMA nodes, allocations for exactly the
requested GPUs, and a GPU turning Unhealthy when ``mokka ctl`` injects a
critical Xid, or falls off the bus, also after a SIGHUP (which switches the
plugin's strategy and restarts its servers and its health loop, while the
stopped loop's event set keeps waiting for up to 5 s: each set gets its own
copy of a Xid, as from NVML).  One daemon, kubelet and plugin serve the whole
module; the tests run in file order.  The plugin runs with
``MOCK_NVML_DEBUG=1``: the library's line for each event registration tells
when a health loop records Xids (the plugin logs nothing then), and a Xid
raised before that is, as on a real node, not the loop's to see.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from mokka import layout
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.daemon_support import PROCESS_TIMEOUT, daemon_env, run_mokka
from tests.kubelet_support import (
    PLUGIN_SPEC,
    WAIT,
    Kubelet,
    LoggedProcess,
    Registration,
    compile_api,
    device_plugin_binary,
    driver_root_directory,
    start_plugin,
)
from tests.support import real_nvidia_smi, snapshot

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(120)]

NODE_NAME = "dp-node"
#: The h100 profile's NUMA node of each GPU, by index (its pcie_topology).
H100_NUMA = [0, 0, 0, 0, 1, 1, 1, 1]
#: The two GPUs every Allocate asks for.
REQUESTED = (2, 6)
#: Bound on the time from ``mokka ctl`` to the plugin's Unhealthy list.
HEALTH_DEADLINE = 10.0


@attrs.define(eq=False)
class Node:
    """The module's node: daemon, kubelet, plugin, and what the test compares against."""

    base: Path
    root: Path
    state: State
    daemon: LoggedProcess
    kubelet: Kubelet
    plugin: LoggedProcess
    config: Path
    #: GPU UUIDs by index, as the real nvidia-smi lists them
    uuids: list[str]
    registration: Registration

    @property
    def driver(self) -> Path:
        return self.root / "run/nvidia/driver"

    def reconfigure(self, **plugin_flags: object) -> Registration:
        """New plugin flags: SIGHUP, then the new registration (its first list read)."""
        write_config(self.config, **plugin_flags)
        reloaded = len(self.plugin.lines)
        self.plugin.signal(signal.SIGHUP)
        try:
            self.registration = self.kubelet.next_registration()
        except AssertionError as error:
            error.add_note("plugin log:\n" + "\n".join(self.plugin.lines[reloaded:]))
            raise
        self.registration.wait_updates(1)
        self.wait_for_health_loop(after=reloaded)
        return self.registration

    def wait_for_health_loop(self, *, after: int) -> None:
        """Until a health loop started after log line ``after`` records the Xids of
        every GPU (the mock library's debug line for each registration)."""
        for pos in range(len(self.uuids)):
            # "records the Xids [and double-bit ECC errors] of device N from now on"
            self.plugin.wait_for_line(f"of device {pos} from now on", after=after)

    def allocate(self, registration: Registration, *indices: int):
        pb2 = self.kubelet.pb2
        request = pb2.AllocateRequest(container_requests=[
            pb2.ContainerAllocateRequest(devices_ids=[self.uuids[i] for i in indices])
        ])
        (response,) = registration.stub.Allocate(request, timeout=WAIT).container_responses
        return response

    def wait_for_engine_config(self, done: Callable[[str], bool]) -> None:
        """Until the daemon has written an engine config that ``done`` accepts."""
        config = self.root / layout.ENGINE_CONFIG.lstrip("/")
        while True:
            # Marked before the check: a pass that ends after the check is
            # still a line after the mark.
            mark = len(self.daemon.lines)
            if done(config.read_text()):
                return
            self.daemon.wait_for_line("reconcile pass ok", after=mark)

    def ctl(self, *args: str) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "mokka", "ctl", *args, "--root", str(self.root)],
            capture_output=True, text=True, env=daemon_env(), timeout=PROCESS_TIMEOUT,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def write_config(path: Path, **plugin_flags: object) -> None:
    """The plugin's config file (``--config-file``), with these ``flags.plugin`` values."""
    path.write_text(json.dumps({"version": "v1", "flags": {"plugin": plugin_flags}}))


def smi_uuids(driver: Path) -> list[str]:
    """``nvidia-smi -L`` (the real 535) on the published driver root: UUIDs by index."""
    result = subprocess.run(
        [str(real_nvidia_smi()), "-L"],
        env={**daemon_env(), "LD_LIBRARY_PATH": str(driver / "usr/lib64")},
        capture_output=True, text=True, timeout=PROCESS_TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    listed = re.findall(r"^GPU (\d+): .* \(UUID: (GPU-[0-9a-f-]+)\)$", result.stdout, re.M)
    assert [int(i) for i, _ in listed] == list(range(len(listed))), result.stdout
    return [uuid for _, uuid in listed]


def mounts_under(path: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if str(path) in line]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    device_plugin_binary()  # fail at once, saying how to get it
    base = tmp_path_factory.mktemp("device-plugin")
    root = base / "node"
    root.mkdir()
    found = snapshot(root)
    pb2, pb2_grpc = compile_api(base)
    daemon = LoggedProcess.spawn(
        [sys.executable, "-m", "mokka", "daemon", "--root", str(root), "--profile", "h100",
         "--health-addr", "127.0.0.1:0", "--node-name", NODE_NAME],
        daemon_env(),
    )
    kubelet = plugin = None
    try:
        daemon.wait_for_line("reconcile pass ok generation=1", PROCESS_TIMEOUT)
        # The plugin's own directories, standing for /var/lib and /run in its namespace.
        var_lib, run = base / "var-lib", base / "run"
        run.mkdir()
        kubelet = Kubelet(pb2, pb2_grpc, var_lib / "kubelet/device-plugins")
        kubelet.start()
        config = base / "plugin-config.json"
        write_config(config, deviceListStrategy=["envvar"], passDeviceSpecs=True)
        plugin = start_plugin(node_root=root, var_lib=var_lib, run=run, config=config,
                              env={**daemon_env(), "MOCK_NVML_DEBUG": "1"})
        registration = kubelet.next_registration()
        registration.wait_updates(1)
        started = Node(base, root, compile_profile("h100", node_name=NODE_NAME), daemon,
                       kubelet, plugin, config, smi_uuids(root / "run/nvidia/driver"),
                       registration)
        started.wait_for_health_loop(after=0)
        yield started
    finally:
        if plugin is not None:
            plugin.stop()
        if kubelet is not None:
            kubelet.stop()
        assert daemon.stop() == 0, "\n".join(daemon.lines[-40:])
    # The plugin's namespace went with it; its socket went at SIGTERM.
    assert mounts_under(base) == []
    assert list(kubelet.directory.iterdir()) == []
    assert list(run.iterdir()) == [], "the envvar and volume-mounts strategies write no CDI spec"
    assert snapshot(root) == found, "the daemon's teardown left the node root changed"
    cleanup = run_mokka("cleanup", "--root", str(root), cwd=base)
    assert cleanup.returncode == 0, cleanup.stdout + cleanup.stderr
    assert snapshot(root) == found


def test_registers_with_the_kubelet(node: Node):
    request = node.registration.request
    assert (request.version, request.resource_name, request.endpoint) == (
        "v1beta1", "nvidia.com/gpu", "nvidia-gpu.sock")
    assert request.options.get_preferred_allocation_available
    assert (node.kubelet.directory / request.endpoint).is_socket()


def test_lists_exactly_the_gpus_nvidia_smi_lists(node: Node):
    assert node.uuids == [gpu.uuid for gpu in node.state.gpus]
    (first, *_) = node.registration.wait_updates(1)
    assert sorted(d.ID for d in first.devices) == sorted(node.uuids)
    assert len(first.devices) == 8
    assert {d.health for d in first.devices} == {"Healthy"}


def test_numa_nodes_come_from_the_pci_tree(node: Node):
    (first, *_) = node.registration.wait_updates(1)
    numa = {d.ID: [n.ID for n in d.topology.nodes] for d in first.devices}
    assert [gpu.numa_node for gpu in node.state.gpus] == H100_NUMA
    assert [numa[uuid] for uuid in node.uuids] == [[n] for n in H100_NUMA]
    # Asked for two GPUs including GPU 4, the plugin picks a partner on its NUMA node.
    pb2 = node.kubelet.pb2
    answer = node.registration.stub.GetPreferredAllocation(
        pb2.PreferredAllocationRequest(container_requests=[
            pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=node.uuids, must_include_deviceIDs=[node.uuids[4]],
                allocation_size=2)
        ]),
        timeout=WAIT,
    )
    (preferred,) = answer.container_responses
    picked = sorted(node.uuids.index(uuid) for uuid in preferred.deviceIDs)
    assert 4 in picked
    assert len(picked) == 2
    assert {H100_NUMA[i] for i in picked} == {1}


def test_allocate_envvar_with_device_specs(node: Node):
    response = node.allocate(node.registration, *REQUESTED)
    assert dict(response.envs) == {
        "NVIDIA_VISIBLE_DEVICES": ",".join(node.uuids[i] for i in REQUESTED)}
    # The control nodes are optional and looked up at the host's /dev, where a
    # Mokka node has none: only the GPUs' own nodes, at the driver root (in
    # the order of the plugin's device map, which Go does not fix).
    assert sorted((d.container_path, d.host_path, d.permissions) for d in response.devices) == [
        (f"/dev/nvidia{node.state.gpus[i].minor}",
         f"{node.driver}/dev/nvidia{node.state.gpus[i].minor}", "rw")
        for i in REQUESTED
    ]
    assert (list(response.mounts), dict(response.annotations), list(response.cdi_devices)) == (
        [], {}, [])


def unhealthy(update) -> set[str]:
    return {d.ID for d in update.devices if d.health != "Healthy"}


def test_critical_xids_mark_exactly_that_gpu_unhealthy(node: Node):
    registration = node.registration
    seen = len(registration.wait_updates(1))
    skipped = len(node.plugin.lines)
    # Xid 13 is an application error: the plugin logs it and skips it.
    node.ctl("xid", "--gpu", "0", "--code", "13")
    node.plugin.wait_for_line("EventData:13", after=skipped)
    expected: set[str] = set()
    latencies = []
    # A failure with a Xid of its own raises exactly that one (one list).
    for gpu, ctl_args in [
        (3, ["xid", "--gpu", "3", "--code", "79"]),
        (1, ["xid", "--gpu", "1", "--code", "48"]),
        (5, ["fail", "--gpu", "5", "--mode", "fallen_off_bus", "--xid", "79"]),
    ]:
        started = time.monotonic()
        node.ctl(*ctl_args)
        try:
            updates = registration.wait_updates(seen + 1, HEALTH_DEADLINE)
        except AssertionError as error:
            error.add_note("plugin log:\n" + "\n".join(node.plugin.lines[skipped:]))
            raise
        latencies.append(time.monotonic() - started)
        seen += 1
        expected.add(node.uuids[gpu])
        assert len(updates) == seen, f"one list per critical Xid, got {len(updates) - seen} more"
        assert unhealthy(updates[-1]) == expected
    assert node.uuids[0] not in expected
    print("ctl to Unhealthy list, s:", [round(s, 2) for s in latencies])
    # A lost GPU fails the plugin's next start-up (its MIG mode query), as on a
    # real node: heal it, and let the daemon recompile, before the next test
    # restarts the plugin.
    node.ctl("reset")
    node.wait_for_engine_config(lambda text: "fallen_off_bus" not in text)


def test_allocate_volume_mounts(node: Node):
    registration = node.reconfigure(deviceListStrategy=["volume-mounts"], passDeviceSpecs=False)
    # A restarted plugin starts from a healthy list (the health test's marks went).
    assert sorted(d.ID for d in registration.updates[0].devices) == sorted(node.uuids)
    assert unhealthy(registration.updates[0]) == set()
    response = node.allocate(registration, *REQUESTED)
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert [(m.container_path, m.host_path, m.read_only) for m in response.mounts] == [
        (f"/var/run/nvidia-container-devices/{node.uuids[i]}", "/dev/null", False)
        for i in REQUESTED
    ]
    assert (list(response.devices), dict(response.annotations)) == ([], {})


def test_health_after_a_restart(node: Node):
    # Restarted by SIGHUP: the stopped health loop's event set is still
    # waiting when the Xid comes, and must not take it from the new loop's.
    registration = node.reconfigure(deviceListStrategy=["envvar"], passDeviceSpecs=True)
    seen = len(registration.wait_updates(1))
    assert unhealthy(registration.updates[0]) == set()
    skipped = len(node.plugin.lines)
    expected: set[str] = set()
    for gpu, ctl_args in [
        (3, ["xid", "--gpu", "3", "--code", "79"]),
        # A GPU that falls off the bus raises Xid 79 by itself, as on a real node.
        (6, ["fail", "--gpu", "6", "--mode", "fallen_off_bus"]),
    ]:
        node.ctl(*ctl_args)
        try:
            updates = registration.wait_updates(seen + 1, HEALTH_DEADLINE)
        except AssertionError as error:
            error.add_note("plugin log:\n" + "\n".join(node.plugin.lines[skipped:]))
            raise
        seen += 1
        expected.add(node.uuids[gpu])
        assert len(updates) == seen, f"one list per critical Xid, got {len(updates) - seen} more"
        assert unhealthy(updates[-1]) == expected
    node.plugin.wait_for_line("Xid=79 on Device=" + node.uuids[6], after=skipped)
    # Healed before the next plugin start (see the health test above).
    node.ctl("reset")
    node.wait_for_engine_config(lambda text: "fallen_off_bus" not in text)


def test_allocate_cdi_annotations(node: Node):
    # Its own plugin and kubelet: a plugin that cannot generate its spec exits,
    # and the module's plugin must live on for the health test.
    base = node.base / "cdi"
    run = base / "run"
    run.mkdir(parents=True)
    config = base / "plugin-config.json"
    write_config(config, deviceListStrategy=["cdi-annotations"], passDeviceSpecs=True)
    kubelet = Kubelet(node.kubelet.pb2, node.kubelet.pb2_grpc,
                      base / "var-lib/kubelet/device-plugins")
    kubelet.start()
    # The driver read from the directory itself, as the plugin's container sees
    # its mount: through the node's run/nvidia/driver link, nvcdi drops every
    # library (kubelet_support.start_plugin says why).
    plugin = start_plugin(node_root=node.root, var_lib=base / "var-lib", run=run,
                          config=config, env=daemon_env(),
                          driver_root_ctr=driver_root_directory(node.root))
    try:
        # Ends at once, failing, when the plugin exits instead (as it did
        # before the driver root had libcuda.so.<driver version>).
        plugin.wait_for_line("Registered device plugin for 'nvidia.com/gpu'")
        registration = kubelet.next_registration()
        response = node.allocate(registration, *REQUESTED)
    finally:
        plugin.stop()
        kubelet.stop()
    vendor = "k8s.device-plugin.nvidia.com/gpu"
    ((key, value),) = response.annotations.items()
    assert re.fullmatch(r"cdi\.k8s\.io/nvidia-device-plugin_[0-9a-f-]{36}", key), key
    assert value == ",".join(f"{vendor}={node.uuids[i]}" for i in REQUESTED)
    # Every strategy is CDI: the plugin answers with the annotation alone.
    assert (dict(response.envs), list(response.mounts), list(response.devices)) == ({}, [], [])
    spec = json.loads((run / "cdi" / PLUGIN_SPEC).read_text())
    names = {device["name"]: device for device in spec["devices"]}
    for i in REQUESTED:
        nodes = names[node.uuids[i]]["containerEdits"]["deviceNodes"]
        assert {"path": f"/dev/nvidia{node.state.gpus[i].minor}",
                "hostPath": f"{node.driver}/dev/nvidia{node.state.gpus[i].minor}"}.items() <= (
            nodes[0].items())
    # The driver's libraries, named at the host's driver root (--driver-root), and
    # the engine config's socket: NVML works in a container from this spec alone.
    version = node.state.system.driver_version
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    for library in (f"libnvidia-ml.so.{version}", f"libcuda.so.{version}"):
        assert mounts.get(f"/usr/lib64/{library}") == f"{node.driver}/usr/lib64/{library}", mounts
    assert mounts.get("/usr/bin/nvidia-smi") == f"{node.driver}/usr/bin/nvidia-smi", mounts
    assert mounts.get("/run/nvidia-persistenced/socket") == (
        f"{node.driver}/run/nvidia-persistenced/socket"), mounts
