"""Per-node identities: shape, determinism, uniqueness across 1,000 nodes."""

from __future__ import annotations

import re

from mokka.state import identity
from mokka.state.compile import compile_profile

UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
NODES = [f"worker-{i}" for i in range(1000)]


def test_shapes() -> None:
    assert UUID_RE.match(identity.gpu_uuid("node-a", 0))
    serial = identity.gpu_serial("node-a", 0)
    assert len(serial) == 13
    assert serial.isdigit()
    assert re.match(r"^0x[0-9a-f]{16}$", identity.ib_node_guid("node-a", 0))


def test_deterministic_across_restarts() -> None:
    assert identity.gpu_uuid("node-a", 3) == identity.gpu_uuid("node-a", 3)
    a = compile_profile("b200", node_name="node-a")
    b = compile_profile("b200", node_name="node-a")
    assert [g.uuid for g in a.gpus] == [g.uuid for g in b.gpus]
    assert [g.serial for g in a.gpus] == [g.serial for g in b.gpus]
    assert a.infiniband.node_guids == b.infiniband.node_guids


def test_templates_keep_their_style() -> None:
    uuid = identity.gpu_uuid("node-a", 0, "GPU-B200B200-0000-0000-0000-000000000000")
    assert uuid.startswith("GPU-b200b200-")
    assert uuid != "GPU-b200b200-0000-0000-0000-000000000000"
    assert identity.gpu_serial("node-a", 0, "1562821083900").startswith("156")
    assert identity.ib_node_guid("node-a", 0, "9b88c2:0300:ab").startswith("0x9b88c2")
    # only ASCII digits are kept: ``\\d`` would keep the Arabic-Indic ones too
    assert identity.gpu_serial("node-a", 0, "\u0663\u0663\u0663-42").startswith("42")
    assert identity.gpu_serial("node-a", 0, "\u0663\u0663\u0663").isascii()
    # a malformed template is ignored rather than copied
    assert UUID_RE.match(identity.gpu_uuid("node-a", 0, "not-a-uuid"))


def test_no_collisions_across_1000_nodes() -> None:
    uuids = {identity.gpu_uuid(n, slot, "GPU-4a3c0e11-0000-0000-0000-000000000000")
             for n in NODES for slot in range(8)}
    assert len(uuids) == 8000
    assert all(UUID_RE.match(u) for u in uuids)
    serials = {identity.gpu_serial(n, slot, "1650000000001") for n in NODES for slot in range(8)}
    assert len(serials) == 8000
    guids = {identity.ib_node_guid(n, slot, "a088c2:0300") for n in NODES for slot in range(8)}
    assert len(guids) == 8000


def test_compiled_profiles_differ_per_node_and_slot() -> None:
    a = compile_profile("h100", node_name="node-a")
    b = compile_profile("h100", node_name="node-b")
    assert len({g.uuid for g in a.gpus + b.gpus}) == 16
    assert len({g.serial for g in a.gpus + b.gpus}) == 16
    assert set(a.infiniband.node_guids).isdisjoint(b.infiniband.node_guids)
    # identities in the engine config fields agree with the typed ones
    assert [g.fields["uuid"] for g in a.gpus] == [g.uuid for g in a.gpus]
