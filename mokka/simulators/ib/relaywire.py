"""The relay's wire: greetings, authenticated frames and the two handshakes.

A connection counts only once the other end has proved it holds a fabric
key (``relaykeys``): ``dial`` and ``accept`` run the two sides of that
proof and hand back a ``Channel``, which signs and checks every later
frame.  Who the other end is, and what its messages mean, is ``relay.py``'s.

Wire format (version 2).  On connecting, each side sends its greeting,
40 bytes: ``MAGIC`` (``MKIBRLY2``) and a fresh random 32-byte nonce.  Then
frames, each::

    length (4 bytes, big-endian: of the body) | body (JSON object) | tag (32 bytes)

    tag     = HMAC-SHA256(session, direction | sequence | body)
    session = HMAC-SHA256(key, "mokka-ib-relay/2" | dialler's nonce | acceptor's nonce)

``direction`` is one byte, ``D`` on frames the dialler sends, ``A`` on the
acceptor's; ``sequence`` is the frame's index in its direction, 8 bytes
big-endian from 0, counted by both ends and never sent.  Both nonces are
new on every connection, so a frame recorded on one fails on any other;
the sequence makes a frame replayed, dropped or moved within one fail.  A
frame that does not verify ends the connection.  What the frames say
(``hello``, ``welcome``, ``req``, ``resp``) is in ``relay.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

#: A frame body larger than this is a protocol error (a MAD is 256 bytes).
MAX_MESSAGE = 64 * 1024

MAGIC = b"MKIBRLY2"
NONCE_SIZE = 32
TAG_SIZE = 32
_LABEL = b"mokka-ib-relay/2"
DIALLER, ACCEPTOR = b"D", b"A"


class ProtocolError(ValueError):
    """What a relay stream sent cannot be taken: the stream is dropped."""


def session_key(key: bytes, dialler_nonce: bytes, acceptor_nonce: bytes) -> bytes:
    """The key of one connection's tags (see the module docstring)."""
    return hmac.new(key, _LABEL + dialler_nonce + acceptor_nonce, hashlib.sha256).digest()


def _tag(session: bytes, direction: bytes, sequence: int, body: bytes) -> bytes:
    return hmac.new(session, direction + sequence.to_bytes(8, "big") + body,
                    hashlib.sha256).digest()


def _no_constant(name: str) -> Any:
    raise ProtocolError(f"{name} in a relay message, expected finite numbers")


def decode(body: bytes) -> dict[str, Any]:
    """A frame body as a JSON object; ``ProtocolError`` for anything else."""
    try:
        message = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise ProtocolError("relay message nested too deep") from None
    except ValueError as exc:  # also UnicodeDecodeError, and digits past the int limit
        raise ProtocolError(f"relay message is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("relay message is not a JSON object")
    return message


async def _receive_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


async def read_greeting(stream: trio.abc.ReceiveStream) -> bytes:
    """The other end's nonce; ``ProtocolError`` for anything but a greeting."""
    data = await _receive_exactly(stream, len(MAGIC) + NONCE_SIZE)
    if data is None:
        raise ProtocolError("closed before its greeting")
    if not data.startswith(MAGIC):
        raise ProtocolError("no relay greeting (not a mokka-ib relay, or an older one)")
    return data[len(MAGIC):]


async def read_frame(stream: trio.abc.ReceiveStream) -> tuple[bytes, bytes] | None:
    """The next frame's (body, tag), unverified; ``None`` at end of stream."""
    head = await _receive_exactly(stream, 4)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > MAX_MESSAGE:
        raise ProtocolError(f"relay message of {size} bytes, expected at most {MAX_MESSAGE}")
    rest = await _receive_exactly(stream, size + TAG_SIZE)
    if rest is None:
        return None
    return rest[:size], rest[size:]


@attrs.define(eq=False)
class Channel:
    """One authenticated connection: tags and sequence numbers per direction."""

    stream: trio.SocketStream
    session: bytes
    #: direction byte of the frames this end sends (``DIALLER``/``ACCEPTOR``)
    sends: bytes
    _sent: int = attrs.field(default=0, init=False)
    _received: int = attrs.field(default=0, init=False)
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    @property
    def receives(self) -> bytes:
        return ACCEPTOR if self.sends == DIALLER else DIALLER

    def verifies(self, body: bytes, tag: bytes) -> bool:
        """Whether ``tag`` is the next frame's; counts it when it is."""
        if not hmac.compare_digest(tag, _tag(self.session, self.receives, self._received, body)):
            return False
        self._received += 1
        return True

    async def send(self, message: Mapping[str, Any]) -> None:
        body = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
        async with self._lock:
            tag = _tag(self.session, self.sends, self._sent, body)
            self._sent += 1
            await self.stream.send_all(len(body).to_bytes(4, "big") + body + tag)

    async def receive(self) -> dict[str, Any] | None:
        """The next verified message, or ``None`` at end of stream."""
        frame = await read_frame(self.stream)
        if frame is None:
            return None
        if not self.verifies(*frame):
            raise ProtocolError("a frame failed authentication (another key, or replayed)")
        return decode(frame[0])


async def dial(stream: trio.SocketStream, key: bytes, hello: Mapping[str, Any]
               ) -> tuple[Channel, dict[str, Any] | None]:
    """The dialler's side: greetings, ``hello`` signed under ``key``, and the
    acceptor's first message (its welcome, verified; ``None`` if it closed)."""
    nonce = secrets.token_bytes(NONCE_SIZE)
    await stream.send_all(MAGIC + nonce)
    theirs = await read_greeting(stream)
    channel = Channel(stream, session_key(key, nonce, theirs), sends=DIALLER)
    await channel.send(hello)
    return channel, await channel.receive()


async def accept(stream: trio.SocketStream, keys: Callable[[], tuple[bytes, ...]]
                 ) -> tuple[Channel, dict[str, Any]]:
    """The acceptor's side: greetings, then a hello that verifies under one of
    ``keys()`` (read once the hello is in); the channel and the hello."""
    nonce = secrets.token_bytes(NONCE_SIZE)
    await stream.send_all(MAGIC + nonce)
    theirs = await read_greeting(stream)
    frame = await read_frame(stream)
    if frame is None:
        raise ProtocolError("closed before its hello")
    for key in keys():
        channel = Channel(stream, session_key(key, theirs, nonce), sends=ACCEPTOR)
        if channel.verifies(*frame):
            break
    else:
        raise ProtocolError("its hello does not verify under the fabric key")
    return channel, decode(frame[0])
