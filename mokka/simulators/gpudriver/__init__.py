"""gpudriver: the driver footprint (device nodes, NVML, nvidia-smi, procfs, engine config).

Stage writes the driver tree under ``/var/lib/nvml-mock/driver`` (SURFACES
§3) in five independent batches, each converged by its own ``Host`` owner in
one thread hop, all concurrently:

=====================  =====================================================
owner                  what it converges
=====================  =====================================================
``gpudriver-dev``      ``dev/nvidia<minor>``, ``nvidiactl``, ``nvidia-modeset``,
                       ``nvidia-uvm``, ``nvidia-uvm-tools``, ``nvidia-caps/*``
``gpudriver-lib``      ``usr/lib64/libnvidia-ml.so.<driver>``,
                       ``usr/lib64/libcuda.so.<driver>`` (a stub reporting
                       no device) and their links
``gpudriver-smi``      ``usr/bin/nvidia-smi`` (real, fallback, or none)
``gpudriver-proc``     ``proc/driver/nvidia/*``, ``sys/module/nvidia/version``
``gpudriver-config``   ``config/config.yaml``, the engine config, and
                       ``config/generation``, its change notice (``notice``)
=====================  =====================================================

What can be known to fail before a byte is written (the library not built,
the engine config not renderable) is decided first, in a *plan*, so such a
stage fails leaving the node as the previous successful one left it.

Apply publishes the tree at ``/run/nvidia/driver`` (see ``publish``).
Discard and revoke remove exactly what the manifests record, so they also
work from a fresh process after a crash.

The simulator is also a ``Daemon``: once the first stage has succeeded it
serves the engine config at ``run/nvidia-persistenced/socket`` under the
driver root (``nvml_socket``), for libraries in containers whose CDI spec
another tool wrote, with no config beside them.  It serves the files as
they are on disk at each request, so ``reload`` has nothing to do.
"""

from __future__ import annotations

import argparse
import functools
import logging

import attrs
import trio

from mokka import layout, native
from mokka.errors import NativeArtifactMissing, PassSuperseded, StageError
from mokka.noderoot import Artifact, ConvergeReport, Directory, File, Host, owner_line
from mokka.simulators.base import Readiness
from mokka.simulators.gpudriver import notice, nvml_setter, nvml_socket
from mokka.simulators.gpudriver import publish as publishing
from mokka.simulators.gpudriver.binaries import (
    SmiChoice,
    choose_nvidia_smi,
    cuda_artifacts,
    library_artifacts,
    smi_artifacts,
)
from mokka.simulators.gpudriver.devices import device_artifacts
from mokka.simulators.gpudriver.engine_config import DeviceBlocks, render_engine_config
from mokka.simulators.gpudriver.procfs import procfs_artifacts
from mokka.simulators.gpudriver.settings import GpuDriverSettings, add_arguments
from mokka.simulators.registry import SimulatorPlugin
from mokka.state.model import State

logger = logging.getLogger(__name__)

__all__ = ["OWNERS", "PLUGIN", "GpuDriverSettings", "GpuDriverSimulator"]

#: The batch holding the engine config: converged with its change notice.
CONFIG_OWNER = "gpudriver-config"
#: Stage owners, one per independent batch (see the module docstring).
OWNERS = ("gpudriver-dev", "gpudriver-lib", "gpudriver-smi", "gpudriver-proc", CONFIG_OWNER)
#: The engine config is rewritten by rename; readable by every consumer.
CONFIG_MODE = 0o644


@attrs.frozen
class _Plan:
    """Every batch's artifacts for one state, computed before anything is written."""

    #: owner name → the complete set of artifacts that owner should have
    batches: dict[str, list[Artifact]]
    #: which nvidia-smi was chosen, kept for readiness and the stage log line
    smi: SmiChoice
    #: why the CUDA stub is not staged (not built), or None when it is
    cuda_missing: str | None = None


def _plan_on(
    host: Host, state: State, settings: GpuDriverSettings, blocks: DeviceBlocks | None = None
) -> _Plan:
    """``_plan``, noting that which ``nvidia-smi`` it stages depends on the machine's own
    files (``Host.depends_on``): one installed later is staged at the next resync, and
    so is a CUDA stub built later."""
    for path in (settings.nvidia_smi_binary, settings.installed_nvidia_smi,
                 native.native_dir() / native.CUDA_LIBRARY):
        host.depends_on(path)
    return _plan(state, settings, blocks)


def _plan(
    state: State, settings: GpuDriverSettings, blocks: DeviceBlocks | None = None
) -> _Plan:
    """Decide every artifact; raises before any write if something is missing.

    Runs in a worker thread: it stats the native artifacts and the image's
    nvidia-smi, and renders the engine config (a few hundred KiB for large
    profiles).  Raises ``NativeArtifactMissing`` when the library is not
    built and ``SpecError`` when the state cannot be rendered.  ``blocks``:
    the GPUs' rendered engine config lines from the last plan (``DeviceBlocks``).
    """
    smi = choose_nvidia_smi(settings.nvidia_smi_binary, settings.installed_nvidia_smi)
    libraries = library_artifacts(state.system.driver_version)
    cuda_missing = None
    try:
        libraries += cuda_artifacts(state.system.driver_version)
    except NativeArtifactMissing as exc:
        cuda_missing = f"CUDA stub not staged: {exc}"
    config: list[Artifact] = [
        # Explicit, so it stays a real directory even if it ends up empty of
        # our files: CDI bind-mounts it whole and override renames inside it
        # must stay visible in containers.
        Directory(layout.CONFIG_DIR),
        File(
            layout.ENGINE_CONFIG,
            render_engine_config(state, blocks, idle_signature=settings.idle_signature),
            CONFIG_MODE,
        ),
    ]
    return _Plan(
        batches={
            "gpudriver-dev": device_artifacts(state, settings),
            "gpudriver-lib": libraries,
            "gpudriver-smi": smi_artifacts(smi),
            "gpudriver-proc": procfs_artifacts(state),
            CONFIG_OWNER: config,
        },
        smi=smi,
        cuda_missing=cuda_missing,
    )


async def _converge_all(
    host: Host, batches: dict[str, list[Artifact]]
) -> dict[str, ConvergeReport]:
    """Converge every batch concurrently, one thread hop each; collect all failures.

    A failing batch does not cancel its siblings (they are threads and would
    finish anyway); every failure is reported together afterwards.  The
    engine config's batch also keeps the change notice and bumps it once the
    new config is in place (``notice.converge_announced``).
    """
    reports: dict[str, ConvergeReport] = {}
    failures: list[tuple[str, Exception]] = []

    async def one(owner: str, artifacts: list[Artifact]) -> None:
        try:
            if owner == CONFIG_OWNER:
                converge = functools.partial(notice.converge_announced, host)
            else:
                converge = host.converge
            reports[owner] = await trio.to_thread.run_sync(converge, owner, artifacts)
        except Exception as exc:
            failures.append((owner, exc))

    async with trio.open_nursery() as nursery:
        for owner, artifacts in batches.items():
            nursery.start_soon(one, owner, artifacts)
    superseded = [exc for _owner, exc in failures if isinstance(exc, PassSuperseded)]
    if superseded:
        raise superseded[0]  # the pass gave way to a newer input: not a failure
    if failures:
        detail = "; ".join(owner_line(owner, exc) for owner, exc in failures)
        raise StageError(f"gpudriver: {detail}") from failures[0][1]
    return reports


@attrs.define(eq=False)
class GpuDriverSimulator:
    """Simulator and Applier for the driver footprint; see the module docstring."""

    settings: GpuDriverSettings = attrs.field(factory=GpuDriverSettings)
    #: Whether this process may mount, for ``--driver-publish auto``.  Read
    #: from the effective capability set by default; a parameter so tests can
    #: decide ``auto`` without privileges.
    can_mount: bool = attrs.field(factory=publishing.has_cap_sys_admin)
    name: str = attrs.field(default="gpudriver", init=False)
    # Outcome of the last stage / apply, read by ``readiness``.  Plain fields
    # set by the (single) reconcile task: ``readiness`` only reads them, so
    # ``/readyz`` never waits for a pass.
    _stage_error: str | None = attrs.field(default=None, init=False)
    _staged: bool = attrs.field(default=False, init=False)
    _degraded: tuple[str, ...] = attrs.field(default=(), init=False)
    _smi: SmiChoice | None = attrs.field(default=None, init=False)
    _cuda_missing: str | None = attrs.field(default=None, init=False)
    _published: str | None = attrs.field(default=None, init=False)
    _apply_error: str | None = attrs.field(default=None, init=False)
    _summary: str = attrs.field(default="", init=False)
    #: Each GPU's engine config lines from the last plan (one plan at a time:
    #: the single reconcile task stages).
    _blocks: DeviceBlocks = attrs.field(factory=DeviceBlocks, init=False)
    #: the NVML setters' applier while the daemon runs (``run``)
    _setter: nvml_setter.Setter | None = attrs.field(default=None, init=False)

    # ---- Simulator -----------------------------------------------------

    async def stage(self, host: Host, state: State) -> None:
        """Converge the driver tree onto ``state`` (all batches in parallel)."""
        try:
            plan = await trio.to_thread.run_sync(_plan_on, host, state, self.settings,
                                                 self._blocks)
        except NativeArtifactMissing as exc:
            self._stage_error = f"mock NVML library not built: {exc}"
            raise
        except Exception as exc:
            self._stage_error = f"stage failed: {exc}"
            raise
        try:
            reports = await _converge_all(host, plan.batches)
        except Exception as exc:
            self._stage_error = f"stage failed: {exc}"
            raise
        self._stage_error = None
        self._staged = True
        self._smi = plan.smi
        self._cuda_missing = plan.cuda_missing
        self._degraded = tuple(d for r in reports.values() for d in r.degraded)
        self._summary = f"driver {state.system.driver_version}, {len(state.gpus)} GPU(s)"
        changed = {owner: r for owner, r in reports.items() if r.changed}
        # Every pass stages; only a pass that changed the node is worth INFO.
        logger.log(
            logging.INFO if changed else logging.DEBUG,
            "gpudriver staged generation %d: %s; %s; %s; changed batches: %s",
            state.generation,
            self._summary,
            plan.smi.detail,
            plan.cuda_missing or "CUDA stub staged",
            ", ".join(
                f"{o} (+{len(r.created)} ~{len(r.updated)} -{len(r.removed)})"
                for o, r in changed.items()
            )
            or "none",
        )

    async def discard(self, host: Host) -> None:
        """Remove everything stage wrote (any process's), restoring what it replaced."""
        # A killed daemon's socket and its record first: the socket keeps the
        # directories it is in from going.
        await trio.to_thread.run_sync(_discard_socket, host)
        await _converge_all(host, {owner: [] for owner in OWNERS})
        self._staged = False
        self._degraded = ()
        self._smi = None
        self._cuda_missing = None
        logger.info("gpudriver discarded the driver tree")

    @property
    def readiness(self) -> Readiness:
        """Ready once staged and published, with nothing degraded; else the first reason why not."""
        if self._stage_error is not None:
            return Readiness.not_ready(self._stage_error)
        if not self._staged:
            return Readiness.not_ready("driver tree not staged")
        if self._degraded:
            return Readiness.not_ready("; ".join(self._degraded))
        if self._smi is not None and self._smi.source is None:
            return Readiness.not_ready(self._smi.detail)
        if self._cuda_missing is not None:
            return Readiness.not_ready(self._cuda_missing)
        if self._published is None:
            return Readiness.not_ready(
                self._apply_error or f"driver tree not published at {layout.RUN_DRIVER}"
            )
        # Which nvidia-smi, from where: a local run shows in /readyz whether
        # NVIDIA's binary or the fallback answers `nvidia-smi`.
        smi = self._smi.detail if self._smi else "no nvidia-smi"
        return Readiness.ok(f"{self._summary}, {smi}, {self._published}")

    # ---- Daemon --------------------------------------------------------

    async def run(self, host: Host, state: State, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the engine config at the NVML socket (``nvml_socket``) until cancelled."""
        self._setter = nvml_setter.Setter(host, state)
        server = nvml_socket.NvmlSocketServer(host, setter=self._setter)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            task_status.started()

    async def reload(self, state: State) -> None:
        """Hand the state to the setters (the socket serves the staged files as they are
        at each request): a change is in force once a state holds it."""
        if self._setter is not None:
            self._setter.deliver(state)

    # ---- Applier -------------------------------------------------------

    def publish_mode(self, host: Host) -> str:
        """``bind`` or ``symlink``: the setting, with ``auto`` decided for this host."""
        return publishing.resolve_mode(self.settings.publish, host.root, self.can_mount)

    async def apply(self, host: Host, state: State) -> None:
        """Publish the driver tree at ``/run/nvidia/driver``."""
        mode = self.publish_mode(host)
        # The previous publication stays in force (and ready) while this one
        # runs: /readyz must not flap on every pass.
        try:
            self._published = await trio.to_thread.run_sync(publishing.publish, host, mode)
        except Exception as exc:
            self._published = None
            self._apply_error = f"publishing {layout.RUN_DRIVER} failed: {exc}"
            raise
        self._apply_error = None
        logger.debug("gpudriver published generation %d: %s", state.generation, self._published)

    async def revoke(self, host: Host) -> None:
        """Withdraw the publication (unmount or remove the symlink)."""
        self._published = None
        self._apply_error = None
        await trio.to_thread.run_sync(publishing.withdraw, host)
        logger.info("gpudriver withdrew %s", layout.RUN_DRIVER)


def _discard_socket(host: Host) -> None:
    """Remove the NVML socket a killed daemon left, and its record (blocking)."""
    nvml_socket.remove_stale_socket(host)
    host.discard(nvml_socket.RUN_OWNER)


def _build(args: argparse.Namespace) -> GpuDriverSimulator:
    """The registry's factory: one simulator per daemon, from its flags."""
    return GpuDriverSimulator(settings=GpuDriverSettings.from_args(args))


PLUGIN = SimulatorPlugin(name="gpudriver", add_arguments=add_arguments, build=_build)
