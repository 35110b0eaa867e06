"""What the nri simulator injects, seen from inside containers of the real containerd.

Per containerd series (2.1 and 1.7): a Mokka h100 node staged as in
``tests/test_nri_containerd.py``, the test's own containerd in a private
mount namespace (where the node's ``/var/lib/nvml-mock`` sits at its node
path), and ``NriSimulator`` in a process of its own
(``tests.nri_daemon_support``) on the namespace's NRI socket.  crictl
creates the containers, runc runs them; the assertions are on what the
containers print.

This VM refuses ``oom_score_adj=-998``, which CRI gives every pod sandbox:
the main config sets ``restrict_oom_score_adj = true``
(``tests.containerd_support.main_config``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from mokka.simulators.nri.view import plan_gpus
from mokka.state.compile import compile_profile
from tests.containerd_support import IMAGE, Containerd, cleanup_node, per_series, staged_node
from tests.daemon_support import daemon_env
from tests.gpudriver_support import toolkit_binary
from tests.kubelet_support import (
    DEVICE_PLUGIN_PATH,
    PLUGIN_CDI_KIND,
    Kubelet,
    compile_api,
    device_plugin_binary,
    plugin_cdi_spec,
)
from tests.nri_daemon_support import NriDaemonProcess

pytestmark = pytest.mark.timeout(300)

STATE = compile_profile("h100", node_name="node-a", generation=1)
GPU0, GPU1 = STATE.gpu(0), STATE.gpu(1)
BUS = "/sys/bus/pci/devices"
SCRIPT = (
    f"echo == class; cat {BUS}/{GPU1.bus_id}/class 2>&1;"
    f" echo == numa; cat {BUS}/{GPU1.bus_id}/numa_node 2>&1;"
    f" echo == bus; ls {BUS};"
    " echo == config; echo $MOCK_NVML_CONFIG;"
    " echo == smi; nvidia-smi -L 2>&1; true"
)


#: Vendor of the spec ``nvidia-ctk cdi generate`` writes here: Mokka's own
#: spec has ``nvidia.com``, and two specs may not define one device.
TOOLKIT_VENDOR = "toolkit.nvidia.com"


def generate_toolkit_spec(root: Path) -> None:
    """The real ``nvidia-ctk cdi generate`` on the node's driver root, into its CDI directory."""
    driver_root = root / "var/lib/nvml-mock/driver"
    done = subprocess.run(
        [str(toolkit_binary("nvidia-ctk")), "cdi", "generate", "--driver-root", str(driver_root),
         "--nvidia-cdi-hook-path", str(toolkit_binary("nvidia-cdi-hook")),
         "--vendor", TOOLKIT_VENDOR, "--output", str(root / "var/run/cdi/toolkit.yaml")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr


#: Where the device plugin's own spec goes on the node (its file name in /var/run/cdi).
PLUGIN_SPEC_ON_NODE = "var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json"


def install_device_plugin_spec(root: Path, base: Path) -> Path:
    """The real device plugin's own CDI spec (``cdi-annotations``) for the node, in
    the node's CDI directory, as the plugin's DaemonSet leaves it there."""
    spec = plugin_cdi_spec(node_root=root, base=base, env=daemon_env())
    installed = root / PLUGIN_SPEC_ON_NODE
    installed.write_bytes(spec.read_bytes())
    return installed


@attrs.define
class Node:
    containerd: Containerd
    daemon: NriDaemonProcess
    pod: str = ""

    def run(self, name: str, **kwargs):
        return self.containerd.run_container(self.pod, "nri", name, SCRIPT, **kwargs)


@per_series
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    version = request.param
    base = tmp_path_factory.mktemp(f"nri-real-{version}")
    staged = staged_node(version, base)
    root, containerd = staged.root, staged.containerd
    link = base / "nri.sock"
    generate_toolkit_spec(root)
    plugin_spec = install_device_plugin_spec(root, base / "device-plugin")
    node = Node(containerd, NriDaemonProcess(link, base / "daemon", (str(root),)))
    try:
        containerd.start()
        containerd.link_nri_socket(link)
        containerd.import_image(staged.image)
        node.pod = containerd.run_pod("nri")
        node.daemon.start()
        node.daemon.wait_for("configured by containerd")
        yield node
    finally:
        node.daemon.kill()
        forced = containerd.stop()
        plugin_spec.unlink()
        cleanup_node(root)
        assert forced == [], forced


def test_a_cdi_request_for_gpu_1_sees_exactly_its_sysfs_entry(node: Node) -> None:
    result = node.run("gpu1", cdi_devices=["nvidia.com/gpu=1"])
    assert result.exit_code == 0, result
    assert result.sections["class"] == ["0x030200"]
    assert result.sections["numa"] == [str(GPU1.numa_node)]
    assert result.sections["bus"] == [GPU1.bus_id]  # GPU 0's bdf is absent
    assert GPU0.bus_id not in result.sections["bus"]
    smi = result.sections["smi"]
    assert any(line.startswith("GPU ") for line in smi), smi


def test_nvidia_visible_devices_alone_gets_the_gpus_sysfs(node: Node) -> None:
    result = node.run("nvd", env={"NVIDIA_VISIBLE_DEVICES": f"{GPU1.uuid},0"})
    assert result.exit_code == 0, result
    assert result.sections["bus"] == sorted([GPU0.bus_id, GPU1.bus_id])
    assert result.sections["class"] == ["0x030200"]
    assert result.sections["config"] == ["/var/lib/nvml-mock/driver/config/config.yaml"]


def test_a_container_with_no_gpu_gets_nothing(node: Node) -> None:
    result = node.run("plain")
    assert result.exit_code == 0, result
    assert GPU1.bus_id not in result.sections["bus"]
    assert "No such file" in " ".join(result.sections["class"])
    assert result.sections["config"] == [""]
    assert not any(line.startswith("GPU ") for line in result.sections["smi"])


def test_a_spec_nvidia_ctk_wrote_gets_working_nvml(node: Node) -> None:
    """The toolkit's spec has no engine config; the plugin adds it (and GPU 1's sysfs)."""
    result = node.run("toolkit", cdi_devices=[f"{TOOLKIT_VENDOR}/gpu=1"])
    assert result.exit_code == 0, result
    assert result.sections["bus"] == [GPU1.bus_id]
    assert result.sections["config"] == ["/var/lib/nvml-mock/driver/config/config.yaml"]
    smi = result.sections["smi"]
    assert any(GPU1.uuid in line for line in smi), smi


def test_the_device_plugins_own_spec_gets_working_nvml(node: Node) -> None:
    """The spec the real plugin writes under ``cdi-annotations`` mounts the driver's
    libraries (the plugin reads the driver root as its container sees it); the
    plugin adds the engine config and GPU 1's sysfs."""
    result = node.run("plugin-spec", cdi_devices=[f"{PLUGIN_CDI_KIND}={GPU1.uuid}"])
    assert result.exit_code == 0, result
    assert result.sections["bus"] == [GPU1.bus_id]
    assert result.sections["class"] == ["0x030200"]
    assert result.sections["smi"] == [f"GPU 0: {GPU1.name} (UUID: {GPU1.uuid})"]


def test_a_config_change_reaches_nvml_in_a_running_container_within_a_second(
    node: Node,
) -> None:
    """As the gpudriver simulator writes one: the new file renamed into place, the
    change notice bumped in place; the container has the directory, so sees both."""
    root = node.daemon.args[0]
    config = Path(root) / "var/lib/nvml-mock/driver/config/config.yaml"
    notice = config.with_name("generation")
    original = config.read_bytes()
    # GPU 1 is the container's only GPU: its index 0 there.
    key = b"device.1.thermal.temperature_gpu_c: "
    assert key + b"88\n" not in original
    loop = ('i=0; while [ $i -lt 3000 ]; do t=$(nvidia-smi --query-gpu=temperature.gpu '
            '--format=csv,noheader -i 0); echo "T $t"; [ "$t" = 88 ] && exit 0; '
            'i=$((i+1)); done; exit 1')
    containerd = node.containerd
    path = containerd.base / "container-nri-follow.json"
    path.write_text(json.dumps({
        "metadata": {"name": "follow"}, "image": {"image": IMAGE},
        "command": ["/bin/sh", "-c", loop], "log_path": "follow.log",
        "CDI_devices": [{"name": f"{TOOLKIT_VENDOR}/gpu=1"}],
    }))
    log = containerd.base / "logs" / "nri" / "follow.log"
    cid = containerd.crictl("create", node.pod, str(path),
                            str(containerd.base / "pod-nri.json")).stdout.strip()
    try:
        containerd.crictl("start", cid)
        wait_for_log(log, "T ")  # NVML answers from the config it has
        changed = time.monotonic()
        # As `mokka ctl temp` leaves it: the value, pinned (else it moves with a lag).
        pinned = re.sub(rb"(" + re.escape(key) + rb")\d+",
                        rb"\g<1>88\ndevice.1.pinned.thermal.temperature_gpu_c: true",
                        original, count=1)
        rewrite(config, notice, pinned)
        wait_for_log(log, "T 88")
        assert time.monotonic() - changed < 1.0, log.read_text()
    finally:
        rewrite(config, notice, original)
        containerd.remove(cid)


def rewrite(config: Path, notice: Path, content: bytes) -> None:
    """The engine config replaced by rename and the change notice bumped in place."""
    tmp = config.with_name(".config.yaml.test-tmp")
    tmp.write_bytes(content)
    os.chmod(tmp, config.stat().st_mode & 0o7777)
    tmp.rename(config)
    with notice.open("r+b") as counter:
        value = int.from_bytes(counter.read(8), "little")
        counter.seek(0)
        counter.write((value + 1).to_bytes(8, "little"))


def wait_for_log(log: Path, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not (log.exists() and text in log.read_text(errors="replace")):
        assert time.monotonic() < deadline, (
            f"{text!r} not in {log}:\n" + (log.read_text()[-2000:] if log.exists() else ""))
        time.sleep(0.01)


def test_a_mount_of_the_driver_root_sees_every_gpu(node: Node) -> None:
    """As the device plugin's and GFD's DaemonSets mount it (no GPU request at all)."""
    result = node.run("daemonset", mounts=[("/var/lib/nvml-mock/driver", "/driver-root")])
    assert result.exit_code == 0, result
    assert result.sections["bus"] == sorted(
        [g.bus_id for g in STATE.gpus] + [s.bdf for s in STATE.nvlink.switches])
    assert result.sections["class"] == ["0x030200"]
    assert result.sections["numa"] == [str(GPU1.numa_node)]


def test_the_annotation_opts_a_container_in_to_nvidia_smi(node: Node) -> None:
    result = node.run("ambient", annotations={"mokka.io/nri": "on"})
    assert result.exit_code == 0, result
    smi = result.sections["smi"]
    assert sum(line.startswith("GPU ") for line in smi) == len(STATE.gpus), smi
    assert GPU1.bus_id not in result.sections["bus"]  # no GPU: no sysfs entry


def test_the_daemon_stopped_containers_still_start(node: Node) -> None:
    assert node.daemon.stop() == 0
    assert node.daemon.lines("nri daemon: stopped") == 1
    try:
        result = node.run("after-stop", cdi_devices=["nvidia.com/gpu=1"])
        assert result.exit_code == 0, result
        assert result.sections["bus"] != [GPU1.bus_id]  # nothing injected
    finally:
        node.daemon.start()
        node.daemon.wait_for("configured by containerd", 2)


def test_the_device_plugin_in_its_container_reports_each_gpus_numa_node(
    node: Node, tmp_path: Path
) -> None:
    """The real plugin as its DaemonSet runs it: in a container that mounts the driver
    root at ``/driver-root`` (so the plugin sees every GPU's sysfs entry), NVML from
    there (the ``nvidia`` runtime puts the library on the path on a real node), the
    kubelet's directory writable.  Go reads ``numa_node`` itself; each GPU's
    ``Topology`` must be its profile NUMA node."""
    pb2, pb2_grpc = compile_api(tmp_path)
    kubelet = Kubelet(pb2, pb2_grpc, tmp_path / "device-plugins")
    kubelet.start()
    binary = device_plugin_binary()
    cid = node.containerd.start_container(
        node.pod, "nri", "device-plugin",
        ["/usr/bin/nvidia-device-plugin", "--driver-root=/var/lib/nvml-mock/driver",
         "--fail-on-init-error=true"],
        env={"LD_LIBRARY_PATH": "/driver-root/usr/lib64"},
        mounts=[("/var/lib/nvml-mock/driver", "/driver-root"),
                (str(binary.resolve()), "/usr/bin/nvidia-device-plugin")],
        writable_mounts=[(str(kubelet.directory), DEVICE_PLUGIN_PATH)],
    )
    try:
        try:
            registration = kubelet.next_registration()
            (first, *_) = registration.wait_updates(1)
        except AssertionError as error:
            error.add_note("plugin log:\n" + "\n".join(
                node.containerd.log_lines("nri", "device-plugin")[-40:]))
            raise
        numa = {d.ID: [n.ID for n in d.topology.nodes] for d in first.devices}
        assert numa == {gpu.uuid: [gpu.numa_node] for gpu in STATE.gpus}
        assert {gpu.numa_node for gpu in STATE.gpus} == {0, 1}
    finally:
        # SIGTERM first: the plugin removes its socket then.
        node.containerd.crictl("stop", "--timeout", "10", cid, check=False)
        node.containerd.remove(cid)
        kubelet.stop()
    assert list(kubelet.directory.iterdir()) == [], "the plugin removes its socket at SIGTERM"


#: What a DRA driver's ``pcieRoot`` lookup reads (Kubernetes'
#: ``deviceattribute``: the link's text, its first component below
#: ``/sys/devices``), the chain it resolves to, and what else sits there.
SYS_SCRIPT = (
    f"echo == target; /bin/busybox readlink {BUS}/{GPU1.bus_id};"
    f" echo == link; /bin/busybox readlink -f {BUS}/{GPU1.bus_id};"
    f" echo == numa; cat {BUS}/{GPU1.bus_id}/numa_node 2>&1;"
    f" echo == bus; ls {BUS};"
    " echo == devices; ls /sys/devices;"
    " echo == node0; ls -d /sys/devices/system/node/node0 2>&1; true"
)


def test_sys_devices_resolves_a_gpus_bus_link_to_its_staged_chain(
    node: Node, tmp_path: Path
) -> None:
    """``--nri-sys-devices``: GPU 1's bus entry is a link to its root complex and
    switch port as the profile places it, the node's own ``/sys/devices`` stays
    (NUMA topology included), a container without GPUs is unchanged; off (the
    module's daemon) the bus entry is a directory of its own."""
    containerd = node.containerd
    gpu1_path = next(g.sysfs_path for g in plan_gpus(STATE)[0] if g.index == 1)
    _, root_complex, port, _ = gpu1_path.split("/")
    assert root_complex == GPU1.root_complex
    host_devices = sorted(os.listdir("/sys/devices"))
    off = containerd.run_container(node.pod, "nri", "sysdev-off", SYS_SCRIPT,
                                   cdi_devices=["nvidia.com/gpu=1"])
    assert off.sections["link"] == [f"{BUS}/{GPU1.bus_id}"]  # no link to follow
    assert off.sections["devices"] == host_devices

    root = Path(node.daemon.args[0])
    links = root / "var/lib/nvml-mock/nri/pci-devices"
    assert not links.exists()  # off: nothing staged
    assert node.daemon.stop() == 0
    sys_devices = NriDaemonProcess(node.daemon.socket, tmp_path / "daemon",
                                   (str(root), "--sys-devices"))
    restarts = node.daemon.lines("configured by containerd")
    try:
        sys_devices.start()
        sys_devices.wait_for("configured by containerd")
        assert links.is_dir()
        gpu = containerd.run_container(node.pod, "nri", "sysdev-gpu1", SYS_SCRIPT,
                                       cdi_devices=["nvidia.com/gpu=1"])
        plain = containerd.run_container(node.pod, "nri", "sysdev-plain", SYS_SCRIPT)
    finally:
        assert sys_devices.stop() == 0
        node.daemon.start()
        node.daemon.wait_for("configured by containerd", restarts + 1)
    assert not links.exists()  # its teardown took the link directories away
    assert gpu.exit_code == 0, gpu
    assert gpu.sections["target"] == [f"../../../{gpu1_path}"]  # as a real node's bus has it
    assert gpu.sections["link"] == [f"/sys/{gpu1_path}"]
    assert gpu.sections["numa"] == [str(GPU1.numa_node)]
    assert gpu.sections["bus"] == sorted([GPU1.bus_id, port])  # GPU 0 absent
    assert gpu.sections["devices"] == sorted({*host_devices, root_complex})
    assert gpu.sections["node0"] == ["/sys/devices/system/node/node0"]
    assert plain.exit_code == 0, plain
    assert plain.sections["devices"] == host_devices
    assert GPU1.bus_id not in plain.sections["bus"]
    assert plain.sections["node0"] == ["/sys/devices/system/node/node0"]
