"""The relay: MADs between the daemons of one fabric, over TCP.

Each daemon listens on its relay port and dials every other node of the
fabric.  A dialled connection carries this daemon's messages to that peer;
an accepted one carries the peer's messages here, so each direction has its
own stream and neither side has to arbitrate.  Messages are length-prefixed
JSON (a 4-byte big-endian length, then the object; MADs as hex):

* ``hello``: the first message on every connection: the sender's node
  name, its fabric node list (must equal ours, else the connection is
  refused), and its HCAs' port GUIDs with their LIDs (what the SM's
  PathRecord answers and the switches' forwarding tables need); sent
  again whenever the sender's HCAs change (``announce``);
* ``req``: a MAD for an entity the receiver owns (see ``service.py``);
* ``resp``: the answer to a ``req``, sent back on the answerer's own
  dialled connection to the origin.

Liveness is event-driven, with no timers: a peer is live while our dialled
connection to it is open; its end-of-file (the peer stopped) marks it down
at once.  A peer that starts dials everyone, and an accepted hello from a
peer we have no connection to makes us dial it back, so a restarted daemon
is back in the fabric as soon as it is up.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

logger = logging.getLogger(__name__)

#: Bound on one dial: the peers are on the cluster network (or loopback).
DIAL_TIMEOUT = 3.0
#: A message larger than this is a protocol error (a MAD is 256 bytes).
MAX_MESSAGE = 64 * 1024


async def _send(stream: trio.SocketStream, message: Mapping[str, Any]) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    await stream.send_all(len(body).to_bytes(4, "big") + body)


async def _receive_exactly(stream: trio.SocketStream, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


async def receive(stream: trio.SocketStream) -> dict[str, Any] | None:
    """The next message, or ``None`` at end of stream; ``ValueError`` on garbage."""
    head = await _receive_exactly(stream, 4)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > MAX_MESSAGE:
        raise ValueError(f"relay message of {size} bytes, expected at most {MAX_MESSAGE}")
    body = await _receive_exactly(stream, size)
    if body is None:
        return None
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError("relay message is not a JSON object")
    return message


@attrs.define(eq=False)
class _Peer:
    stream: trio.SocketStream
    lock: trio.Lock = attrs.field(factory=trio.Lock)


@attrs.define(eq=False)
class Relay:
    """The relay of node ``me`` of ``nodes``; ``addresses[k]`` is node k's (host, port)."""

    nodes: tuple[str, ...]
    me: int
    addresses: Mapping[int, tuple[str, int]]
    listen: tuple[str, int]
    #: what this node says in its hello: port GUID → LID of its HCAs
    own_guids: Callable[[], Mapping[int, int]]
    #: called with (peer index, message) for every ``req``/``resp``
    on_message: Callable[[int, dict[str, Any]], Awaitable[None]]
    _out: dict[int, _Peer] = attrs.field(factory=dict, init=False)
    _guids: dict[int, dict[int, int]] = attrs.field(factory=dict, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _dialing: set[int] = attrs.field(factory=set, init=False)
    #: the port actually bound (``listen`` may ask for 0)
    port: int = attrs.field(default=0, init=False)

    def is_live(self, k: int) -> bool:
        return k in self._out

    def remote_guids(self) -> dict[int, int]:
        merged: dict[int, int] = {}
        for k, guids in self._guids.items():
            if self.is_live(k):
                merged.update(guids)
        return merged

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, dial every peer once, and serve until cancelled."""
        host, port = self.listen
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise OSError(exc.errno, f"--ib-relay-port: cannot listen on {host}:{port}: "
                          f"{exc.strerror or exc}") from exc
        try:
            self.port = listeners[0].socket.getsockname()[1]
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(trio.serve_listeners, self._accepted, listeners)
                for k in self.addresses:
                    nursery.start_soon(self._dial, k)
                task_status.started()
        finally:
            self._nursery = None
            for peer in self._out.values():
                await trio.aclose_forcefully(peer.stream)
            self._out.clear()
            for listener in listeners:
                await trio.aclose_forcefully(listener)

    def hello(self) -> dict[str, Any]:
        return {
            "t": "hello",
            "node": self.nodes[self.me],
            "nodes": list(self.nodes),
            "guids": {str(g): lid for g, lid in self.own_guids().items()},
        }

    async def _dial(self, k: int) -> None:
        """Connect to peer ``k`` (once; failures leave it down until it dials us)."""
        if k in self._out or k in self._dialing:
            return
        self._dialing.add(k)
        host, port = self.addresses[k]
        stream = None
        try:
            with trio.move_on_after(DIAL_TIMEOUT):
                stream = await trio.open_tcp_stream(host, port)
                await _send(stream, self.hello())
                peer = _Peer(stream)
                self._out[k] = peer
                logger.info("ib relay: connected to %s at %s:%d", self.nodes[k], host, port)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            logger.debug("ib relay: %s at %s:%d unreachable: %s", self.nodes[k], host, port, exc)
        finally:
            self._dialing.discard(k)
        if k in self._out and self._out[k].stream is stream:
            await self._watch(k, self._out[k])
        elif stream is not None:
            await trio.aclose_forcefully(stream)

    async def _watch(self, k: int, peer: _Peer) -> None:
        """The peer never writes on our dialled stream: end-of-file means it is gone."""
        try:
            while await peer.stream.receive_some(4096):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        if self._out.get(k) is peer:
            del self._out[k]
            logger.info("ib relay: %s went away (its links are down)", self.nodes[k])
        await trio.aclose_forcefully(peer.stream)

    async def send(self, k: int, message: Mapping[str, Any]) -> bool:
        """Send to peer ``k``; ``False`` when it is not live (the MAD is lost)."""
        peer = self._out.get(k)
        if peer is None:
            return False
        try:
            async with peer.lock:
                await _send(peer.stream, message)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            if self._out.get(k) is peer:
                del self._out[k]
            return False
        return True

    async def announce(self) -> None:
        """Tell every live peer this node's HCAs again (after a reload)."""
        for k in list(self._out):
            await self.send(k, self.hello())

    async def _accepted(self, stream: trio.SocketStream) -> None:
        """One peer's incoming stream: its hello, then its messages."""
        try:
            hello = await receive(stream)
            if hello is None or hello.get("t") != "hello":
                return
            if list(hello.get("nodes", [])) != list(self.nodes):
                logger.warning(
                    "ib relay: refusing %s: its fabric node list %s differs from ours %s",
                    hello.get("node"), hello.get("nodes"), list(self.nodes),
                )
                return
            k = self.nodes.index(str(hello["node"]))
            if k == self.me:
                raise ValueError(f"a peer calls itself {self.nodes[k]}, this node's name")
            self._guids[k] = {int(g): int(lid) for g, lid in dict(hello["guids"]).items()}
            if k not in self._out and k != self.me and self._nursery is not None:
                self._nursery.start_soon(self._dial, k)
            while (message := await receive(stream)) is not None:
                if message.get("t") == "hello":
                    self._guids[k] = {int(g): int(lid)
                                      for g, lid in dict(message["guids"]).items()}
                else:
                    await self.on_message(k, message)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                ValueError, KeyError, TypeError) as exc:
            logger.warning("ib relay: dropped a peer stream: %s", exc)
        finally:
            await trio.aclose_forcefully(stream)
