"""LIDs of a mock fabric: unique across its nodes, stable across restarts.

A real subnet manager hands out LIDs; here every daemon must arrive at the
same answer without talking to the others, so LIDs follow from the fabric's
node list alone (the topology document's nodes, in document order, see
``fabric_nodes``).  The layout::

    LID 1                      the spine switch, which also hosts the SM
    LID 2 + 128*k              node k's leaf switch
    LID 2 + 128*k + 1 + i      node k's HCA mlx5_<i>

A block of 128 per node leaves room for 127 HCAs (a leaf switch with one
port per HCA and an uplink), and the spine's port count (one port per
node, at most 254 in a switch) bounds the fabric; both fit below the last
unicast LID.  Appending
nodes to the list leaves every earlier node's LIDs as they were; a node that
is not in the list (or a node without a topology document) is a fabric of
its own, node 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from mokka.errors import SpecError
from mokka.state.model import State
from mokka.state.profile_blocks import MAX_FABRIC_NODES, MAX_HCAS

#: The spine switch, and with it the subnet manager.
SM_LID = 1
FIRST_LID = 2
#: LIDs per node: the leaf switch and up to ``MAX_HCAS`` HCAs (the profile
#: refuses more, with this same constant).
BLOCK = MAX_HCAS + 1
#: A switch has at most 254 external ports: one spine port per node (the
#: compiler refuses a larger fabric with this same constant).
MAX_NODES = MAX_FABRIC_NODES
LAST_UNICAST_LID = 0xBFFF
assert FIRST_LID + MAX_NODES * BLOCK - 1 <= LAST_UNICAST_LID


def fabric_nodes(state: State) -> tuple[str, ...]:
    """The node list LIDs derive from: the topology document's nodes in
    document order (duplicates dropped), when it names this node; else this
    node alone."""
    seen: dict[str, None] = {}
    if state.topology is not None:
        for domain in state.topology.domains:
            for clique in domain.cliques:
                for node in clique.nodes:
                    seen.setdefault(node, None)
    if state.node_name not in seen:
        return (state.node_name,)
    return tuple(seen)


def check_fabric(nodes: Sequence[str], hca_count: int, where: str) -> list[str]:
    """Problems with a fabric of ``nodes`` where this node has ``hca_count`` HCAs."""
    problems = []
    if len(nodes) > MAX_NODES:
        problems.append(
            f"{where}: {len(nodes)} nodes in the InfiniBand fabric, expected at most "
            f"{MAX_NODES} (one spine switch port per node)"
        )
    if hca_count > MAX_HCAS:
        problems.append(
            f"{where}: hca_count {hca_count}, expected at most {MAX_HCAS} HCAs per node "
            f"(a block of {BLOCK} LIDs per node)"
        )
    return problems


def leaf_lid(index: int) -> int:
    """LID of node ``index``'s leaf switch."""
    return FIRST_LID + BLOCK * index


def hca_lid(index: int, hca: int) -> int:
    """LID of HCA ``mlx5_<hca>`` of node ``index``."""
    return leaf_lid(index) + 1 + hca


def node_lids(nodes: Sequence[str], node: str, hca_count: int) -> tuple[int, ...]:
    """The LIDs of ``node``'s HCAs; ``SpecError`` when the fabric cannot hold it."""
    problems = check_fabric(nodes, hca_count, f"node {node}")
    if node not in nodes:
        problems.append(f"node {node}: not in the fabric's node list {list(nodes)}")
    if problems:
        raise SpecError(problems)
    index = list(nodes).index(node)
    return tuple(hca_lid(index, i) for i in range(hca_count))


def owner(lid: int) -> tuple[int, int] | None:
    """(node index, slot) of a unicast LID: slot 0 is the leaf switch,
    ``1 + i`` HCA ``i``; ``None`` for the spine's LID and anything outside
    the blocks."""
    if not FIRST_LID <= lid < FIRST_LID + MAX_NODES * BLOCK:
        return None
    return divmod(lid - FIRST_LID, BLOCK)
