"""The NVML socket: the engine config for libraries that have none beside them.

A container whose CDI spec another tool wrote (``nvidia-ctk cdi generate
--driver-root``, the device plugin's ``cdi-annotations``/``cdi-cri``
strategies, the DRA driver) gets the mock library, ``nvidia-smi`` and the
device nodes, but not the engine config's directory.  What those tools do
mount, when it exists under the driver root, is nvidia-persistenced's
socket (the toolkit's IPC discoverer: ``/run/nvidia-persistenced/socket``,
then ``/var/run/...``, at the same path in the container).  So the daemon
listens there, ``<driver root>/run/nvidia-persistenced/socket``, inside
the tree ``/run/nvidia/driver`` publishes, and the library, finding no file
beside itself, asks it for the files (``native/nvml/remote.c``).

The protocol (docs/engine-config.md, "Over the socket") is one request per
connection::

    MOKKA-NVML 1 GET <token>\\n            (token: the files the client has, or -)
    MOKKA-NVML 1 UNCHANGED <token>\\n
    MOKKA-NVML 1 OK <token> <config bytes> <workload bytes>\\n<config><workload>
    MOKKA-NVML 1 ERROR <reason>\\n

and, for the setters, ``MOKKA-NVML 1 SET <uuid> <key> <value>`` answered
``OK`` or ``ERROR <nvml code> <reason>`` once the change is in force
(``nvml_setter``; the only request that writes, and only for root).

The answer is the staged files as they are on disk at the request: the
token is a digest of both files' identity (device, inode, size, mtime,
ctime, as the library's stat schedule compares them), taken from the
descriptors the bytes are then read from, so a token never names older
bytes than it came with.  The bytes are kept for the newest token only, so
clients asking every 250 ms cost a stat of two files each, not a read.

A client decides nothing here but the token it sends: the two paths are
fixed node paths resolved through ``Host`` (which refuses one that leaves
the root) and opened without following a link at the end, and nothing is
ever written but the answer.  Whoever connects is bounded: a request line
of at most ``MAX_REQUEST`` bytes, ``MAX_CONNECTIONS`` at once (more are
closed at once), ``DEADLINE`` seconds for the whole exchange (a client that
never sends or never reads is dropped), and what goes wrong is logged
through ``LogLimit`` (a line, then a count).

The socket is recorded in the manifest of ``RUN_OWNER`` *before* it is
bound (an empty file converged at its path, then replaced by the socket),
as the ``mock-ib`` socket is, so ``mokka cleanup`` after a SIGKILL removes
it and the directories made for it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import socket
import stat
from pathlib import Path

import attrs
import trio

from mokka import layout
from mokka.errors import MokkaError
from mokka.loglimit import LogLimit
from mokka.noderoot import File, Host
from mokka.simulators import unixsocket
from mokka.simulators.gpudriver import nvml_set
from mokka.simulators.gpudriver.nvml_setter import APPLY_TIMEOUT, Setter, peer_uid

logger = logging.getLogger(__name__)

#: Where nvidia-persistenced's socket is under the driver root: what the
#: toolkit's IPC discoverer finds first and mounts at ``/run/nvidia-persistenced/socket``.
SOCKET = f"{layout.DRIVER_ROOT}/run/nvidia-persistenced/socket"
#: Manifest owner of the socket (not a stage batch: each stage converges its
#: batches to exactly their plans, which would put a file over the socket).
RUN_OWNER = "gpudriver-run"
#: Anyone may connect, as to nvidia-persistenced's own socket: NVML clients
#: in containers run as any user, and the answer is what the library file
#: beside a host's driver would let them read anyway.
SOCKET_MODE = 0o666
#: The request line's most bytes, newline included (``GET`` and a 32-digit
#: token fit in 64; ``SET``, a UUID, a key and a value in 124).
MAX_REQUEST = 160
#: Connections served at once; a flood beyond is closed on accept.  A
#: client holds one for a few milliseconds every 250 ms at most.
MAX_CONNECTIONS = 64
#: Seconds one exchange may take from accept to the last byte sent.  The
#: library gives up after 0.2 s; this only reclaims a connection whose
#: client stalls.
DEADLINE = 2.0
#: The most bytes served of one file: the library's own limit (``MOCK_MAX_CONFIG_BYTES``).
MAX_FILE_BYTES = 16 << 20
#: Seconds the listener waits before accepting again when out of descriptors.
ACCEPT_RETRY = 0.5

_PROTOCOL = b"MOKKA-NVML 1"
_REQUEST = re.compile(rb"MOKKA-NVML 1 GET (-|[0-9a-f]{1,32})\n\Z")
_ACCEPT_LATER = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class NotServable(Exception):
    """The engine config cannot be served now (not staged, not a regular file, too large)."""


@attrs.frozen
class Snapshot:
    """The files as one answer gives them: the token and both files' bytes."""

    token: str
    config: bytes
    workload: bytes


def _open_regular(path: Path) -> tuple[int, os.stat_result] | None:
    """A descriptor of the regular file at ``path`` and its stat; ``None`` when absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise NotServable(f"{path.name}: {os.strerror(exc.errno or 0)}") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
        os.close(fd)
        raise NotServable(f"{path.name}: not a regular file of at most {MAX_FILE_BYTES} bytes")
    return fd, st


def _read(fd: int, size: int) -> bytes:
    """At most ``size`` bytes (the size fstat gave; a file cut meanwhile gives fewer)."""
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _stamp(st: os.stat_result | None) -> tuple[int, ...]:
    if st is None:
        return (0,)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@attrs.define(eq=False)
class FileReader:
    """The staged engine config and workload file, re-checked at each call (blocking)."""

    host: Host
    _newest: Snapshot | None = attrs.field(default=None, init=False)

    def snapshot(self) -> Snapshot:
        """The files as they are now; raises ``NotServable`` when the config is not there."""
        opened = []
        try:
            for node_path in (layout.ENGINE_CONFIG, layout.WORKLOAD_CONFIG):
                try:
                    path = self.host.resolve(node_path)
                except MokkaError as exc:  # a link on the way leads out of the root
                    raise NotServable(str(exc)) from exc
                opened.append(_open_regular(path))
            config, workload = opened
            if config is None:
                raise NotServable("the engine config is not staged")
            digest = hashlib.blake2b(
                repr((_stamp(config[1]), _stamp(workload and workload[1]))).encode(),
                digest_size=8,
            )
            token = digest.hexdigest()
            newest = self._newest
            if newest is not None and newest.token == token:
                return newest
            self._newest = Snapshot(
                token=token,
                config=_read(config[0], config[1].st_size),
                workload=_read(workload[0], workload[1].st_size) if workload else b"",
            )
            return self._newest
        finally:
            for entry in opened:
                if entry is not None:
                    os.close(entry[0])


def parse_request(line: bytes) -> str | None:
    """The token a request line names (``-``: none), or ``None`` when it is malformed."""
    match = _REQUEST.match(line)
    return match.group(1).decode() if match else None


def answer(have: str, snapshot: Snapshot | Exception) -> tuple[bytes, ...]:
    """The reply to a client that has the files of token ``have``, as the pieces to send."""
    if isinstance(snapshot, Exception):
        reason = str(snapshot).encode(errors="replace")[:200].replace(b"\n", b" ")
        return (_PROTOCOL + b" ERROR " + reason + b"\n",)
    if have == snapshot.token:
        return (_PROTOCOL + b" UNCHANGED " + snapshot.token.encode() + b"\n",)
    header = b"%s OK %s %d %d\n" % (
        _PROTOCOL, snapshot.token.encode(), len(snapshot.config), len(snapshot.workload))
    return (header, snapshot.config, snapshot.workload)


_MALFORMED = (_PROTOCOL + b" ERROR malformed request\n",)
_SET_PREFIX = _PROTOCOL + b" SET "


@attrs.define(eq=False)
class NvmlSocketServer:
    """Serves the files at the socket until cancelled; see the module docstring."""

    host: Host
    #: applies ``SET`` requests; ``None``: every ``SET`` is refused as unknown
    setter: Setter | None = None
    _files: FileReader = attrs.field(init=False)
    #: one file check at a time: a flood of clients queues here, never
    #: reads the same files many times over at once
    _limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1),
                                                 init=False)
    _connections: int = attrs.field(default=0, init=False)
    _junk_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)
    _refused_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)
    _slow_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)
    _accept_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)
    _unservable_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)
    _set_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)

    def __attrs_post_init__(self) -> None:
        self._files = FileReader(self.host)

    @property
    def connections(self) -> int:
        """Connections being served now."""
        return self._connections

    async def serve(self, *, task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Record, bind and serve the socket until cancelled; it goes with the server.

        ``task_status.started`` gets the socket's real path once it accepts.
        """
        path = await trio.to_thread.run_sync(record_socket, self.host)
        listener, dirfd, address = await trio.to_thread.run_sync(_listen, path)
        sock = trio.socket.from_stdlib_socket(listener)
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(path)
                logger.info("gpudriver: engine config served at %s", SOCKET)
                while True:
                    try:
                        client, _ = await sock.accept()
                    except OSError as exc:
                        if exc.errno not in _ACCEPT_LATER:
                            raise
                        self._accept_log.warning(
                            "gpudriver: cannot accept an NVML client's connection (%s); "
                            "accepting again in %.1f s", os.strerror(exc.errno), ACCEPT_RETRY)
                        await trio.sleep(ACCEPT_RETRY)
                        continue
                    if self._connections >= MAX_CONNECTIONS:
                        client.close()
                        self._refused_log.warning(
                            "gpudriver: refused an NVML client's connection: %d are connected, "
                            "the most served", self._connections)
                        continue
                    self._connections += 1
                    nursery.start_soon(self._serve_one, client)
        finally:
            sock.close()
            for log in (self._junk_log, self._refused_log, self._slow_log, self._accept_log,
                        self._unservable_log, self._set_log):
                log.flush()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_unlisten, dirfd, address)
                await trio.to_thread.run_sync(forget_socket, self.host)

    async def _serve_one(self, client: trio.socket.SocketType) -> None:
        try:
            with trio.move_on_after(DEADLINE) as scope:
                line = await _read_line(client)
                if line is not None and line.startswith(_SET_PREFIX):
                    scope.deadline = trio.current_time() + APPLY_TIMEOUT + DEADLINE
                    await self._serve_set(client, line)
                    return
                have = None if line is None else parse_request(line)
                if have is None:
                    self._junk_log.warning(
                        "gpudriver: an NVML client sent no request line of this protocol "
                        "(at most %d bytes)", MAX_REQUEST)
                    await _send(client, _MALFORMED)
                    return
                snapshot: Snapshot | Exception
                try:
                    snapshot = await trio.to_thread.run_sync(
                        self._files.snapshot, limiter=self._limiter)
                except (NotServable, OSError) as exc:
                    self._unservable_log.warning("gpudriver: cannot serve the engine config: %s",
                                                 exc)
                    snapshot = exc
                await _send(client, answer(have, snapshot))
            if scope.cancelled_caught:
                self._slow_log.warning("gpudriver: dropped an NVML client that took over %.1f s",
                                       DEADLINE)
        except OSError as exc:
            # The client went away mid-answer: its business, not the daemon's.
            logger.debug("gpudriver: NVML client connection failed: %s", exc)
        finally:
            self._connections -= 1
            client.close()


    async def _serve_set(self, client: trio.socket.SocketType, line: bytes) -> None:
        request = nvml_set.parse_set(line)
        if request is None or self.setter is None:
            self._junk_log.warning(
                "gpudriver: an NVML client sent a SET request this daemon does not take "
                "(at most %d bytes of a UUID, a key and a value)", MAX_REQUEST)
            code, reason = nvml_set.INVALID_ARGUMENT, "malformed request"
        else:
            code, reason = await self.setter.handle(request, peer_uid(client))
            if code:
                # a warning, rate-limited: a refusal is the caller's business,
                # but a flood of them (a non-root loop) must not fill the log
                self._set_log.warning("gpudriver: refused %s=%s on %s: %s", request.key,
                                      request.value, request.uuid, reason)
            else:
                logger.info("gpudriver: %s set to %s on %s", request.key, request.value,
                            request.uuid)
        reply = (_PROTOCOL + b" OK\n" if not code else
                 b"%s ERROR %d %s\n" % (_PROTOCOL, code, reason.encode(errors="replace")[:100]))
        await _send(client, (reply,))


async def _read_line(client: trio.socket.SocketType) -> bytes | None:
    """The request line, newline included; ``None`` past ``MAX_REQUEST`` bytes or at EOF."""
    data = b""
    while b"\n" not in data:
        if len(data) >= MAX_REQUEST:
            return None
        chunk = await client.recv(MAX_REQUEST - len(data))
        if not chunk:
            return None
        data += chunk
    return data


async def _send(client: trio.socket.SocketType, pieces: tuple[bytes, ...]) -> None:
    for piece in pieces:
        view = memoryview(piece)
        while view:
            sent = await client.send(view[: 1 << 20])
            view = view[sent:]


def record_socket(host: Host) -> Path:
    """Record the socket under ``RUN_OWNER`` before it exists; its real path (blocking).

    A socket already there is a killed daemon's (the node lock keeps a
    second daemon off the root): it goes first.
    """
    remove_stale_socket(host)
    host.converge(RUN_OWNER, [File(SOCKET, b"", SOCKET_MODE)])
    return host.resolve(SOCKET)


def forget_socket(host: Host) -> None:
    """Drop the socket's record, and the directories made for it (blocking)."""
    try:
        host.discard(RUN_OWNER)
    except (OSError, MokkaError) as exc:
        # The record stays, so the simulator's discard or ``mokka cleanup``
        # removes what is left.
        logger.warning("gpudriver: could not drop the record of %s: %s", SOCKET, exc)


def remove_stale_socket(host: Host) -> None:
    """Remove a socket a killed daemon left at ``SOCKET`` (blocking; no daemon may run)."""
    with contextlib.suppress(MokkaError, OSError):
        path = host.resolve(SOCKET)
        if path.is_socket():
            path.unlink()


def _listen(path: Path) -> tuple[socket.socket, int, str]:
    """Bind and listen at ``path`` (blocking): a stream socket anyone may
    connect to, with a backlog of ``MAX_CONNECTIONS``."""
    return unixsocket.listen(path, socket.SOCK_STREAM, mode=SOCKET_MODE,
                             backlog=MAX_CONNECTIONS)


_unlisten = unixsocket.unlisten
