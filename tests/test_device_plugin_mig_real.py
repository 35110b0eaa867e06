"""The real NVIDIA device plugin's MIG strategies (k8s-device-plugin v0.17.4)
against a Mokka node whose profile declares a MIG layout.

One real ``mokka daemon`` stages an h100 node whose eight GPUs boot with
seven 1g.10gb MIG devices each (``mig.layout: [7x1g.10gb]``); the plugin
runs as ``tests/kubelet_support.py`` runs it, its mount namespace also
binding the driver root's ``proc/driver`` over ``/proc/driver``, where the
plugin reads the MIG capabilities' minors (``nvidia-caps/mig-minors``) as on
a real host.  With ``--mig-strategy=mixed`` it advertises
``nvidia.com/mig-1g.10gb``, one device per MIG device, named by its
``MIG-`` UUID; with ``single``, ``nvidia.com/gpu``, one per MIG device.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.daemon_support import PROCESS_TIMEOUT, daemon_env, run_mokka
from tests.kubelet_support import (
    Kubelet,
    LoggedProcess,
    compile_api,
    device_plugin_binary,
    driver_root_directory,
)
from tests.support import real_nvidia_smi, snapshot
from tests.test_mig_devices import _declaring_profile

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(120)]

#: MIG devices the declared layout gives each of the eight GPUs.
PER_GPU = 7


@attrs.define(eq=False)
class MigNode:
    base: Path
    root: Path
    kubelet: Kubelet
    #: the MIG devices' UUIDs, as the real nvidia-smi lists them
    mig_uuids: list[str]


def start_plugin(node: MigNode, strategy: str) -> LoggedProcess:
    """The plugin as ``kubelet_support.start_plugin`` runs it, with ``/proc/driver``
    the driver root's, and ``--mig-strategy``."""
    driver = driver_root_directory(node.root)
    sys_root = node.root / "var/lib/nvml-mock/sys"
    binds = [(sys_root / "bus/pci", "/sys/bus/pci"), (sys_root / "devices", "/sys/devices"),
             (node.base / "var-lib", "/var/lib"), (node.base / "run", "/run"),
             (driver / "proc/driver", "/proc/driver")]
    script = " && ".join(f'mount --bind "{src}" "{dst}"' for src, dst in binds)
    argv = ["unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", f'{script} && exec "$0" "$@"', str(device_plugin_binary()),
            f"--driver-root={driver}", f"--driver-root-ctr-path={driver}",
            "--fail-on-init-error=true", f"--mig-strategy={strategy}"]
    return LoggedProcess.spawn(argv, {**daemon_env(), "LD_LIBRARY_PATH": str(driver / "usr/lib64")})


def smi_mig_uuids(root: Path) -> list[str]:
    result = subprocess.run(
        [str(real_nvidia_smi()), "-L"],
        env={**daemon_env(), "LD_LIBRARY_PATH": str(driver_root_directory(root) / "usr/lib64")},
        capture_output=True, text=True, timeout=PROCESS_TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return re.findall(r"^  MIG 1g\.10gb\s+Device\s+\d: \(UUID: (MIG-[0-9a-f-]{36})\)$",
                      result.stdout, re.M)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MigNode]:
    device_plugin_binary()  # fail at once, saying how to get it
    base = tmp_path_factory.mktemp("device-plugin-mig")
    root = base / "node"
    root.mkdir()
    (base / "run").mkdir()
    found = snapshot(root)
    profile = _declaring_profile(base, ["7x1g.10gb"], gpus=8)
    pb2, pb2_grpc = compile_api(base)
    daemon = LoggedProcess.spawn(
        [sys.executable, "-m", "mokka", "daemon", "--root", str(root), "--profile", str(profile),
         "--health-addr", "127.0.0.1:0", "--node-name", "dp-mig-node"],
        daemon_env(),
    )
    kubelet = None
    try:
        daemon.wait_for_line("reconcile pass ok generation=1", PROCESS_TIMEOUT)
        kubelet = Kubelet(pb2, pb2_grpc, base / "var-lib/kubelet/device-plugins")
        kubelet.start()
        uuids = smi_mig_uuids(root)
        assert len(uuids) == 8 * PER_GPU
        yield MigNode(base, root, kubelet, uuids)
    finally:
        if kubelet is not None:
            kubelet.stop()
        assert daemon.stop() == 0, "\n".join(daemon.lines[-40:])
    assert snapshot(root) == found, "the daemon's teardown left the node root changed"
    cleanup = run_mokka("cleanup", "--root", str(root), cwd=base)
    assert cleanup.returncode == 0, cleanup.stdout + cleanup.stderr


def advertised(node: MigNode, strategy: str) -> dict[str, list[str]]:
    """Resource name → device ids of every registration the plugin makes."""
    plugin = start_plugin(node, strategy)
    try:
        registration = node.kubelet.next_registration()
        (update,) = registration.wait_updates(1)
        return {registration.request.resource_name: sorted(d.ID for d in update.devices)}
    except AssertionError as error:
        error.add_note("plugin log:\n" + "\n".join(plugin.lines[-40:]))
        raise
    finally:
        plugin.stop()


def test_mixed_strategy_advertises_each_mig_profile(node: MigNode) -> None:
    assert advertised(node, "mixed") == {"nvidia.com/mig-1g.10gb": sorted(node.mig_uuids)}


def test_single_strategy_advertises_each_mig_device_as_a_gpu(node: MigNode) -> None:
    assert advertised(node, "single") == {"nvidia.com/gpu": sorted(node.mig_uuids)}
