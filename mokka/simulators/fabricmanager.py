"""fabricmanager: a stand-in for NVIDIA's ``nv-fabricmanager`` on NVSwitch systems.

On a real NVSwitch node the fabric manager registers every GPU with the
NVLink fabric; until it has, the GPUs report fabric state IN_PROGRESS and
NVLink workloads cannot start.  Here the observable result of that work is
one empty file, the readiness marker ``fabric-state/fabricmanager.ready``:
the mock NVML library reports GPUs whose fabric state is ``auto`` as
COMPLETED once it exists, and ``mokka fabricmanager-ctl -q`` answers READY.

The simulator is a ``Daemon``:

* ``stage`` makes sure the fabric-state directory exists (owner
  ``fabricmanager``); ``discard`` removes it (and a leftover marker).
* ``run`` removes a stale marker, waits the configured init delay (a real
  fabric manager takes a while to train the links), writes the marker, says
  ``started``, then re-asserts it whenever it may have changed (inotify on
  its directories; every 2 s where inotify is unavailable): rewritten at
  once if someone deleted or altered it.  Cancelling ``run`` removes the
  marker in a shielded ``finally``.
* ``reload`` delivers a new state: a profile without NVSwitch disables the
  fabric manager (marker removed, the task idles); enabling it again starts
  a fresh init delay, as a restarted fabric manager would.

The marker has its own owner (``fabricmanager-marker``), so a process killed
while it stood is cleaned up by ``discard``/``mokka cleanup`` like any other
artifact.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import stat

import attrs
import trio
import trio_util

from mokka import layout
from mokka.errors import HostPathError, SpecError
from mokka.noderoot import Directory, File, Host
from mokka.simulators.base import Readiness
from mokka.simulators.registry import SimulatorPlugin
from mokka.state.model import State
from mokka.state.sources.watch import WatchSet

logger = logging.getLogger(__name__)

#: Owner of the fabric-state directory (stage).
OWNER = "fabricmanager"
#: Owner of the readiness marker (run).
MARKER_OWNER = "fabricmanager-marker"
MODES = ("auto", "on", "off")


@attrs.frozen(kw_only=True)
class FabricManagerSettings:
    """Knobs of the fabric manager stand-in."""

    #: ``auto``: run for NVSwitch profiles only; ``on``: always; ``off``: never.
    mode: str = "auto"
    #: Seconds between start and the marker, like a real fabric manager's
    #: link training.  0 by default: most tests want a ready fabric at once;
    #: a positive delay exercises consumers that must wait for it.
    init_delay: float = 0.0
    #: Seconds between re-assertions of the marker where inotify cannot
    #: watch it.  2 s: a deleted marker comes back quickly, at a negligible
    #: cost (one stat per tick).
    reassert_interval: float = 2.0

    def __attrs_post_init__(self) -> None:
        problems = []
        if self.mode not in MODES:
            problems.append(f"--fabric-manager: {self.mode!r}, expected one of {', '.join(MODES)}")
        if not (math.isfinite(self.init_delay) and self.init_delay >= 0):
            problems.append(
                f"--fabric-manager-init-delay: {self.init_delay!r}, "
                "expected a number of seconds >= 0"
            )
        if not (math.isfinite(self.reassert_interval) and self.reassert_interval > 0):
            problems.append(f"reassert interval: {self.reassert_interval!r}, expected seconds > 0")
        if problems:
            raise SpecError(problems)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FabricManagerSettings:
        """Build from the parsed daemon flags (see ``add_arguments``)."""
        return cls(mode=args.fabric_manager, init_delay=args.fabric_manager_init_delay)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the fabricmanager flags, in their own argument group."""
    group = parser.add_argument_group(
        "fabricmanager", "nv-fabricmanager stand-in (readiness marker)"
    )
    defaults = FabricManagerSettings()
    group.add_argument("--fabric-manager", choices=MODES, default=defaults.mode, help=(
        "run the fabric manager stand-in: auto = for NVSwitch profiles (default: %(default)s)"))
    group.add_argument("--fabric-manager-init-delay", type=float, default=defaults.init_delay,
                       metavar="SECONDS", help=(
                           "seconds before the fabric is reported ready (default: %(default)s)"))


#: What ``run`` is doing, published in ``FabricManagerSimulator.phase``.
STOPPED, INITIALIZING, READY, OFF = "stopped", "initializing", "ready", "off"


@attrs.define(eq=False)
class FabricManagerSimulator:
    """Simulator and Daemon for the fabric manager; see the module docstring."""

    settings: FabricManagerSettings = attrs.field(factory=FabricManagerSettings)
    name: str = attrs.field(default="fabricmanager", init=False)
    #: Newest state ``run`` acts on: its start state, then each ``reload``.
    #: Never set by ``stage``: a Stage wave may still fail at the barrier,
    #: and the marker turns every ``auto`` GPU COMPLETED the moment it exists.
    _state: trio_util.AsyncValue[State | None] = attrs.field(
        factory=lambda: trio_util.AsyncValue(None), init=False
    )
    #: Newest state seen by ``stage``, ``run`` or ``reload``: what readiness
    #: and the fabric-state directory follow.
    _latest: State | None = attrs.field(default=None, init=False)
    #: ``stopped`` | ``initializing`` | ``ready`` (marker written) | ``off``;
    #: changes only after the filesystem does, so waiting on it (tests, logs)
    #: observes exact virtual times without polling.
    phase: trio_util.AsyncValue[str] = attrs.field(
        factory=lambda: trio_util.AsyncValue(STOPPED), init=False
    )
    #: How many times ``run`` had to recreate a marker someone deleted.
    rewrites: trio_util.AsyncValue[int] = attrs.field(
        factory=lambda: trio_util.AsyncValue(0), init=False
    )
    _staged: bool = attrs.field(default=False, init=False)

    def enabled(self, state: State) -> bool:
        """Whether ``state`` calls for a fabric manager (NVSwitch, unless forced)."""
        if self.settings.mode == "auto":
            return state.has_nvswitch
        return self.settings.mode == "on"

    # ---- Simulator -----------------------------------------------------

    async def stage(self, host: Host, state: State) -> None:
        """Make sure the fabric-state directory exists (or is gone when disabled)."""
        if self.enabled(state):
            wanted = [Directory(layout.FABRIC_STATE_DIR)]
            await trio.to_thread.run_sync(host.converge, OWNER, wanted)
        else:
            await trio.to_thread.run_sync(_discard_sync, host)
        self._staged = True
        self._latest = state

    async def discard(self, host: Host) -> None:
        """Remove the directory and any marker, whichever process wrote them."""
        await trio.to_thread.run_sync(_discard_sync, host)
        self._staged = False

    @property
    def readiness(self) -> Readiness:
        state = self._latest
        if not self._staged or state is None:
            return Readiness.not_ready("fabricmanager not staged yet")
        if not self.enabled(state):
            why = "--fabric-manager off" if self.settings.mode == "off" else (
                "profile has no NVSwitch"
            )
            return Readiness.ok(f"fabric manager off ({why})")
        phase = self.phase.value
        if phase == READY:
            return Readiness.ok("fabric manager ready")
        if phase == INITIALIZING:
            return Readiness.not_ready(
                f"fabric manager initializing (init delay {self.settings.init_delay:g} s)"
            )
        return Readiness.not_ready("fabric manager not running")

    # ---- Daemon --------------------------------------------------------

    async def reload(self, state: State) -> None:
        """Hand ``run`` the newest state; never blocks."""
        self._latest = state
        self._state.value = state

    async def run(
        self,
        host: Host,
        state: State,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Bring the marker up after the init delay and keep it there; see the module docstring."""
        self._latest = state
        self._state.value = state
        started = False
        markers: WatchSet | None = None
        try:
            with trio.CancelScope(shield=True):  # a descriptor is never lost half way
                markers = await trio.to_thread.run_sync(_start_up, host, self._keep_dir())
            while True:
                if not self.enabled(self._state.value):
                    # Disabled: no marker; wait until a state enables us again.
                    await self._take_down(host, OFF)
                    if not started:
                        task_status.started()
                        started = True
                    await self._state.wait_value(lambda s: s is not None and self.enabled(s))
                    continue
                if not await self._initialize(host):
                    continue  # disabled during the init delay
                if not started:
                    task_status.started()
                    started = True
                await self._hold(host, markers)
        finally:
            if markers is not None:
                markers.close()
            with trio.CancelScope(shield=True):
                await self._take_down(host, STOPPED)

    async def _initialize(self, host: Host) -> bool:
        """Wait the init delay, then write the marker; ``False`` if disabled meanwhile."""
        self.phase.value = INITIALIZING
        with trio.move_on_after(self.settings.init_delay):
            await self._state.wait_value(lambda s: s is not None and not self.enabled(s))
            return False
        await trio.to_thread.run_sync(_write_marker, host)
        logger.info("fabric manager ready: wrote %s", layout.FABRIC_READY_MARKER)
        self.phase.value = READY
        return True

    async def _hold(self, host: Host, markers: WatchSet | None) -> None:
        """Re-assert the marker whenever it may have changed, until a state disables us.

        Woken by inotify on the directories the markers live in (their
        names there, or the directories themselves going away), not by a
        timer: an idle node with the markers in place costs nothing.  A
        marker deleted or altered is rewritten at once.  Without inotify
        (or for a watch that could not be installed, the directory missing)
        the check runs every ``reassert_interval`` instead.
        """
        with trio.CancelScope() as scope:

            async def watch() -> None:
                await self._state.wait_value(lambda s: s is not None and not self.enabled(s))
                scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                while True:
                    if markers is None:
                        await trio.sleep(self.settings.reassert_interval)
                        rewrote = await trio.to_thread.run_sync(_reassert_marker, host)
                    else:
                        # Watches first, then the check, then the wait: a change
                        # before the watches is seen by the check, one after it
                        # is an event waiting to be read; none is missed.
                        planned, rewrote = await trio.to_thread.run_sync(
                            _plan_and_reassert, host, markers
                        )
                        if not planned:
                            markers = None  # this hold polls; the next plans again
                    if rewrote:
                        logger.warning("fabric manager: marker was deleted, rewrote it")
                        self.rewrites.value += 1
                    if markers is not None:
                        await markers.changed()

    async def _take_down(self, host: Host, phase: str) -> None:
        if self.phase.value == READY:
            logger.info("fabric manager stopped: removing %s", layout.FABRIC_READY_MARKER)
        await trio.to_thread.run_sync(_marker_down, host, self._keep_dir())
        self.phase.value = phase

    def _keep_dir(self) -> bool:
        """Whether the fabric-state directory must survive the marker (stage wants it)."""
        state = self._latest
        return self._staged and state is not None and self.enabled(state)


def _write_marker(host: Host) -> bool:
    """Converge the marker and its mirror (``_MARKERS``); ``True`` if either had to be (re)created.

    The mirror beside the engine config is the one the mock library reads
    (see ``layout.FABRIC_READY_MIRROR``); the marker in ``fabric-state`` is
    the documented one other consumers and the CDI mount see.
    """
    report = host.converge(
        MARKER_OWNER,
        [File(path, b"", 0o644) for path in _MARKERS],
    )
    return bool(report.created or report.updated)


#: The marker files ``_write_marker`` converges: empty, 0644.
_MARKERS = (layout.FABRIC_READY_MARKER, layout.FABRIC_READY_MIRROR)


def _reassert_marker(host: Host) -> bool:
    """The tick's check: a few ``lstat`` calls while the markers stand, a converge if not.

    A converge reads the owner's manifest, looks at the other owners' for the
    shared directory and may rewrite the snapshot: too much to repeat every
    couple of seconds on an idle node for a file that is almost always there.
    Only a marker that is missing or altered goes through ``_write_marker``.
    """
    if all(_marker_intact(host, path) for path in _MARKERS):
        return False
    return _write_marker(host)


def _start_up(host: Host, keep_dir: bool) -> WatchSet | None:
    """Remove a stale marker (``_remove_stale_marker``) and open the marker watch (blocking)."""
    _remove_stale_marker(host, keep_dir)
    return WatchSet.open()


def _plan_and_reassert(host: Host, markers: WatchSet) -> tuple[bool, bool]:
    """Watch the markers' directories, then re-assert the markers: (watched, rewrote).

    Not watched (the caller falls back to the timer) when the markers'
    paths do not resolve beneath the root or no directory could be watched.
    """
    planned = False
    try:
        paths = [host.resolve(path) for path in _MARKERS]
    except HostPathError:
        paths = []
    if paths:
        markers.plan(paths, why="; checking the fabric manager's marker on a timer instead")
        planned = bool(markers.watches)
    return planned, _reassert_marker(host)


def _marker_intact(host: Host, node_path: str) -> bool:
    """Whether ``node_path`` is the empty 0644 regular file ``_write_marker`` makes."""
    try:
        st = os.lstat(host.resolve(node_path))
    except (OSError, HostPathError):
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == 0 and stat.S_IMODE(st.st_mode) == 0o644


def _marker_down(host: Host, keep_dir: bool) -> None:
    """Remove our marker.

    The marker's converge shares the fabric-state directory with the stage
    owner (``Host`` records a parent another owner created as shared, so the
    last owner out removes it).  Discarding the marker owner whole would take
    the directory with it while the stage still wants it (CDI specs mount
    it), so then only the file goes.
    """
    if keep_dir:
        host.converge(MARKER_OWNER, [Directory(layout.FABRIC_STATE_DIR)])
    else:
        host.discard(MARKER_OWNER)


def _remove_stale_marker(host: Host, keep_dir: bool) -> None:
    """Remove a marker left by an earlier run: ours (manifest) or a dead fabric manager's.

    A marker that exists before the fabric manager has initialized would make
    consumers believe the fabric is ready too early, whoever wrote it.
    """
    _marker_down(host, keep_dir)
    for node_path in (layout.FABRIC_READY_MARKER, layout.FABRIC_READY_MIRROR):
        try:
            stale = host.resolve(node_path)
        except HostPathError:
            continue
        if stale.is_file() and not stale.is_symlink():
            logger.info("fabric manager: removing stale marker %s", node_path)
            stale.unlink(missing_ok=True)


def _discard_sync(host: Host) -> None:
    # The marker first: it lives in OWNER's directory.
    host.discard(MARKER_OWNER)
    host.discard(OWNER)


def _build(args: argparse.Namespace) -> FabricManagerSimulator:
    """The plugin's factory: one simulator per daemon, settings from its flags."""
    return FabricManagerSimulator(settings=FabricManagerSettings.from_args(args))


PLUGIN = SimulatorPlugin(name="fabricmanager", add_arguments=add_arguments, build=_build)
