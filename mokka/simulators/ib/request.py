"""A MAD on its way between daemons: the relay's ``req`` message, checked.

A request is routed where it stands (``service.py``); when its next step is
another daemon's, the relay carries it as a ``req`` (``Request.to_message``).
What a peer sends is checked before anything is routed
(``Request.from_message``): only integers in range, entities of this
fabric, a directed route of at most 63 hops, and a 256-byte MAD with
either a LID or a route.
"""

from __future__ import annotations

from typing import Any

import attrs

from mokka.simulators.ib import mad
from mokka.simulators.ib.fabric import SPINE, UPLINK, Walked


@attrs.frozen(kw_only=True)
class Request:
    """A MAD on its way, wherever it is being routed."""

    id: int
    #: node index of the daemon whose tool sent it
    origin: int
    slid: int
    mad: bytes
    #: LID-routed destination, or ``None`` for a directed route
    dlid: int | None = None
    #: directed route: where the walk stands
    walk: Walked | None = None

    def to_message(self) -> dict[str, Any]:
        walk = None
        if self.walk is not None:
            walk = [list(self.walk.entity), self.walk.arrival, list(self.walk.hops)]
        return {"t": "req", "id": self.id, "origin": self.origin, "slid": self.slid,
                "dlid": self.dlid, "walk": walk, "mad": self.mad.hex()}

    @classmethod
    def from_message(cls, message: dict[str, Any], nodes: int) -> Request:
        """A ``req`` from a peer of a fabric of ``nodes`` nodes; ``ValueError``
        for anything a daemon of this fabric would not send."""
        try:
            walk = None
            if message.get("walk") is not None:
                entity, arrival, hops = message["walk"]
                walk = Walked(entity=_entity(entity, nodes), arrival=_arrival(arrival),
                              hops=_hops(hops))
            raw = bytes.fromhex(message["mad"])
            dlid = message.get("dlid")
            request = cls(id=checked_int(message["id"], 1 << 63),
                          origin=checked_int(message["origin"], nodes),
                          slid=checked_int(message["slid"], 0x10000), mad=raw,
                          dlid=None if dlid is None else checked_int(dlid, 0x10000), walk=walk)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed relay request: {exc!r}") from exc
        if len(raw) != mad.MAD_SIZE or (walk is None) == (request.dlid is None):
            raise ValueError("malformed relay request: a 256-byte MAD with a LID or a route")
        return request


def checked_int(value: Any, bound: int) -> int:
    """``value`` when it is an integer in ``[0, bound)``; ``ValueError`` if not."""
    if type(value) is not int or not 0 <= value < bound:
        raise ValueError(f"{value!r} is not an integer below {bound}")
    return value


def _entity(value: Any, nodes: int) -> tuple[str | int, ...]:
    entity = tuple(value)
    if entity == SPINE:
        return entity
    if len(entity) == 2 and entity[0] == "leaf":
        return ("leaf", checked_int(entity[1], nodes))
    if len(entity) == 3 and entity[0] == "hca":
        return ("hca", checked_int(entity[1], nodes), checked_int(entity[2], 256))
    raise ValueError(f"{value!r} is no entity of the fabric")


def _arrival(value: Any) -> int | str:
    return UPLINK if value == UPLINK else checked_int(value, 256)


def _hops(value: Any) -> tuple[int, ...]:
    hops = tuple(checked_int(h, 256) for h in value)
    if len(hops) > 63:
        raise ValueError("a directed route has at most 63 hops")
    return hops
