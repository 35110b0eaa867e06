"""Per-node identities: shape, determinism, uniqueness across 1,000 nodes.

"Stable across restarts" is checked across processes: a value that depended
on anything of one process (``hash()`` of a string, which ``PYTHONHASHSEED``
changes; an address, a clock) is equal twice in one process and differs in
the next one.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from mokka.simulators.ib import lids
from mokka.state import identity
from mokka.state.compile import compile_profile
from tests.daemon_support import PROCESS_TIMEOUT, daemon_env
from tests.support import snapshot

UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
NODES = [f"worker-{i}" for i in range(1000)]


def test_shapes() -> None:
    assert UUID_RE.match(identity.gpu_uuid("node-a", 0))
    serial = identity.gpu_serial("node-a", 0)
    assert len(serial) == 13
    assert serial.isdigit()
    assert re.match(r"^0x[0-9a-f]{16}$", identity.ib_node_guid("node-a", 0))


#: Every identity derived from the node name, as one process computes it.
IDENTITIES = """
import json, sys
from mokka.simulators.ib import lids
from mokka.state.compile import compile_profile
state = compile_profile("gb200", node_name="node-a")
print(json.dumps({
    "uuids": [g.uuid for g in state.gpus],
    "serials": [g.serial for g in state.gpus],
    "fields": [g.fields for g in state.gpus],
    "node_guids": list(state.infiniband.node_guids),
    "lids": list(lids.node_lids(lids.fabric_nodes(state), "node-a", state.infiniband.hca_count)),
    "content_hash": state.content_hash,
}, sort_keys=True, default=str))
"""


def _identities(seed: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", IDENTITIES], capture_output=True, text=True, check=True,
        env={**daemon_env(), "PYTHONHASHSEED": seed}, timeout=PROCESS_TIMEOUT,
    )
    return json.loads(out.stdout)


def test_every_identity_is_equal_across_processes() -> None:
    """Two interpreters with different string hashing, and this one, agree on every one."""
    first, second = _identities("1"), _identities("2")
    assert first == second
    state = compile_profile("gb200", node_name="node-a")
    assert first["uuids"] == [g.uuid for g in state.gpus]
    assert first["node_guids"] == list(state.infiniband.node_guids)
    assert first["lids"] == list(
        lids.node_lids(lids.fabric_nodes(state), "node-a", state.infiniband.hca_count))
    assert len(set(first["uuids"])) == len(state.gpus) == 4


def test_two_daemon_starts_stage_the_same_node(tmp_path: Path) -> None:
    """Two ``mokka daemon --once`` (two starts, different string hashing) on two roots
    stage byte-identical trees: UUIDs, serials, IB GUIDs and LIDs in every file that
    carries them.  Cleanup then leaves both roots empty."""
    roots = [tmp_path / "first", tmp_path / "second"]
    for root, seed in zip(roots, ("1", "2"), strict=True):
        root.mkdir()
        run = subprocess.run(
            [sys.executable, "-m", "mokka", "daemon", "--once", "--root", str(root),
             "--profile", "gb200", "--node-name", "node-a"],
            capture_output=True, text=True, cwd=tmp_path, timeout=PROCESS_TIMEOUT,
            env={**daemon_env(), "PYTHONHASHSEED": seed}, check=False,
        )
        assert run.returncode == 0, run.stdout + run.stderr
    first, second = (snapshot(root) for root in roots)
    assert first == second
    staged = b"".join(v[2] for v in first.values() if v[0] == "file")
    state = compile_profile("gb200", node_name="node-a")
    for uuid in (g.uuid for g in state.gpus):
        assert uuid.encode() in staged
    for root in roots:
        cleanup = subprocess.run(
            [sys.executable, "-m", "mokka", "cleanup", "--root", str(root)],
            capture_output=True, text=True, cwd=tmp_path, timeout=PROCESS_TIMEOUT,
            env=daemon_env(), check=False,
        )
        assert cleanup.returncode == 0, cleanup.stderr
        assert snapshot(root) == {}


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
