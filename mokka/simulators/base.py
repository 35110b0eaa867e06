"""The three interfaces the reconciler drives.

Every simulator is a ``Simulator``; some are also ``Applier`` (they publish
something an outside party acts on: containerd, NFD, the GPU Operator) or
``Daemon`` (they supervise a long-lived loop).  The reconciler checks
membership with ``isinstance`` (the protocols are runtime-checkable), so a
simulator opts in simply by having the methods.

Contract, in the order the reconciler calls things (ARCHITECTURE sections 3 and 4):

* ``retract(host, state)`` (optional, ``Retractor``): before the Stage wave,
  for appliers whose published artifacts name what other simulators stage
  (the CDI specs): stop naming whatever staging ``state`` will remove, so
  nothing published ever points at a missing path ("before them on the way
  down").  A failure counts as that simulator's stage failure.

* ``stage(host, state)``: write artifacts that are not yet externally
  visible; idempotent; converges (removes what ``state`` no longer calls
  for).  Raises on failure; the Stage wave records the error.
* ``run(host, state, task_status=...)``: only after a successful Stage wave,
  once; signals readiness with ``task_status.started()``; later states arrive
  through ``reload(state)``.
* ``apply(host, state)`` / ``revoke(host)``: publish / stop publishing.
* ``discard(host)``: remove what ``stage`` wrote, also after a crash (every
  write goes through ``Host.converge`` and its manifest).
* ``readiness`` is read by ``/readyz`` at any time and must not block.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs
import trio

from mokka.noderoot import Host

if TYPE_CHECKING:
    from mokka.state.model import State


@attrs.frozen
class Readiness:
    """Whether a simulator serves what consumers need, and if not, why."""

    ready: bool
    reason: str = ""

    @classmethod
    def ok(cls, reason: str = "") -> Readiness:
        return cls(True, reason)

    @classmethod
    def not_ready(cls, reason: str) -> Readiness:
        return cls(False, reason)


@runtime_checkable
class Simulator(Protocol):
    #: Stable, lower-case name used in logs, health bodies, metrics and manifests.
    name: str

    async def stage(self, host: Host, state: State) -> None: ...

    async def discard(self, host: Host) -> None: ...

    @property
    def readiness(self) -> Readiness: ...


@runtime_checkable
class Applier(Protocol):
    async def apply(self, host: Host, state: State) -> None: ...

    async def revoke(self, host: Host) -> None: ...


@runtime_checkable
class Retractor(Protocol):
    async def retract(self, host: Host, state: State) -> None: ...


@runtime_checkable
class Daemon(Protocol):
    async def run(
        self,
        host: Host,
        state: State,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None: ...

    async def reload(self, state: State) -> None: ...


def implements(sim: object, protocol: type) -> bool:
    """``isinstance(sim, protocol)`` for the method-only protocols above, decided once per
    class: a runtime-checkable protocol's ``isinstance`` looks every member up
    on each call, which over a pass's three waves cost about 2 ms of an h100
    pass."""
    return _implements(type(sim), protocol)


@functools.cache
def _implements(cls: type, protocol: type) -> bool:
    # Methods live on the class: what its instances implement is the class's answer.
    return issubclass(cls, protocol)
