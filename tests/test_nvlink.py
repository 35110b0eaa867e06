"""The nvlink simulator: the ComputeDomain document in the overlay and beside the
engine config, only while one is configured, and nothing left behind."""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path

import attrs
import pytest
import trio

from mokka.noderoot.host import Host
from mokka.simulators import registry
from mokka.simulators.base import Applier, Simulator
from mokka.simulators.gpudriver import GpuDriverSettings, GpuDriverSimulator
from mokka.simulators.nvlink import PLUGIN, NvlinkSettings, NvlinkSimulator
from mokka.state.model import Topology
from mokka.state.topology import parse_topology
from tests.gpudriver_support import make_state
from tests.support import snapshot

DOCUMENT = """\
version: 1
domains:
  - name: demo-domain
    uuid: 00000000-0000-0000-0000-0000000000ab
    cliques:
      - id: 3
        nodes: [node-a, node-b]
"""

OVERLAY = "var/lib/nvml-mock/topology/topology.yaml"
BESIDE_CONFIG = "var/lib/nvml-mock/driver/config/topology.yaml"


def topology(text: str = DOCUMENT) -> Topology:
    """The document through the project's own parser, as the file source reads it."""
    parsed = parse_topology(text, source="/etc/mokka/topology.yaml")
    assert parsed is not None
    return parsed


def with_topology(text: str = DOCUMENT):
    return attrs.evolve(make_state(2), topology=topology(text))


def staged_mtimes(root: Path) -> dict[str, tuple[int, int]]:
    return {
        rel: (os.lstat(root / rel).st_mtime_ns, os.lstat(root / rel).st_ino)
        for rel in (OVERLAY, BESIDE_CONFIG)
    }


async def test_stage_on_empty_root_gives_exactly_both_copies(host: Host, node_root: Path) -> None:
    sim = NvlinkSimulator()
    await sim.stage(host, with_topology())
    tree = snapshot(node_root)
    assert {p for p in tree if not p.startswith(("var/lib/mokka", ".mokka-created"))} == {
        "var", "var/lib", "var/lib/nvml-mock", "var/lib/nvml-mock/topology", OVERLAY,
        "var/lib/nvml-mock/driver", "var/lib/nvml-mock/driver/config", BESIDE_CONFIG,
    }
    assert tree[OVERLAY] == ("file", 0o644, DOCUMENT.encode())
    assert tree[BESIDE_CONFIG] == ("file", 0o644, DOCUMENT.encode())
    assert sim.readiness.ready
    assert sim.readiness.reason == (
        "topology staged (node node-a in domain 00000000-0000-0000-0000-0000000000ab clique 3)"
    )
    await sim.discard(host)
    assert snapshot(node_root) == {}
    assert not sim.readiness.ready


async def test_stage_twice_rewrites_nothing(host: Host, node_root: Path) -> None:
    sim = NvlinkSimulator()
    await sim.stage(host, with_topology())
    first = staged_mtimes(node_root)
    await sim.stage(host, with_topology())
    assert staged_mtimes(node_root) == first
    await sim.discard(host)
    assert snapshot(node_root) == {}


async def test_a_changed_document_replaces_both_copies(host: Host, node_root: Path) -> None:
    sim = NvlinkSimulator()
    await sim.stage(host, with_topology())
    changed = DOCUMENT.replace("id: 3", "id: 4")
    await sim.stage(host, with_topology(changed))
    assert (node_root / OVERLAY).read_text() == changed
    assert (node_root / BESIDE_CONFIG).read_text() == changed
    await sim.discard(host)
    assert snapshot(node_root) == {}


async def test_both_copies_go_when_the_topology_goes(host: Host, node_root: Path) -> None:
    sim = NvlinkSimulator()
    await sim.stage(host, with_topology())
    await sim.stage(host, make_state(2))
    assert snapshot(node_root) == {}
    assert sim.readiness.ready
    assert sim.readiness.reason == "no topology document configured"
    await sim.discard(host)
    assert snapshot(node_root) == {}


async def test_without_a_topology_nothing_is_written(host: Host, node_root: Path) -> None:
    sim = NvlinkSimulator()
    assert not sim.readiness.ready
    assert sim.readiness.reason == "topology not staged"
    await sim.stage(host, make_state(2))
    assert snapshot(node_root) == {}
    assert sim.readiness.ready


async def test_a_node_outside_every_clique_still_gets_the_document(
    host: Host, node_root: Path
) -> None:
    sim = NvlinkSimulator()
    await sim.stage(host, attrs.evolve(with_topology(), node_name="node-z"))
    assert (node_root / OVERLAY).read_text() == DOCUMENT
    assert sim.readiness.reason == "topology staged (node node-z is in no clique)"
    await sim.discard(host)
    assert snapshot(node_root) == {}


async def test_a_fresh_process_discards_what_an_earlier_one_staged(
    host: Host, node_root: Path
) -> None:
    await NvlinkSimulator().stage(host, with_topology())
    await NvlinkSimulator().discard(Host(node_root))
    assert snapshot(node_root) == {}


async def test_a_foreign_file_in_the_overlay_path_is_restored(host: Host, node_root: Path) -> None:
    overlay = node_root / OVERLAY
    overlay.parent.mkdir(parents=True)
    overlay.write_text("written by the earlier mock\n")
    before = snapshot(node_root)
    sim = NvlinkSimulator()
    await sim.stage(host, with_topology())
    assert overlay.read_text() == DOCUMENT
    await sim.discard(host)
    assert snapshot(node_root) == before


@pytest.mark.parametrize("first", ["nvlink", "gpudriver"])
async def test_sharing_the_config_directory_with_gpudriver_leaves_nothing_behind(
    host: Host, node_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    # Both simulators write into driver/config; whichever is discarded first,
    # the other's discard must still remove the directories they shared.
    native = tmp_path / "native"
    native.mkdir()
    (native / "libnvidia-ml.so.1").write_bytes(b"library")
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(native))
    gpudriver = GpuDriverSimulator(
        settings=GpuDriverSettings(nvidia_smi_binary=tmp_path / "none", publish="symlink")
    )
    nvlink = NvlinkSimulator()
    state = with_topology()
    async with trio.open_nursery() as nursery:  # as the Stage wave runs them
        nursery.start_soon(gpudriver.stage, host, state)
        nursery.start_soon(nvlink.stage, host, state)
    assert (node_root / BESIDE_CONFIG).read_text() == DOCUMENT
    assert (node_root / "var/lib/nvml-mock/driver/config/config.yaml").is_file()
    order = [nvlink, gpudriver] if first == "nvlink" else [gpudriver, nvlink]
    for sim in order:
        await sim.discard(host)
    assert snapshot(node_root) == {}


MODULE = "mokka.simulators.nvlink"


def test_plugin_is_registered_and_builds_from_flags() -> None:
    assert MODULE in registry.PLUGIN_MODULES
    # Loaded the way the registry loads it (by module name, attribute PLUGIN).
    assert importlib.import_module(MODULE).PLUGIN is PLUGIN
    parser = argparse.ArgumentParser()
    PLUGIN.add_arguments(parser)
    sim = PLUGIN.build(parser.parse_args([]))
    assert isinstance(sim, Simulator)
    assert not isinstance(sim, Applier)
    assert sim.name == "nvlink"
    assert sim.settings == NvlinkSettings()
