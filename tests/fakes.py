"""Fakes at our own seams: simulators, appliers, daemons and a state source.

Small attrs classes that record every call (method, generation, trio time)
into a shared ``log`` list, with hooks to fail or delay each method.  The
simulators really write through ``Host.converge`` (one small file per owner),
so a test can check that revoke + discard restore the root exactly.

Failure hooks are lists consumed one entry per call: ``stage_errors=[X(),
None, Y()]`` fails the first call with X, lets the second succeed and fails
the third with Y; an empty list means success from then on.
``always_fail_stage`` fails every call.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
import trio.lowlevel
import trio_util

from mokka.noderoot.host import File, Host
from mokka.simulators.base import Readiness
from mokka.state.model import Gpu, State, System
from mokka.state.sources.base import SourceUpdate

Call = tuple[str, str, int | None, float]  # (simulator, method, generation, time)


def make_state(
    generation: int = 1,
    *,
    content_hash: str | None = None,
    node_name: str = "node-a",
    gpus: int = 1,
) -> State:
    """A tiny hand-built ``State``; equal ``content_hash`` means equal inputs."""
    return State(
        generation=generation,
        content_hash=content_hash if content_hash is not None else f"hash-{generation}",
        node_name=node_name,
        profile_name="fake",
        system=System(
            driver_version="550.54.15",
            nvml_version="12.550.54.15",
            cuda_version_major=12,
            cuda_version_minor=4,
        ),
        gpus=tuple(
            Gpu(
                index=i,
                minor=i,
                uuid=f"GPU-fake-{i}",
                serial=f"SN{i}",
                name="Fake GPU",
                brand="Tesla",
                architecture="Hopper",
                bus_id=f"0000:{0x10 + i:02x}:00.0",
                pci_vendor_id=0x10DE,
                pci_device_id=0x2330,
                pci_subsystem_vendor_id=0x10DE,
                pci_subsystem_device_id=0x16C1,
                root_complex="pci0000:00",
                numa_node=0,
            )
            for i in range(gpus)
        ),
    )


def _next_error(errors: list[BaseException | None]) -> BaseException | None:
    return errors.pop(0) if errors else None


@attrs.define(eq=False)
class FakeSimulator:
    """A ``Simulator`` whose stage writes ``/fake/<name>/staged`` (content: the generation)."""

    name: str
    log: list[Call] = attrs.field(factory=list)
    stage_errors: list[BaseException | None] = attrs.field(factory=list)
    always_fail_stage: BaseException | None = None
    discard_errors: list[BaseException | None] = attrs.field(factory=list)
    stage_delay: float = 0.0
    discard_delay: float = 0.0
    ready: Readiness = attrs.field(factory=Readiness.ok)
    #: generation of every completed stage, in order
    staged: list[int] = attrs.field(factory=list)

    def _record(self, method: str, state: State | None = None) -> None:
        self.log.append(
            (self.name, method, None if state is None else state.generation, trio.current_time())
        )

    def calls(self, method: str) -> list[Call]:
        return [c for c in self.log if c[0] == self.name and c[1] == method]

    async def stage(self, host: Host, state: State) -> None:
        self._record("stage", state)
        await trio.sleep(self.stage_delay)
        error = _next_error(self.stage_errors) or self.always_fail_stage
        if error is not None:
            raise error
        content = f"generation {state.generation}\n"
        host.converge(self.name, [File(f"/fake/{self.name}/staged", content)])
        self.staged.append(state.generation)

    async def discard(self, host: Host) -> None:
        self._record("discard")
        await trio.sleep(self.discard_delay)
        error = _next_error(self.discard_errors)
        if error is not None:
            raise error
        host.discard(self.name)

    @property
    def readiness(self) -> Readiness:
        return self.ready


@attrs.define(eq=False)
class FakeApplier(FakeSimulator):
    """Also an ``Applier``: apply writes ``/fake/<name>/published``; revoke removes it."""

    apply_errors: list[BaseException | None] = attrs.field(factory=list)
    revoke_errors: list[BaseException | None] = attrs.field(factory=list)
    apply_delay: float = 0.0
    revoke_delay: float = 0.0
    applied: list[int] = attrs.field(factory=list)

    async def apply(self, host: Host, state: State) -> None:
        self._record("apply", state)
        await trio.sleep(self.apply_delay)
        error = _next_error(self.apply_errors)
        if error is not None:
            raise error
        host.converge(
            f"{self.name}-apply",
            [File(f"/fake/{self.name}/published", f"generation {state.generation}\n")],
        )
        self.applied.append(state.generation)

    async def revoke(self, host: Host) -> None:
        self._record("revoke")
        await trio.sleep(self.revoke_delay)
        error = _next_error(self.revoke_errors)
        if error is not None:
            raise error
        host.discard(f"{self.name}-apply")


@attrs.define(eq=False)
class FakeDaemon(FakeSimulator):
    """Also a ``Daemon``.

    ``run``: waits ``start_delay``; pops ``start_errors`` (raised *before*
    ``started()``); signals started; then pops ``crash_after`` (seconds until
    it raises ``crash_error``), or runs until cancelled.
    """

    start_errors: list[BaseException | None] = attrs.field(factory=list)
    start_delay: float = 0.0
    crash_after: list[float] = attrs.field(factory=list)
    crash_error: Exception = attrs.field(factory=lambda: RuntimeError("boom"))
    reload_errors: list[BaseException | None] = attrs.field(factory=list)
    #: ``trio.current_time()`` of every ``started()``
    started_at: list[float] = attrs.field(factory=list)
    reloaded: list[int] = attrs.field(factory=list)
    running: bool = False

    async def run(
        self,
        host: Host,
        state: State,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        self._record("run", state)
        await trio.sleep(self.start_delay)
        error = _next_error(self.start_errors)
        if error is not None:
            raise error
        self.running = True
        try:
            self.started_at.append(trio.current_time())
            task_status.started()
            if self.crash_after:
                await trio.sleep(self.crash_after.pop(0))
                # A fresh instance per crash, so tracebacks do not pile up.
                raise type(self.crash_error)(*self.crash_error.args)
            await trio.sleep_forever()
        finally:
            self.running = False

    async def reload(self, state: State) -> None:
        self._record("reload", state)
        error = _next_error(self.reload_errors)
        if error is not None:
            raise error
        self.reloaded.append(state.generation)


@attrs.define(eq=False)
class MemorySource:
    """A ``StateSource`` fed by the test: ``publish`` sets the newest update at once."""

    initial: list[SourceUpdate] = attrs.field(factory=list)
    #: raised from ``run`` after ``started()`` (a source that dies)
    fail_with: BaseException | None = None
    _out: trio_util.AsyncValue[SourceUpdate | None] | None = attrs.field(default=None, init=False)

    async def run(
        self,
        out: trio_util.AsyncValue[SourceUpdate | None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        self._out = out
        for update in self.initial:
            out.value = update
        task_status.started()
        if self.fail_with is not None:
            await trio.lowlevel.checkpoint()
            raise self.fail_with
        await trio.sleep_forever()

    def publish(self, state: State | None, error: Any = None) -> SourceUpdate:
        if self._out is None:
            raise RuntimeError("MemorySource.publish before run() started")
        update = SourceUpdate(state=state, error=error, at=trio.current_time())
        self._out.value = update
        return update
