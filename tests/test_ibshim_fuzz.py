"""The verbs shim against damaged IB trees, under AddressSanitizer and UBSan.

The real ``ibv_devinfo`` (plain, ``-v``, one port) and ``ibv_devices`` run
with ``libibshim.so`` and ``libmockfs.so`` built with
``-fsanitize=address,undefined`` on copies of a staged GB200 tree broken in
seeded random ways (``tests.ibshim_fuzz_support.damage``: attribute files
empty, over-long, non-numeric, missing, replaced by directories, links or
FIFOs; odd port, GID, P_Key and uverbs entries; classes gone).  Every run
must end, by itself and without a sanitizer report; an error message and a
non-zero status are a fine answer to a broken tree.  The staged tree is
discarded afterwards and the node root checked byte for byte.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mokka import layout
from mokka.noderoot.host import Host
from tests.ib_support import stage, state_of
from tests.ibshim_fuzz_support import (
    COMMANDS,
    LIBIBVERBS_READS,
    build_sanitized,
    damage,
    run_tool,
)
from tests.support import require_tool, snapshot

SEED = 8675309
TREES = 40


@pytest.fixture(scope="module")
def shims(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build_sanitized(tmp_path_factory.mktemp("ibshim-asan"))


@pytest.fixture(scope="module")
def tools() -> dict[str, str]:
    return {name: require_tool(name) for name in ("ibv_devinfo", "ibv_devices")}


@pytest.fixture
async def ib_tree(node_root: Path) -> AsyncIterator[Path]:
    """A GB200 node's IB tree (4 HCAs) staged by the ib simulator; yields the
    directory standing for ``/`` and checks discard restores the root."""
    before = snapshot(node_root)
    sim = await stage(node_root, state_of("gb200"), mode="sysfs")
    yield node_root / layout.IB_ROOT.lstrip("/")
    await sim.discard(Host(node_root))
    assert snapshot(node_root) == before


async def test_the_intact_tree_lists_every_hca(ib_tree: Path, shims: tuple[Path, Path],
                                               tools: dict[str, str]) -> None:
    """The harness itself: through the sanitized shims the tools see the tree."""
    result = run_tool([tools["ibv_devinfo"], "-v"], shims, ib_tree)
    assert result.problem() is None, result.problem()
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("hca_id:") == 4
    assert "PORT_ACTIVE" in result.stdout


async def test_damaged_trees(ib_tree: Path, shims: tuple[Path, Path], tools: dict[str, str],
                             tmp_path: Path) -> None:
    rng = random.Random(SEED)
    problems, kinds = [], set()
    for n in range(TREES):
        tree = tmp_path / f"tree-{n}"
        done = damage(rng, ib_tree, tree)
        kinds.update(d.split(":", 1)[0] for d in done)
        for command in COMMANDS:
            problem = run_tool([tools[command[0]], *command[1:]], shims, tree).problem()
            if problem:
                problems.append(f"tree {n} ({'; '.join(done)}): {problem}")
        shutil.rmtree(tree)
    assert not problems, "\n".join(problems)
    assert kinds == {"content", "overlong", "special", "entries", "structure"}


async def test_a_fifo_for_an_attribute_does_not_hang(ib_tree: Path, shims: tuple[Path, Path],
                                                     tools: dict[str, str],
                                                     tmp_path: Path) -> None:
    """Every attribute the shim reads, replaced by a FIFO in turn: the query
    must fail or answer, not wait for a writer that never comes."""
    source = ib_tree / "sys/class"
    attributes = sorted(
        p.relative_to(ib_tree) for p in [*source.glob("infiniband/mlx5_0/**/*"),
                                         *source.glob("infiniband_verbs/**/*")]
        if p.is_file() and "counters" not in p.parts and p.name not in LIBIBVERBS_READS)
    assert len(attributes) > 20
    hung = []
    for rel in attributes:
        tree = tmp_path / "tree"
        shutil.copytree(ib_tree / "sys", tree / "sys", symlinks=True)
        (tree / rel).unlink()
        os.mkfifo(tree / rel)
        result = run_tool([tools["ibv_devinfo"], "-v"], shims, tree, timeout=5)
        if result.problem():
            hung.append(f"{rel}: {result.problem()}")
        shutil.rmtree(tree)
    assert not hung, "\n".join(hung)


async def test_entries_count_only_in_the_kernel_spelling(ib_tree: Path,
                                                         shims: tuple[Path, Path],
                                                         tools: dict[str, str],
                                                         tmp_path: Path) -> None:
    """``uverbs+0`` or ``uverbs 1`` is not the kernel's ``uverbs0``/``uverbs1``:
    such entries (and numbers past an int) are skipped, not read as another
    entry's data, so no HCA is listed twice; the same for port entries."""
    tree = tmp_path / "tree"
    shutil.copytree(ib_tree / "sys", tree / "sys", symlinks=True)
    verbs = tree / "sys/class/infiniband_verbs"
    for name in ("uverbs+0", "uverbs 1", "uverbs-2", "uverbs 3", "uverbs2147483648"):
        shutil.copytree(verbs / "uverbs0", verbs / name, symlinks=True)
    ports = tree / "sys/class/infiniband/mlx5_0/ports"
    for name in ("+1", " 1", "01"):
        shutil.copytree(ports / "1", ports / name, symlinks=True)
    listed = run_tool([tools["ibv_devinfo"], "-l"], shims, tree)
    assert listed.problem() is None, listed.problem()
    assert listed.stdout.split()[:3] == ["4", "HCAs", "found:"], listed.stdout
    assert sorted(listed.stdout.split()[3:]) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    info = run_tool([tools["ibv_devinfo"], "-d", "mlx5_0"], shims, tree)
    assert info.problem() is None, info.problem()
    assert "\tphys_port_cnt:\t\t\t1\n" in info.stdout, info.stdout
    assert "PORT_ACTIVE" in info.stdout
