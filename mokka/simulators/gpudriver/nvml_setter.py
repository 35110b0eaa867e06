"""The daemon's side of the NVML setters: apply a ``SET`` and answer once it is in force.

``nvml_set`` says what a request changes; this module writes it into the
runtime overrides file (``Setter._write``, recorded as ``mokka ctl``
records it) and waits until the daemon's state, delivered by ``reload``
after the pass that staged the new engine config, holds it.  So when the
caller hears ``OK``, every process that reads the engine config next sees
the change.  Changes of one field race as on a board: the last write wins,
and a writer whose value another one replaced meanwhile is answered ``OK``
too (its write took place).

Only root may change the board: the peer's uid (``SO_PEERCRED``, as the
kernel maps it into the daemon's user namespace) must be 0.  Inside a
container with its own user namespace, "root" is the uid 0 of that
namespace, which maps to some other uid on the host: the daemon, in the
host's namespace, sees that uid (or the overflow uid) and refuses, as a
real driver refuses a user-namespaced root the CAP_SYS_ADMIN of the host.
"""

from __future__ import annotations

import logging
import re
import socket
import struct
from collections import Counter
from pathlib import Path

import attrs
import trio

from mokka import layout
from mokka.errors import MokkaError
from mokka.noderoot import File, Host
from mokka.simulators.gpudriver import nvml_set
from mokka.simulators.gpudriver.nvml_set import Change, Refusal, SetRequest
from mokka.state.model import State
from mokka.state.overrides import (
    FILE_MODE,
    MANIFEST_OWNERS,
    lock_path,
    records_locked,
    require_config_dir,
    update_overrides,
)

logger = logging.getLogger(__name__)

#: Seconds a change may take to be in force (a reconcile pass); the library
#: waits 10 s for the answer.
APPLY_TIMEOUT = 8.0
_PROCESS_COUNT = re.compile(rb"^device\.(\d+)\.process_count: *(\d+)\s*$", re.M)


def peer_uid(sock: trio.socket.SocketType) -> int | None:
    """The connected peer's uid as the kernel reports it; ``None`` when it cannot say."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", raw)
    return uid


@attrs.define(eq=False)
class Setter:
    """Applies ``SET`` requests against the newest state the daemon delivered."""

    host: Host
    state: State | None = None
    _delivered: trio.Event = attrs.field(factory=trio.Event, init=False)
    #: writes per (uuid, field path) so far: a waiter whose field was written
    #: again after it stops waiting for its own value
    _writes: Counter[tuple[str, str]] = attrs.field(factory=Counter, init=False)
    _lock: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1),
                                              init=False)
    #: MIG layout requests one at a time, each planned against the state the
    #: previous one left: two creates racing must not both take one placement
    _layout_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    def deliver(self, state: State) -> None:
        """The state of the pass just applied (``GpuDriverSimulator.reload``)."""
        self.state = state
        self._delivered.set()
        self._delivered = trio.Event()

    async def handle(self, request: SetRequest, uid: int | None) -> tuple[int, str]:
        """``(0, "")`` once the change is in force, else an NVML code and why."""
        if request.key.startswith("mig_"):
            async with self._layout_lock:
                return await self._handle(request, uid)
        return await self._handle(request, uid)

    async def _handle(self, request: SetRequest, uid: int | None) -> tuple[int, str]:
        if uid != 0:
            return nvml_set.NO_PERMISSION, "only root may change the GPU"
        state = self.state
        if state is None:
            return nvml_set.UNKNOWN, "the node is not staged yet"
        try:
            position, gpu = nvml_set.gpu_of(state, request.uuid)
            busy = await trio.to_thread.run_sync(self._process_count, position)
            listed = gpu.fields.get("processes")
            busy += len(listed) if isinstance(listed, list) else 0
            change = nvml_set.plan(gpu, request, processes=busy)
        except Refusal as refusal:
            return refusal.code, refusal.reason
        if not change.patch:
            return 0, ""
        keys = [(gpu.uuid, path) for path in _paths(change.patch)]
        try:
            await trio.to_thread.run_sync(self._write, gpu.uuid, change, limiter=self._lock)
        except (OSError, MokkaError) as exc:
            logger.warning("gpudriver: could not record an NVML setter's change: %s", exc)
            return nvml_set.UNKNOWN, "the change could not be recorded"
        for key in keys:
            self._writes[key] += 1
        mine = {key: self._writes[key] for key in keys}
        with trio.move_on_after(APPLY_TIMEOUT):
            while not self._in_force(gpu.uuid, change, mine):
                await self._delivered.wait()
            return 0, ""
        return nvml_set.UNKNOWN, f"recorded, but not in force within {APPLY_TIMEOUT} s"

    def _in_force(self, uuid: str, change: Change, mine: dict[tuple[str, str], int]) -> bool:
        if any(self._writes[key] != count for key, count in mine.items()):
            return True  # replaced by a later write: ours took place
        state = self.state
        if state is None:
            return False
        try:
            _, gpu = nvml_set.gpu_of(state, uuid)
        except Refusal:
            return True  # the GPU is gone: nothing left to wait for
        return change.applied(gpu.fields)

    def _write(self, uuid: str, change: Change) -> None:
        """The change into the overrides file, recorded first (blocking).

        As ``mokka ctl`` writes it: under ``records_locked``, the lock and
        the file converged through a ``Host`` of their own under
        ``MANIFEST_OWNERS`` (an empty lock before it exists, the new text
        as the file), so ``mokka cleanup`` after a killed daemon removes
        what this created and the daemon's reset never interleaves.
        """
        path = self.host.resolve(layout.OVERRIDES)
        root = self.host.root
        require_config_dir(path)
        with records_locked(path, root=root):
            host = Host(root)
            file_owner, lock_owner = MANIFEST_OWNERS
            host.converge(lock_owner, [File(lock_path(Path(layout.OVERRIDES)).as_posix(), b"",
                                            FILE_MODE)])
            update_overrides(
                path, lambda doc: nvml_set.apply_to(doc, uuid, change.patch), root=root,
                store=lambda text: host.converge(
                    file_owner, [File(layout.OVERRIDES, text, FILE_MODE)]),
            )

    def _process_count(self, position: int) -> int:
        """Processes holding the GPU at ``position`` in the staged workload file."""
        try:
            text = Path(self.host.resolve(layout.WORKLOAD_CONFIG)).read_bytes()
        except (OSError, MokkaError):
            return 0
        counts = {int(m[1]): int(m[2]) for m in _PROCESS_COUNT.finditer(text)}
        return counts.get(position, 0)


def _paths(patch: object, prefix: str = "") -> list[str]:
    if not isinstance(patch, dict):
        return [prefix]
    return [p for k, v in patch.items() for p in _paths(v, f"{prefix}.{k}" if prefix else k)]
