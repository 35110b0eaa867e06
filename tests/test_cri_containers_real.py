"""Containers through CRI: crictl, a real containerd, runc and the real NVIDIA toolkit.

Per containerd series (2.1 and 1.7, at the releases ``scripts/install-consumers``
pins: one module-scoped containerd each, several containers):
a Mokka h100 node is staged with ``mokka daemon --once`` and the real NVIDIA
Container Toolkit v1.20.2, so the drop-in is what the real ``nvidia-ctk``
wrote over the version's packaged main config; the test's own containerd
reads that config in a private mount namespace where the node's files sit
at their host paths (``tests.containerd_support.Containerd``).  The
``nvidia`` handler, the default, runs the real ``nvidia-container-runtime``
in CDI mode: it turns ``NVIDIA_VISIBLE_DEVICES`` into ``nvidia.com/gpu``
devices of Mokka's spec; containerd itself injects CRI's CDI devices.
Inside, the real ``nvidia-smi`` 535 and the mock NVML library (both from
the spec) must see exactly the GPUs the container asked for.

The image is built here: a static busybox and the glibc files the real
``nvidia-smi`` and the mock library load, imported with ``ctr``.

This VM refuses ``oom_score_adj=-998``, which CRI gives every pod sandbox:
the main config sets ``restrict_oom_score_adj = true``
(``tests.containerd_support.main_config``).
"""

from __future__ import annotations

import filecmp
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from mokka.simulators.cri.mainconfig import MARK
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.containerd_support import Container, Containerd, cleanup_node, per_series, staged_node
from tests.support import ROOT, snapshot

#: The ``sed`` docs/cri.md and docs/operations.md give for the marked
#: ``imports`` line a killed daemon (or ``--once``) leaves behind.
DOCUMENTED_SED = (
    "/# mokka: containerd drop-in directory, removed at teardown$/d; s/^# mokka: was: //")

pytestmark = pytest.mark.timeout(180)

#: What every container prints: its device nodes, the libraries the spec
#: mounts, and what the real nvidia-smi lists (when the spec mounted one).
SCRIPT = (
    'echo "== dev"; ls /dev; '
    'echo "== lib"; ls /usr/lib64 2>/dev/null; '
    'echo "== smi"; if [ -e /usr/bin/nvidia-smi ]; then nvidia-smi -L 2>&1; echo "exit=$?"; '
    "else echo absent; fi"
)
#: The control nodes every GPU container gets beside its GPUs (the spec's global edits).
CONTROLS = ["nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]


@attrs.define(eq=False)
class Node:
    """One staged node and the containerd running on it."""

    root: Path
    state: State
    containerd: Containerd
    #: the node root as seeded, before ``mokka daemon --once``
    before: dict
    seeded_config: str
    #: a pod sandbox on the default (``nvidia``) handler
    pod: str = ""
    #: what teardown had to force, once it ran
    forced: list[str] | None = None

    def run(self, name: str, **kwargs) -> Container:
        return self.containerd.run_container(self.pod, "gpus", name, SCRIPT, **kwargs)

    def close(self) -> list[str]:
        """Stop containerd, then ``mokka cleanup`` (idempotent); what had to be forced."""
        if self.forced is None:
            self.forced = self.containerd.stop()
            cleanup_node(self.root)
        return self.forced


@per_series
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    version = request.param
    staged = staged_node(version, tmp_path_factory.mktemp(f"cri-{version}"))
    node = Node(
        root=staged.root,
        state=compile_profile("h100", node_name="node-a"),
        containerd=staged.containerd,
        before=staged.before,
        seeded_config=staged.seeded_config,
    )
    try:
        node.containerd.start()
        node.containerd.import_image(staged.image)
        node.pod = node.containerd.run_pod("gpus")
        yield node
    finally:
        node.close()


def assert_gpus(container: Container, state: State, indices: list[int]) -> None:
    """Exactly these GPUs' device nodes, and nvidia-smi lists exactly them, in order."""
    assert container.exit_code == 0, container.sections
    gpus = [state.gpu(i) for i in indices]
    assert container.nvidia_nodes() == sorted([*(f"nvidia{g.minor}" for g in gpus), *CONTROLS])
    assert container.sections["smi"] == [
        *(f"GPU {n}: {g.name} (UUID: {g.uuid})" for n, g in enumerate(gpus)), "exit=0",
    ]


def assert_no_gpu(container: Container) -> None:
    assert container.exit_code == 0, container.sections
    assert container.nvidia_nodes() == []
    assert "libnvidia-ml.so.1" not in container.sections["lib"]
    assert container.sections["smi"] == ["absent"]


def test_nvidia_is_the_default_handler_and_runs_the_real_runtime(node: Node) -> None:
    config = json.loads(node.containerd.crictl("info").stdout)["config"]
    assert config["containerd"]["defaultRuntimeName"] == "nvidia"
    binary = config["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"]
    assert binary == "/usr/bin/nvidia-container-runtime"
    assert config["enableCDI"] is True
    # The main config's CRI settings reach containerd through the drop-in.
    assert config["restrictOOMScoreAdj"] is True
    # As containerd resolves it (the node's link into the installed toolkit),
    # the handler's binary is the toolkit release's runtime itself.
    toolkit = node.containerd.components.toolkit_dir / "nvidia-container-runtime"
    assert filecmp.cmp(node.containerd.in_namespace(binary), toolkit, shallow=False)


def test_visible_devices_by_index(node: Node) -> None:
    container = node.run("index", env={"NVIDIA_VISIBLE_DEVICES": "0"})
    assert_gpus(container, node.state, [0])
    assert "libnvidia-ml.so.1" in container.sections["lib"]


def test_visible_devices_by_uuid(node: Node) -> None:
    container = node.run("uuid", env={"NVIDIA_VISIBLE_DEVICES": node.state.gpu(5).uuid})
    assert_gpus(container, node.state, [5])


def test_visible_devices_list(node: Node) -> None:
    assert_gpus(node.run("list", env={"NVIDIA_VISIBLE_DEVICES": "1,3"}), node.state, [1, 3])


def test_cdi_devices_from_cri(node: Node) -> None:
    """containerd's own CDI injection: CRI's CDI devices field, and the annotation."""
    assert_gpus(node.run("field", cdi_devices=["nvidia.com/gpu=2"]), node.state, [2])
    container = node.run("annotation", annotations={"cdi.k8s.io/test": "nvidia.com/gpu=4"})
    assert_gpus(container, node.state, [4])


def test_container_that_asked_for_nothing_gets_no_gpu(node: Node) -> None:
    assert_no_gpu(node.run("nothing"))


def test_runc_handler_ignores_visible_devices(node: Node) -> None:
    """The env variable means GPUs only to the ``nvidia`` runtime: ``runc`` stays a
    handler beside it and gives none."""
    pod = node.containerd.run_pod("plain", handler="runc")
    container = node.containerd.run_container(
        pod, "plain", "all", SCRIPT, env={"NVIDIA_VISIBLE_DEVICES": "all"}
    )
    assert_no_gpu(container)


def test_stop_and_cleanup_leave_nothing(node: Node) -> None:
    """containerd stops with nothing to force; ``mokka cleanup`` leaves the node as seeded.

    The one thing ``mokka cleanup`` leaves after ``--once`` (no teardown ran)
    is the marked ``imports`` line in the main config; the ``sed`` that
    docs/cri.md gives for it brings back the seeded bytes exactly.
    """
    assert node.close() == []
    assert node.containerd.mounts_below() == []
    assert node.containerd.cgroups() == []
    after = snapshot(node.root)
    changed = {p for p in node.before.keys() | after.keys() if node.before.get(p) != after.get(p)}
    assert changed <= {"etc/containerd/config.toml"}
    config = node.root / "etc/containerd/config.toml"
    assert config.read_text() == (f'imports = ["/etc/containerd/conf.d/*.toml"]  {MARK}\n'
                                  + node.seeded_config)
    for doc in ("docs/cri.md", "docs/operations.md"):
        assert f"sed -i '{DOCUMENTED_SED}'" in (ROOT / doc).read_text(), doc
    subprocess.run(["sed", "-i", DOCUMENTED_SED, str(config)], check=True, timeout=30)
    assert config.read_text() == node.seeded_config
