"""The relay: MADs between the daemons of one fabric, over TCP, between key holders.

Each daemon listens on its relay port and dials every other node of the
fabric.  A dialled connection carries this daemon's messages to that peer;
an accepted one carries the peer's messages here, so each direction has its
own stream and neither side has to arbitrate.

Who is a peer.  The fabric's daemons share one secret key (the file
``--ib-relay-key-file``, a Kubernetes Secret on a cluster; ``docs/ib.md``
says how it is provisioned and rotated).  A connection counts only once
the other end has proved it holds the key, on both sides: an accepted
stream whose hello does not verify is dropped before anything in it is
read, and a dialled peer is live only once it has answered with a frame
only a key holder can make, so whoever holds the address of a peer that is
down cannot stand in for it.  The node names come from the topology
document: a hello from a name that is not in the fabric is refused.  The
relay is the simulator's integrity check between nodes, not a security
boundary for real InfiniBand (see the threat model in ``docs/ib.md``).

The handshakes and the frames are ``relaywire``'s (its docstring has the
wire format); the key file is ``relaykeys``'s.  The frames:

* ``hello`` (the dialler's frame 0, and again whenever its HCAs change:
  ``announce``): the sender's node name, its fabric node list (must equal
  ours: the two would disagree on LIDs), and its HCAs' port GUIDs with
  their LIDs (what the SM's PathRecord answers and the switches'
  forwarding tables need);
* ``welcome`` (the acceptor's frame 0, its only one): its node name, sent
  once the hello verified; the dialler counts the peer live on it;
* ``req``: a MAD for an entity the receiver owns (see ``request.py``);
* ``resp``: the answer to a ``req``, sent back on the answerer's own
  dialled connection to the origin, which takes it only from the peer it
  sent that request to.

Liveness is event-driven: a peer is live while our dialled connection to
it is open; its end-of-file (the peer stopped) marks it down at once.  A
peer that starts dials everyone, and a verified hello from a peer we have
no connection to makes us dial it back, so a restarted daemon is back in
the fabric as soon as it is up.  The only timers bound what a stranger
can hold: the greeting and hello must arrive within ``HELLO_TIMEOUT``, at
most ``MAX_UNVERIFIED`` connections may wait for theirs, each peer keeps
one accepted stream, a peer that stops reading is dropped after
``SEND_TIMEOUT``, and running out of descriptors in ``accept`` backs off
instead of failing.  What a stream sends that the relay cannot take (a
bad tag, deep or non-finite JSON, a frame over ``relaywire.MAX_MESSAGE``)
drops that stream alone, with one rate-limited log line.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from mokka.errors import SpecError
from mokka.loglimit import LogLimit
from mokka.simulators.ib import relaywire
from mokka.simulators.ib.relaykeys import load_keys
from mokka.simulators.ib.relaywire import Channel, ProtocolError

logger = logging.getLogger(__name__)

#: Bound on one dial, greeting, hello and welcome: the peers are on the
#: cluster network (or loopback).
DIAL_TIMEOUT = 3.0
#: Seconds an accepted connection has for its greeting and verified hello;
#: a peer needs milliseconds, a stranger holding a connection open gets no more.
HELLO_TIMEOUT = 5.0
#: Accepted connections waiting for their hello at once; more are closed as
#: soon as they are accepted (a peer's hello takes one round trip).
MAX_UNVERIFIED = 64
#: Seconds a send to a peer may take; a peer that stops reading is dropped
#: (its MADs time out) rather than holding up the service.
SEND_TIMEOUT = 5.0
#: First and longest pause of ``accept`` when the process is out of
#: descriptors (or memory): clients close theirs meanwhile.
ACCEPT_BACKOFF = (0.1, 2.0)
_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: HCAs a hello may announce (a node has a few; the bound keeps a hello small).
MAX_HCAS = 256


def _guids(message: Mapping[str, Any]) -> dict[int, int]:
    """A hello's port GUID → LID map, checked: decimal GUIDs under 2**64, unicast LIDs."""
    guids = message.get("guids")
    if not isinstance(guids, dict) or len(guids) > MAX_HCAS:
        raise ProtocolError(f"hello without a map of at most {MAX_HCAS} port GUIDs to LIDs")
    checked: dict[int, int] = {}
    for guid, lid in guids.items():
        if not (isinstance(guid, str) and guid.isascii() and guid.isdigit() and len(guid) <= 20
                and int(guid) < 1 << 64 and type(lid) is int and 0 < lid < 0xC000):
            raise ProtocolError(f"hello names port GUID {guid!r} at LID {lid!r}, expected a "
                                "64-bit GUID in decimal and a unicast LID")
        checked[int(guid)] = lid
    return checked


@attrs.define(eq=False)
class Relay:
    """The relay of node ``me`` of ``nodes``; ``addresses[k]`` is node k's (host, port)."""

    nodes: tuple[str, ...]
    me: int
    addresses: Mapping[int, tuple[str, int]]
    listen: tuple[str, int]
    #: what this node says in its hello: port GUID → LID of its HCAs
    own_guids: Callable[[], Mapping[int, int]]
    #: called with (peer index, message) for every verified ``req``/``resp``
    on_message: Callable[[int, dict[str, Any]], Awaitable[None]]
    #: the fabric's key file (``load_keys``), read at start and again for every
    #: connection, so a rotated Secret takes effect without a restart
    key_file: Path | None = None
    _out: dict[int, Channel] = attrs.field(factory=dict, init=False)
    #: each peer's one accepted stream (a newer one replaces it)
    _in: dict[int, Channel] = attrs.field(factory=dict, init=False)
    _guids: dict[int, dict[int, int]] = attrs.field(factory=dict, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _dialing: set[int] = attrs.field(factory=set, init=False)
    #: accepted connections still waiting for a verified hello
    _unverified: int = attrs.field(default=0, init=False)
    _dropped: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)
    _refused: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)
    #: the port actually bound (``listen`` may ask for 0)
    port: int = attrs.field(default=0, init=False)

    @property
    def unverified(self) -> int:
        """Accepted connections waiting for their hello now (bounded by ``MAX_UNVERIFIED``)."""
        return self._unverified

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
            # No peer is taken before the key is known to be good: a missing,
            # short or unreadable key fails the start, in one line.
            load_keys(self.key_file)
            self.port = listeners[0].socket.getsockname()[1]
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for listener in listeners:
                    nursery.start_soon(self._serve, listener, nursery)
                for k in self.addresses:
                    nursery.start_soon(self._dial, k)
                task_status.started()
        finally:
            self._nursery = None
            # Shielded: on the way down each close is a checkpoint, which would
            # raise the cancellation again after the first and leak the rest.
            with trio.CancelScope(shield=True):
                for channel in [*self._out.values(), *self._in.values()]:
                    await trio.aclose_forcefully(channel.stream)
                for listener in listeners:
                    await trio.aclose_forcefully(listener)
            self._out.clear()
            self._in.clear()
            self._dropped.flush()
            self._refused.flush()

    async def _serve(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        """Accept until cancelled; out of descriptors, back off and go on."""
        backoff = ACCEPT_BACKOFF[0]
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in _CAPACITY_ERRNOS:
                    raise
                self._refused.warning("ib relay: cannot accept a connection (%s); retrying "
                                      "in %gs", os.strerror(exc.errno), backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, ACCEPT_BACKOFF[1])
                continue
            backoff = ACCEPT_BACKOFF[0]
            if self._unverified >= MAX_UNVERIFIED:
                self._refused.warning("ib relay: refused a connection from %s: %d are waiting "
                                      "for their hello already", _remote(stream), MAX_UNVERIFIED)
                await trio.aclose_forcefully(stream)
                continue
            self._unverified += 1
            nursery.start_soon(self._accepted, stream)

    def hello(self) -> dict[str, Any]:
        return {
            "t": "hello",
            "node": self.nodes[self.me],
            "nodes": list(self.nodes),
            "guids": {str(g): lid for g, lid in self.own_guids().items()},
        }

    def _keys(self) -> tuple[bytes, ...]:
        try:
            return load_keys(self.key_file)
        except SpecError as exc:
            # The file went bad under a running relay (a half-made rotation):
            # connections fail until it is mended; the relay stays up.
            raise ProtocolError(str(exc)) from None

    async def _dial(self, k: int) -> None:
        """Connect to peer ``k`` and have it prove the key (once; failures
        leave it down until it dials us)."""
        if k in self._out or k in self._dialing:
            return
        self._dialing.add(k)
        host, port = self.addresses[k]
        stream = channel = None
        try:
            with trio.fail_after(DIAL_TIMEOUT):
                key = self._keys()[0]
                stream = await trio.open_tcp_stream(host, port)
                channel, welcome = await relaywire.dial(stream, key, self.hello())
                if welcome != {"t": "welcome", "node": self.nodes[k]}:
                    raise ProtocolError(f"answered {welcome!r:.80}, expected the welcome of "
                                        f"{self.nodes[k]}")
                self._out[k] = channel
                logger.info("ib relay: connected to %s at %s:%d", self.nodes[k], host, port)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            logger.debug("ib relay: %s at %s:%d unreachable: %s", self.nodes[k], host, port, exc)
        except (ProtocolError, trio.TooSlowError) as exc:
            # Something answers at the peer's address but does not prove the
            # key: not our peer (or one with another key); it stays down.
            self._refused.warning("ib relay: %s at %s:%d is not taken as a peer: %s",
                                  self.nodes[k], host, port,
                                  exc if str(exc) else "it did not answer with the fabric key "
                                  f"within {DIAL_TIMEOUT:g}s")
        finally:
            self._dialing.discard(k)
        if channel is not None and self._out.get(k) is channel:
            await self._watch(k, channel)
        elif stream is not None:
            await trio.aclose_forcefully(stream)

    async def _watch(self, k: int, channel: Channel) -> None:
        """The peer never writes after its welcome: end-of-file means it is gone."""
        try:
            while await channel.stream.receive_some(4096):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        if self._out.get(k) is channel:
            del self._out[k]
            logger.info("ib relay: %s went away (its links are down)", self.nodes[k])
        await trio.aclose_forcefully(channel.stream)

    async def send(self, k: int, message: Mapping[str, Any]) -> bool:
        """Send to peer ``k``; ``False`` when it is not live (the MAD is lost)."""
        channel = self._out.get(k)
        if channel is None:
            return False
        try:
            with trio.fail_after(SEND_TIMEOUT):
                await channel.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                trio.TooSlowError) as exc:
            if self._out.get(k) is channel:
                del self._out[k]
                logger.info("ib relay: %s went away (%s)", self.nodes[k],
                            exc if str(exc) else f"it read nothing for {SEND_TIMEOUT:g}s")
            # Half a frame may have gone: the stream cannot carry another.
            await trio.aclose_forcefully(channel.stream)
            return False
        return True

    async def announce(self) -> None:
        """Tell every live peer this node's HCAs again (after a reload)."""
        for k in list(self._out):
            await self.send(k, self.hello())

    def _peer_of(self, hello: Mapping[str, Any]) -> int:
        """The fabric node a verified hello comes from; ``ProtocolError`` if none."""
        if hello.get("t") != "hello":
            raise ProtocolError(f"first message is {hello.get('t')!r:.40}, expected a hello")
        if hello.get("nodes") != list(self.nodes):
            raise ProtocolError(f"its fabric node list {hello.get('nodes')!r:.200} differs "
                                f"from ours {list(self.nodes)}")
        node = hello.get("node")
        if node not in self.nodes:
            raise ProtocolError(f"{node!r:.80} is not a node of the fabric")
        k = self.nodes.index(node)
        if k == self.me:
            raise ProtocolError(f"a peer calls itself {node}, this node's name")
        return k

    async def _verify(self, stream: trio.SocketStream) -> tuple[int, Channel]:
        """Greetings, then a hello that verifies under a key of ours; the welcome."""
        channel, hello = await relaywire.accept(stream, self._keys)
        k = self._peer_of(hello)
        self._guids[k] = _guids(hello)
        await channel.send({"t": "welcome", "node": self.nodes[self.me]})
        return k, channel

    async def _accepted(self, stream: trio.SocketStream) -> None:
        """One peer's incoming stream: its proof and hello, then its messages."""
        remote = _remote(stream)
        k: int | None = None
        channel: Channel | None = None
        try:
            try:
                with trio.move_on_after(HELLO_TIMEOUT):
                    k, channel = await self._verify(stream)
            finally:
                self._unverified -= 1
            if k is None or channel is None:
                raise ProtocolError(f"no verified hello within {HELLO_TIMEOUT:g}s")
            replaced = self._in.get(k)
            self._in[k] = channel
            if replaced is not None:
                await trio.aclose_forcefully(replaced.stream)
            if k not in self._out and k in self.addresses and self._nursery is not None:
                self._nursery.start_soon(self._dial, k)
            while (message := await channel.receive()) is not None:
                if message.get("t") == "hello":
                    if message.get("node") != self.nodes[k]:
                        raise ProtocolError(f"{self.nodes[k]} says hello as "
                                            f"{message.get('node')!r:.80}")
                    self._guids[k] = _guids(message)
                else:
                    await self.on_message(k, message)
        except trio.ClosedResourceError:
            pass  # replaced by the peer's newer stream, or the relay is stopping
        except (ProtocolError, trio.BrokenResourceError, OSError) as exc:
            self._dropped.warning("ib relay: dropped a connection from %s: %s",
                                  self.nodes[k] if k is not None else remote, exc)
        except Exception as exc:
            # A message that trips the service: that stream goes, the relay stays.
            self._dropped.warning("ib relay: dropped a connection from %s: %s: %s",
                                  self.nodes[k] if k is not None else remote,
                                  type(exc).__name__, exc)
        finally:
            if k is not None and self._in.get(k) is channel:
                del self._in[k]
            await trio.aclose_forcefully(stream)


def _remote(stream: trio.SocketStream) -> str:
    try:
        host, port, *_ = stream.socket.getpeername()
    except (OSError, ValueError):
        return "an unknown address"
    return f"{host}:{port}"
