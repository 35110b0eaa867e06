"""The NRI plugin's connection against the real containerd: register, adjust, come back.

Per containerd series (2.1 and 1.7): a Mokka h100 node staged as in
``tests/test_cri_containers_real.py`` (its drop-in turns NRI on at
``/var/run/nri/nri.sock``), the test's own containerd in a private mount
namespace, and the plugin in a process of its own (``tests.nri_support``),
connected to the socket through a link to the namespace's ``/run`` (so the
link, not the plugin, follows a restarted containerd).  crictl creates the
containers; what the plugin records and what the container prints are what
the tests assert on.

This VM refuses ``oom_score_adj=-998``, which CRI gives every pod sandbox:
the main config sets ``restrict_oom_score_adj = true``
(``tests.containerd_support.main_config``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.containerd_support import Containerd, cleanup_node, per_series, staged_node
from tests.nri_support import INDEX, NAME, PluginProcess
from tests.support import snapshot

pytestmark = pytest.mark.timeout(300)

#: What the plugin adds to every container (but ``fail-*`` and ``slow-*`` ones).
ENV = "MOKKA_NRI_TEST=adjusted"
MOUNTED = "/mokka-nri/hello"
#: An env value that makes the answer larger than the runtime's 4 KiB read
#: buffer: it must arrive in pieces (``ttrpc.SEND_CHUNK``).
BIG = "MOKKA_NRI_BIG=" + "x" * 6000
#: A container's script: the adjustment's two traces, one section each.
SCRIPT = (
    f"echo == env; echo $MOKKA_NRI_TEST; echo == mount; cat {MOUNTED} 2>&1; "
    "echo == big; echo ${#MOKKA_NRI_BIG}"
)


@attrs.define
class Node:
    containerd: Containerd
    plugin: PluginProcess
    link: Path
    image: Path
    #: the node's files as seeded, before ``mokka daemon --once``
    before: dict
    pod: str = ""
    #: what teardown had to force, once it ran
    forced: list[str] | None = None

    def close(self) -> list[str]:
        """Stop the plugin and containerd, then ``mokka cleanup`` (idempotent)."""
        if self.forced is None:
            self.plugin.kill()
            self.forced = self.containerd.stop()
            cleanup_node(self.containerd.node_root)
        return self.forced

    def start_containerd(self) -> None:
        self.containerd.start()
        self.containerd.link_nri_socket(self.link)
        self.containerd.import_image(self.image)
        self.pod = self.containerd.run_pod("nri")

    def run(self, name: str, **kwargs):
        return self.containerd.run_container(self.pod, "nri", name, SCRIPT, **kwargs)


@per_series
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    version = request.param
    base = tmp_path_factory.mktemp(f"nri-{version}")
    staged = staged_node(version, base)
    (base / "share").mkdir()
    (base / "share/hello").write_text("mounted by the plugin\n")
    link = base / "nri.sock"
    plugin = PluginProcess(
        link, base / "plugin",
        ("--mount", f"{base / 'share/hello'}:{MOUNTED}", "--env", ENV, "--env", BIG),
    )
    node = Node(staged.containerd, plugin, link, staged.image, staged.before)
    try:
        node.start_containerd()
        plugin.start()
        yield node
    finally:
        assert node.close() == []


def test_registers_and_adjusts_a_container(node: Node) -> None:
    # Configure comes only after containerd accepted RegisterPlugin.
    node.plugin.wait_for(f"plugin {INDEX}-{NAME} registered at")
    node.plugin.wait_for("configured by containerd")
    result = node.run(
        "adjusted", env={"FROM_CRI": "yes"}, annotations={"mokka.test/note": "hello"},
        cdi_devices=["nvidia.com/gpu=1"],
    )
    assert result.exit_code == 0
    assert result.sections["env"] == ["adjusted"]
    assert result.sections["mount"] == ["mounted by the plugin"]
    assert result.sections["big"] == ["6000"]
    seen = [c for c in node.plugin.created() if c["name"] == "adjusted"]
    assert len(seen) == 1, node.plugin.created()
    container = seen[0]
    assert container["pod_name"] == "nri"
    assert container["pod_namespace"] == "mokka-test"
    assert container["pod_uid"] == "uid-nri"
    assert container["id"]
    assert "FROM_CRI=yes" in container["env"]
    assert container["annotations"]["mokka.test/note"] == "hello"
    # CRI's CDI request is applied before NRI sees the container: GPU 1's node.
    assert {d["path"] for d in container["devices"]} >= {"/dev/nvidia1", "/dev/nvidiactl"}
    gpu1 = next(d for d in container["devices"] if d["path"] == "/dev/nvidia1")
    assert (gpu1["type"], gpu1["minor"]) == ("c", 1)


def test_a_failing_policy_leaves_the_container_as_it_was(node: Node) -> None:
    node.plugin.wait_for("configured by containerd")
    result = node.run("fail-policy")
    assert result.exit_code == 0
    assert result.sections["env"] == [""]
    assert "No such file" in " ".join(result.sections["mount"])
    assert node.plugin.lines("starts unadjusted") >= 1


def test_reregisters_after_containerd_restarts(node: Node) -> None:
    node.plugin.wait_for("configured by containerd")
    before = node.plugin.lines("registered at")
    assert node.containerd.stop() == []
    node.start_containerd()
    node.plugin.wait_for("registered at", before + 1)
    result = node.run("after-restart")
    assert result.exit_code == 0
    assert result.sections["env"] == ["adjusted"]
    assert result.sections["mount"] == ["mounted by the plugin"]


def test_containers_start_without_the_plugin(node: Node) -> None:
    node.plugin.wait_for("configured by containerd")
    node.plugin.kill()
    result = node.run("no-plugin")
    assert result.exit_code == 0
    assert result.sections["env"] == [""]
    # Back for whatever runs after: it registers again.
    before = node.plugin.lines("registered at")
    node.plugin.start()
    node.plugin.wait_for("registered at", before + 1)


def test_a_slow_policy_does_not_hold_the_container(node: Node) -> None:
    node.plugin.wait_for("configured by containerd")
    before = node.plugin.lines("starts unadjusted")
    dropped = node.containerd.log.read_text().count("failed to handle CreateContainer")
    result = node.run("slow-policy")
    assert result.exit_code == 0
    assert result.sections["env"] == [""]
    assert node.plugin.lines("no answer within 1.50s") >= 1
    assert node.plugin.lines("starts unadjusted") == before + 1
    # Answered in time: containerd kept the plugin, and the next container is adjusted.
    assert node.containerd.log.read_text().count("failed to handle CreateContainer") == dropped
    assert node.run("after-slow").sections["env"] == ["adjusted"]


def test_stopping_the_plugin_closes_its_connection(node: Node) -> None:
    node.plugin.wait_for("configured by containerd")
    line = f'connection to plugin \\"{INDEX}-{NAME}\\" closed'
    closed = node.containerd.log.read_text().count(line)
    assert node.plugin.stop() == 0
    assert node.plugin.lines("plugin: stopped") == 1
    deadline = time.monotonic() + 10
    while node.containerd.log.read_text().count(line) == closed:
        assert time.monotonic() < deadline, node.containerd.tail()
        time.sleep(0.05)
    assert node.run("after-stop").sections["env"] == [""]


def test_nothing_is_left(node: Node) -> None:
    """No plugin process, no mount, no cgroup; the node as seeded but the marked
    ``imports`` line (``tests/test_cri_containers_real.py`` checks its removal)."""
    assert node.close() == []
    assert node.containerd.mounts_below() == []
    assert node.containerd.cgroups() == []
    after = snapshot(node.containerd.node_root)
    changed = {p for p in node.before.keys() | after.keys() if node.before.get(p) != after.get(p)}
    assert changed <= {"etc/containerd/config.toml"}
