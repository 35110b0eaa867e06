"""One simulator set cycled through every built-in profile converges each time.

A profile switch (a ConfigMap edit) reaches a running daemon as a new state;
the node must then look exactly as if the daemon had started on that
profile: no device node, library version, PCI function, HCA, IMEX channel,
marker or spec of the previous profile may stay behind, and nothing the new
profile wants may be missing.  So every stage of the cycle is compared with a
*fresh* node staged from the same state by a fresh simulator set, and the
cycle ends with a teardown that must leave the root empty.

The daemons run too (through the daemon's own supervisor), because the
fabric manager's marker comes and goes with the profile.  Mokka's own
bookkeeping directory is compared by what each owner owns, not byte for
byte: the manifests record the same paths, but in creation order.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from mokka import cli, layout
from mokka.daemon import reconciler as reconciler_module
from mokka.daemon.command import build_simulators
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.supervisor import Supervisor
from mokka.daemon.teardown import teardown
from mokka.noderoot.host import Host
from mokka.simulators.fabricmanager import OFF, READY, FabricManagerSimulator
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.support import GiveWayAfter, snapshot

NODE = "worker-7"
#: Every built-in profile, in an order that crosses every boundary at least
#: once (x86 ↔ Grace, NVSwitch ↔ none, IB ↔ none, IMEX ↔ none, 8 ↔ 4 ↔ 1
#: GPUs, one driver version to another), and back to the first.
CYCLE = ("h100", "gb200", "a100", "b200", "gb300", "l40s", "t4", "h100")

TOPOLOGY = """\
version: 1
domains:
  - name: cycle
    uuid: 00000000-0000-0000-0000-0000000000ab
    cliques:
      - id: 3
        nodes: [worker-7]
"""


def _bookkeeping_prefix() -> str:
    return layout.MOKKA_STATE_DIR.strip("/")


#: The library's change counter: it counts announcements, so a node cycled
#: through seven profiles has announced more than a fresh one, by design (the
#: value is only a hint; docs/engine-config.md). Its presence, mode and size
#: are compared, not its value.
COUNTER = layout.CONFIG_GENERATION.strip("/")


def node_tree(root: Path) -> dict:
    """The root's snapshot without Mokka's bookkeeping (compared separately)."""
    prefix = _bookkeeping_prefix()
    tree = {
        k: v for k, v in snapshot(root).items() if k != prefix and not k.startswith(prefix + "/")
    }
    if COUNTER in tree:
        kind, mode, content = tree[COUNTER]
        tree[COUNTER] = (kind, mode, len(content))
    return tree


def ownership(host: Host) -> dict[str, dict[str, str]]:
    """owner → {path: kind}, for every owner with a manifest."""
    directory = host.root / _bookkeeping_prefix() / "manifests"
    if not directory.is_dir():
        return {}
    owners = {p.name.rsplit(".", 1)[0] for p in directory.iterdir()}
    return {owner: host.owned(owner) for owner in sorted(owners) if host.owned(owner)}


def _args(root: Path, flags: list[str]) -> list[str]:
    return ["daemon", "--root", str(root), "--profile", "h100", "--node-name", NODE, *flags]


async def _settle(simulators, state: State) -> None:
    """Wait until the fabric manager acted on ``state`` (its marker is up or down)."""
    for sim in simulators:
        if isinstance(sim, FabricManagerSimulator):
            want = READY if sim.enabled(state) else OFF
            await sim.phase.wait_value(want)


class Node:
    """A root with its own simulator set, reconciler and supervisor."""

    def __init__(self, root: Path, nursery: trio.Nursery, flags: list[str]) -> None:
        root.mkdir(parents=True)
        self.root = root
        self.host = Host(root)
        self.simulators = build_simulators(cli.build_parser().parse_args(_args(root, flags)))
        self.supervisor = Supervisor(self.host)
        self.reconciler = Reconciler(self.host, self.simulators, supervisor=self.supervisor)
        self.nursery = nursery

    async def start(self) -> None:
        await self.nursery.start(self.supervisor.run)

    async def converge(self, state: State) -> None:
        result = await self.reconciler.reconcile_once(state)
        assert result.ok, result.summary()
        await _settle(self.simulators, state)

    async def teardown(self) -> None:
        report = await teardown(self.host, self.simulators, timeout=60, supervisor=self.supervisor)
        assert report.clean, report.failures


async def _fresh(tmp_path: Path, name: str, state: State, flags: list[str]) -> tuple[dict, dict]:
    """Tree and ownership of a fresh node staged from ``state``; it is torn down after."""
    async with trio.open_nursery() as nursery:
        fresh = Node(tmp_path / name, nursery, flags)
        await fresh.start()
        await fresh.converge(state)
        tree, owners = node_tree(fresh.root), ownership(fresh.host)
        await fresh.teardown()
        assert snapshot(fresh.root) == {}
    return tree, owners


@pytest.mark.parametrize(
    "flags",
    [
        [],
        # Every optional surface on, whatever the profile says.
        ["--ib-mode", "full", "--imex", "on", "--fabric-manager", "on", "--nri", "off"],
    ],
    ids=["defaults", "everything-on"],
)
async def test_cycling_every_profile_through_one_simulator_set_converges(
    tmp_path: Path, flags: list[str]
) -> None:
    # The real clock, not the autojump one: teardown's deadline and the
    # daemons' timers would jump ahead while worker threads write thousands
    # of files.  Nothing here waits on a timer; each step waits on an event.
    topology = tmp_path / "topology.yaml"
    topology.write_text(TOPOLOGY)
    async with trio.open_nursery() as nursery:
        cycled = Node(tmp_path / "cycled", nursery, flags)
        await cycled.start()
        for generation, profile in enumerate(CYCLE, start=1):
            # The fabric-attached profiles also get a topology document, so
            # nvlink's copies and the clique in the engine config come and go.
            topo = topology if profile.startswith("gb") else None
            state = compile_profile(
                profile, node_name=NODE, topology=topo, generation=generation
            )
            await cycled.converge(state)
            want_tree, want_owners = await _fresh(
                tmp_path, f"fresh-{generation}", state, flags
            )
            got_tree = node_tree(cycled.root)
            missing = sorted(set(want_tree) - set(got_tree))
            stale = sorted(set(got_tree) - set(want_tree))
            shared = set(want_tree) & set(got_tree)
            differ = sorted(k for k in shared if want_tree[k] != got_tree[k])
            assert (missing, stale, differ) == ([], [], []), profile
            assert ownership(cycled.host) == want_owners, profile
        await cycled.teardown()
        assert snapshot(cycled.root) == {}
        nursery.cancel_scope.cancel()


async def _interrupted(node: Node, state: State, checks: int, monkeypatch) -> bool:
    """A pass toward ``state`` whose converges give way to a newer input after ``checks``
    paths, wherever that falls (``Host.GIVE_WAY``); whether it did give way."""
    stop = GiveWayAfter(checks)
    # The reconciler's own ``threading`` only: its one use is this event.
    monkeypatch.setattr(reconciler_module, "threading", SimpleNamespace(Event=lambda: stop))
    try:
        await node.reconciler._pass(state, 1, superseded=trio.sleep_forever)
    finally:
        monkeypatch.undo()
    return stop.checks < 0


async def test_changes_interrupted_anywhere_still_converge_like_a_fresh_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before each step of the cycle, a pass toward it and one toward the next profile
    are cut off part way (a newer input arriving): the converges they abandoned
    leave the owners' last good records, which the step's full pass starts from.
    It must still end exactly where a fresh node would."""
    async with trio.open_nursery() as nursery:
        cycled = Node(tmp_path / "cycled", nursery, [])
        await cycled.start()
        states = [compile_profile(p, node_name=NODE, generation=g)
                  for g, p in enumerate(CYCLE, start=1)]
        await cycled.converge(states[0])
        cut_off = 0
        for step, state in enumerate(states[1:], start=1):
            # The next profile to cut off toward, never the step's own input:
            # the last step's next would be the first h100 again, and a call
            # over the same input is replayed (``waves.Replays``), keeping its
            # files' provenance line (``generation``) from the older state, by
            # design (docs/engine-config.md), where a fresh node has the newer.
            following = next(s for s in [*states[step + 1:], *states[1:]]
                             if s.content_hash != state.content_hash)
            cut_off += await _interrupted(cycled, state, (step * 37) % 160, monkeypatch)
            cut_off += await _interrupted(cycled, following, (step * 23) % 90, monkeypatch)
            await cycled.converge(state)
            want_tree, want_owners = await _fresh(tmp_path, f"fresh-{step}", state, [])
            got_tree = node_tree(cycled.root)
            missing = sorted(set(want_tree) - set(got_tree))
            stale = sorted(set(got_tree) - set(want_tree))
            differ = sorted(k for k in set(want_tree) & set(got_tree)
                            if want_tree[k] != got_tree[k])
            assert (missing, stale, differ) == ([], [], []), CYCLE[step]
            assert ownership(cycled.host) == want_owners, CYCLE[step]
        assert cut_off >= 12  # of the 14 passes: the others were shorter than their cut
        await cycled.teardown()
        assert snapshot(cycled.root) == {}
        nursery.cancel_scope.cancel()
