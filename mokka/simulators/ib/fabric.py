"""The mock subnet as one daemon sees it: who is where, what is linked, who answers.

The shape is a two-level tree, the same on every node because it follows
from the fabric's node list (``lids.py``)::

                 spine (LID 1, runs the SM; port k+1 -> node k)
                /     \\
     leaf of node 0   leaf of node 1 ...   (ports 1..h: the node's HCAs,
        |    |            |                 port h+1: uplink to the spine)
     mlx5_0 mlx5_1      mlx5_0             (port 1 each)

Entities are tuples: ``("spine",)``, ``("leaf", k)``, ``("hca", k, i)``.
A daemon answers for the spine and for its own node's leaf and HCAs; an
entity of node k is node k's daemon to answer (the relay carries the MAD
there).  A spine port is up when its node is this one or a live peer, so a
daemon that goes away looks like an unplugged cable: its port polls, its
LIDs stop answering.

What each answer is made of: the HCAs as staged (``hca.Hca``, the same
values sysfs shows), the port counters read from the staged sysfs files at
the moment of the query, and the node list.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

import attrs

from mokka.simulators.ib import lids, mad, smp
from mokka.simulators.ib.hca import CAP_MASK, PORT_STATES, Hca

Entity = tuple[str | int, ...]
SPINE: Entity = ("spine",)
#: A spine or leaf port number not yet known to the sender: the leaf's
#: uplink, resolved by the leaf's own daemon (which knows its HCA count).
UPLINK = "uplink"
#: The device id the switches report (Quantum-2, ``MT54002``).
SWITCH_DEVICE_ID = 0xD2F2
#: Mellanox's OUI in the top 24 bits of the switches' GUIDs.
_OUI = 0x0002C9 << 40


def _guid(*parts: str) -> int:
    digest = hashlib.sha256("\0".join(("mokka-ib", *parts)).encode()).digest()
    return _OUI | int.from_bytes(digest[:5], "big")


@attrs.frozen(kw_only=True)
class Walked:
    """Where a directed route ends, or where another daemon must take it on."""

    entity: Entity
    #: port the SMP arrived on (``UPLINK`` for a leaf reached from the spine,
    #: resolved by its owner)
    arrival: int | str
    #: hops still to take (non-empty only when ``owner`` is another node)
    hops: tuple[int, ...] = ()


@attrs.define(eq=False)
class Fabric:
    """The subnet view of node ``me`` (see the module docstring)."""

    nodes: tuple[str, ...]
    me: int
    hcas: tuple[Hca, ...]
    #: whether node k's daemon is reachable (k != me)
    is_live: Callable[[int], bool]
    #: the counters of local HCA ``i`` by sysfs name (read at query time)
    read_counters: Callable[[int], Mapping[str, int]]
    #: GUIDs of the HCAs of other nodes → their LIDs (from the relay's hellos)
    remote_guids: Callable[[], Mapping[int, int]] = attrs.field(default=lambda: {})

    @property
    def spine_guid(self) -> int:
        return _guid("spine", *self.nodes)

    def leaf_guid(self, k: int) -> int:
        return _guid("leaf", self.nodes[k])

    # ---- ownership and links ------------------------------------------

    def owner(self, entity: Entity) -> int | None:
        """The node index that answers for ``entity`` (``None``: any daemon, the spine)."""
        return None if entity == SPINE else int(entity[1])

    def entity_at(self, lid: int) -> Entity | None:
        """The entity a LID names, local or remote (``None``: nothing there)."""
        if lid == lids.SM_LID:
            return SPINE
        where = lids.owner(lid)
        if where is None or where[0] >= len(self.nodes):
            return None
        node, slot = where
        if slot == 0:
            return ("leaf", node)
        if node == self.me and slot - 1 >= len(self.hcas):
            return None
        return ("hca", node, slot - 1)

    def _hca_up(self, i: int) -> bool:
        return self.hcas[i].port_state == PORT_STATES["ACTIVE"]

    def _uplink(self) -> int:
        return len(self.hcas) + 1

    def neighbor(self, entity: Entity, port: int) -> Walked | None:
        """Across the link on ``port`` of a local entity or the spine; ``None``: no link."""
        kind = entity[0]
        if kind == "hca":
            i = int(entity[2])
            if port == 1 and self._hca_up(i):
                return Walked(entity=("leaf", self.me), arrival=i + 1)
            return None
        if kind == "leaf":
            if 1 <= port <= len(self.hcas) and self._hca_up(port - 1):
                return Walked(entity=("hca", self.me, port - 1), arrival=1)
            if port == self._uplink():
                return Walked(entity=SPINE, arrival=self.me + 1)
            return None
        k = port - 1
        if k == self.me:
            return Walked(entity=("leaf", self.me), arrival=self._uplink())
        if 0 <= k < len(self.nodes) and self.is_live(k):
            return Walked(entity=("leaf", k), arrival=UPLINK)
        return None

    def walk(self, start: Walked) -> Walked | None:
        """Follow a directed route from ``start``; stops at its end or at the
        first entity another daemon owns (with the hops still to take)."""
        entity, arrival, hops = start.entity, start.arrival, list(start.hops)
        if arrival == UPLINK and entity[0] == "leaf" and entity[1] == self.me:
            arrival = self._uplink()
        while True:
            owner = self.owner(entity)
            if owner is not None and owner != self.me:
                return Walked(entity=entity, arrival=arrival, hops=tuple(hops))
            if not hops:
                return Walked(entity=entity, arrival=arrival)
            step = self.neighbor(entity, hops.pop(0))
            if step is None:
                return None
            entity, arrival = step.entity, step.arrival

    # ---- answers ------------------------------------------------------

    def lid_of(self, entity: Entity) -> int:
        if entity == SPINE:
            return lids.SM_LID
        if entity[0] == "leaf":
            return lids.leaf_lid(int(entity[1]))
        return lids.hca_lid(int(entity[1]), int(entity[2]))

    def _facts(self, entity: Entity) -> smp.NodeFacts:
        if entity == SPINE:
            return smp.NodeFacts(node_type=smp.NODE_TYPE_SWITCH, num_ports=len(self.nodes),
                                 guid=self.spine_guid, device_id=SWITCH_DEVICE_ID)
        if entity[0] == "leaf":
            return smp.NodeFacts(node_type=smp.NODE_TYPE_SWITCH, num_ports=self._uplink(),
                                 guid=self.leaf_guid(int(entity[1])),
                                 device_id=SWITCH_DEVICE_ID)
        hca = self.hcas[int(entity[2])]
        return smp.NodeFacts(node_type=smp.NODE_TYPE_CA, num_ports=1, guid=hca.guid,
                             device_id=hca.pci_device)

    def _description(self, entity: Entity) -> str:
        if entity == SPINE:
            return "mokka spine switch (subnet manager)"
        if entity[0] == "leaf":
            return f"mokka leaf switch {self.nodes[int(entity[1])]}"
        return self.hcas[int(entity[2])].node_desc

    def _port(self, entity: Entity, port: int, arrival: int) -> smp.PortFacts | None:
        """PortInfo facts of ``port`` (0: a switch's management port).

        LocalPortNum is the port the SMP came in on, whichever port it asks
        about: that is how discovery tells the port it came through from the
        ones to explore."""
        rate = self.hcas[0].rate_gbps if self.hcas else 400
        if entity[0] == "hca":
            hca = self.hcas[int(entity[2])]
            if port != 1:
                return None
            return smp.PortFacts(lid=hca.lid, sm_lid=lids.SM_LID, cap_mask=CAP_MASK,
                                 local_port=1, state=hca.port_state,
                                 phys_state=hca.phys_state, rate_gbps=hca.rate_gbps)
        num_ports = self._facts(entity).num_ports
        if port == 0:
            cap = smp.SWITCH_CAP_MASK | (smp.CAP_IS_SM if entity == SPINE else 0)
            return smp.PortFacts(lid=self.lid_of(entity), sm_lid=lids.SM_LID, cap_mask=cap,
                                 local_port=arrival, state=smp.PORT_ACTIVE,
                                 phys_state=smp.PHYS_LINK_UP, rate_gbps=rate)
        if not 1 <= port <= num_ports:
            return None
        up = self.neighbor(entity, port) is not None
        return smp.PortFacts(
            sm_lid=lids.SM_LID, local_port=arrival,
            state=smp.PORT_ACTIVE if up else smp.PORT_DOWN,
            phys_state=smp.PHYS_LINK_UP if up else smp.PHYS_POLLING, rate_gbps=rate,
        )

    def answer_smp(self, entity: Entity, arrival: int, request: bytes) -> bytes:
        """The SMA's GetResp data for a local entity (or the spine)."""
        attr, mod = mad.attr_id(request), mad.attr_mod(request)
        status, data = mad.STATUS_OK, b""
        if mad.method(request) != mad.METHOD_GET:
            status = mad.STATUS_UNSUP_METHOD_ATTR
        elif attr == smp.ATTR_NODE_INFO:
            facts = self._facts(entity)
            port_guid = facts.guid
            data = smp.node_info(facts, arrival, port_guid)
        elif attr == smp.ATTR_NODE_DESC:
            data = smp.node_description(self._description(entity))
        elif attr == smp.ATTR_PORT_INFO:
            port = mod & 0xFF
            if port == 0 and entity[0] == "hca":
                port = arrival or 1
            facts = self._port(entity, port, arrival)
            if facts is None:
                status = mad.STATUS_INVALID_FIELD
            else:
                data = smp.port_info(facts)
        elif attr == smp.ATTR_SWITCH_INFO and entity[0] != "hca":
            data = smp.switch_info(self._facts(entity).num_ports, self._lft_top())
        elif attr == smp.ATTR_LINEAR_FORWARDING_TABLE and entity[0] != "hca":
            first, routed = mod * smp.LFT_BLOCK, self._routed()
            data = bytes(self.route(entity, lid, routed)
                         for lid in range(first, first + smp.LFT_BLOCK))
        elif attr == smp.ATTR_SM_INFO and entity == SPINE:
            data = smp.sm_info(self.spine_guid)
        else:
            status = mad.STATUS_UNSUP_METHOD_ATTR
        if mad.mgmt_class(request) == mad.CLASS_SMP_DR:
            return mad.dr_response(request, status, data)
        return mad.response(request, status, data_offset=64, data=data)

    def _routed(self) -> set[int]:
        """The LIDs the switches route: the spine, this node's leaf and HCAs,
        and the leaves and HCAs of live peers (as their hellos announced),
        the way an SM routes only the ports it found."""
        known = {lids.SM_LID, lids.leaf_lid(self.me), *(h.lid for h in self.hcas)}
        known.update(lids.leaf_lid(k) for k in range(len(self.nodes))
                     if k != self.me and self.is_live(k))
        known.update(self.remote_guids().values())
        return known

    def _lft_top(self) -> int:
        return max(self._routed())

    def route(self, switch: Entity, lid: int, routed: set[int] | None = None) -> int:
        """The port a switch forwards ``lid`` to (0: itself), as its linear
        forwarding table says; ``NO_PORT`` for a LID nobody has."""
        if lid == self.lid_of(switch):
            return 0
        if lid not in (routed if routed is not None else self._routed()):
            return smp.NO_PORT
        where = lids.owner(lid)
        target = -1 if where is None else where[0]  # -1: the spine (LID 1)
        if switch == SPINE:
            return target + 1
        if target == self.me and where is not None:
            return where[1]
        return self._uplink()

    def answer_perf(self, entity: Entity, request: bytes) -> bytes:
        """PerfMgt GetResp: counters of a local HCA (a switch's read zero); a
        Set of an HCA's PortCounters is answered like a Get once the service
        has cleared them."""
        attr = mad.attr_id(request)
        if smp.is_counter_reset(request) and entity[0] == "hca":
            pass  # the service has cleared them: answer with the counters as they are
        elif mad.method(request) != mad.METHOD_GET:
            return mad.response(request, mad.STATUS_UNSUP_METHOD_ATTR)
        if attr == smp.ATTR_CLASS_PORT_INFO:
            return mad.response(request, data=smp.perf_class_port_info())
        if attr == smp.ATTR_PORT_COUNTERS:
            port_select = request[64 + 1]
            counters = (
                self.read_counters(int(entity[2])) if entity[0] == "hca" else {}
            )
            return mad.response(request, data=smp.port_counters(port_select, counters))
        return mad.response(request, mad.STATUS_UNSUP_METHOD_ATTR)

    def answer_sa(self, request: bytes, requester_lid: int) -> bytes:
        """Subnet administration at the SM: PathRecord by destination GID."""
        if mad.attr_id(request) != smp.ATTR_PATH_RECORD or mad.method(request) != mad.METHOD_GET:
            return mad.response(request, mad.STATUS_UNSUP_METHOD_ATTR, data_offset=56)
        record = request[56 : 56 + 64]
        dgid, sgid = record[8:24], record[24:40]
        guid = int.from_bytes(dgid[8:16], "big")
        dlid = self.guid_lids().get(guid)
        if dlid is None:
            # SA status "no records" (0x0400... the class-specific ERR_NO_RECORDS).
            return mad.response(request, 0x0400, data_offset=56)
        rate = self.hcas[0].rate_gbps if self.hcas else 400
        answer = bytearray(mad.response(request, data_offset=56,
                                        data=smp.path_record(dgid, sgid, dlid,
                                                             requester_lid, rate)))
        answer[44:46] = (64 // 8).to_bytes(2, "big")  # AttributeOffset, in 8-byte words
        return bytes(answer)

    def guid_lids(self) -> dict[int, int]:
        """Port GUID → LID for every HCA this daemon knows of."""
        known = dict(self.remote_guids())
        known.update({hca.guid: hca.lid for hca in self.hcas})
        return known
