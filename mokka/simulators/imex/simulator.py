"""The imex simulator: what a node with NVIDIA IMEX looks like to its consumers.

Stage, for a fabric-attached profile (or ``--imex on``), converges under the
owner ``imex``:

* ``driver/dev/nvidia-caps-imex-channels/channel<i>`` (``channels``),
* ``imex/proc-devices``, the ``/proc/devices`` overlay (``procdevices``),
* ``driver/proc/driver/nvidia/capabilities/fabric-imex-mgmt``,
* when a verified archive is available (``archive``): ``driver/usr/bin/``
  ``nvidia-imex.real`` (NVIDIA's daemon), ``nvidia-imex`` (a shim that runs
  it with ``--nogpu``, since the node has no GPU it could open) and
  ``nvidia-imex-ctl``.

A downloaded archive is kept in the node cache under a second owner,
``imex-cache``, so a later pass does not download it again; the cache
*directory* belongs to ``imex`` (so its parents are removed by the same
owner that created them) and the file inside it to ``imex-cache``, which is
therefore always discarded first.

Ordering that keeps the node coherent: the archive is found, verified and
unpacked in memory *before* the converge, so a checksum mismatch raises
with the driver tree untouched.  A node without any archive is still ready:
channels, overlay and capability are staged, the binaries are not, and the
readiness reason (logged once) says why.
"""

from __future__ import annotations

import logging
from pathlib import Path

import attrs
import trio

from mokka import layout
from mokka.noderoot import Artifact, ConvergeReport, Directory, File, Host
from mokka.simulators.base import Readiness
from mokka.simulators.imex import archive, channels, procdevices
from mokka.simulators.imex.archive import ArchiveError, ImexBinaries
from mokka.simulators.imex.settings import ImexSettings
from mokka.state.model import State

logger = logging.getLogger(__name__)

#: Owner of everything staged (devices, overlay, capability, binaries, cache dir).
OWNER = "imex"
#: Owner of the downloaded archive inside the cache directory.
CACHE_OWNER = "imex-cache"
#: Feature gate allowing the download.
DOWNLOAD_GATE = "IMEXDownload"

IMEX_BIN = f"{layout.DRIVER_BIN}/{archive.IMEX}"
IMEX_REAL_BIN = f"{IMEX_BIN}.real"
IMEX_CTL_BIN = f"{layout.DRIVER_BIN}/{archive.IMEX_CTL}"
#: ``nvidia-imex`` as staged: NVIDIA's daemon run without GPU access checks.
#: Found relative to the shim, so it works wherever the driver root is mounted.
SHIM = '#!/bin/sh\nexec "$(dirname "$0")/nvidia-imex.real" --nogpu "$@"\n'
BIN_MODE = 0o755
#: Why a node has no ``nvidia-imex`` by default, and how to give it one.  Said
#: in the log line: Mokka (and its image) carries no IMEX binary, so a user
#: who expects one must learn from the log where it has to come from.
NO_BINARIES = (
    "Mokka ships none; give it NVIDIA's IMEX archive with --imex-archive-dir "
    "(the chart's nodeAgent.imex.binaries.image) and --imex-archive-sha256, "
    "see docs/imex.md"
)
#: The overlay is read by consumers (``ALT_PROC_DEVICES_PATH``), never written.
OVERLAY_MODE = 0o444
CACHE_MODE = 0o644


@attrs.frozen
class _BinaryPlan:
    """Where this pass's binaries come from, decided before anything is written."""

    binaries: ImexBinaries | None
    #: why no binaries are staged ("" when they are)
    reason: str = ""
    #: the cache directory stays (binaries came from the cache or a download)
    keep_cache: bool = False
    #: a fresh download to store in the cache: (node path, bytes)
    cache_write: tuple[str, bytes] | None = attrs.field(default=None, repr=False)


@attrs.define(eq=False)
class ImexSimulator:
    """Simulator for the IMEX footprint; see the module docstring."""

    settings: ImexSettings = attrs.field(factory=ImexSettings)
    name: str = attrs.field(default="imex", init=False)
    _readiness: Readiness = attrs.field(
        factory=lambda: Readiness.not_ready("imex not staged yet"), init=False
    )
    #: Last verified archive file and what was read from it, keyed by
    #: (path, size, mtime, inode, pin): re-reading and unpacking tens of MiB on
    #: every pass would make an unchanged stage slow.
    _memo: tuple[tuple, ImexBinaries] | None = attrs.field(default=None, init=False, repr=False)
    #: Last "no binaries" reason logged, so the log says it once, not every pass.
    _logged_reason: str | None = attrs.field(default=None, init=False)

    def enabled(self, state: State) -> bool:
        """Whether ``state`` calls for IMEX: fabric-attached profiles, unless forced."""
        if self.settings.mode == "auto":
            return state.fabric_attached
        return self.settings.mode == "on"

    # ---- Simulator -----------------------------------------------------

    async def stage(self, host: Host, state: State) -> None:
        """Converge the IMEX footprint onto ``state`` (or remove it when IMEX is off)."""
        if not self.enabled(state):
            await trio.to_thread.run_sync(_discard_sync, host)
            why = "--imex off" if self.settings.mode == "off" else "profile is not fabric-attached"
            self._readiness = Readiness.ok(f"imex off ({why})")
            return
        try:
            # Reads (and maybe downloads) only; nothing is written, so a cancelled
            # stage may abandon the thread safely.
            plan = await trio.to_thread.run_sync(
                self._plan_binaries, host, state, abandon_on_cancel=True
            )
            report = await trio.to_thread.run_sync(self._converge_sync, host, plan)
        except Exception as exc:
            self._readiness = Readiness.not_ready(f"imex stage failed: {exc}")
            raise
        if plan.reason and plan.reason != self._logged_reason:
            logger.warning(
                "imex: no nvidia-imex binaries staged (%s): %s", NO_BINARIES, plan.reason
            )
        self._logged_reason = plan.reason
        summary = f"{self.settings.channel_count} channels (major {self.settings.channel_major})"
        if plan.binaries is not None:
            summary += f", nvidia-imex from {plan.binaries.origin}"
        if report.changed:
            logger.info(
                "imex staged generation %d: %s (+%d ~%d -%d)",
                state.generation, summary,
                len(report.created), len(report.updated), len(report.removed),
            )
        if report.degraded:
            self._readiness = Readiness.not_ready("; ".join(report.degraded))
        elif plan.reason:
            self._readiness = Readiness.ok(f"{summary}; no nvidia-imex binaries: {plan.reason}")
        else:
            self._readiness = Readiness.ok(summary)

    async def discard(self, host: Host) -> None:
        """Remove everything any process staged for IMEX (cache first, see the module docstring)."""
        await trio.to_thread.run_sync(_discard_sync, host)
        self._readiness = Readiness.not_ready("imex discarded")
        logger.info("imex discarded")

    @property
    def readiness(self) -> Readiness:
        """Decided by the last stage: missing binaries are a reason, not unreadiness.

        Consumers that only need channels (most DRA tests) work without
        ``nvidia-imex``; placeholder device nodes (no CAP_MKNOD) do make the
        node unready, since nothing can open them.
        """
        return self._readiness

    # ---- blocking parts (worker threads) -------------------------------

    def _plan_binaries(self, host: Host, state: State) -> _BinaryPlan:
        """Find, verify and unpack the archive; raises ``ArchiveError`` before any write."""
        s = self.settings
        if s.archive_dir is not None:
            # An archive dropped in later is found at the next resync.
            host.depends_on(s.archive_dir)
            path = archive.find_in_dir(s.archive_dir, s.archive_name)
            if path is not None:
                host.depends_on(path)
                if s.archive_sha256 is None:
                    return _BinaryPlan(None, f"{path}: refusing an archive without "
                                       "--imex-archive-sha256 to pin it")
                return _BinaryPlan(self._from_file(path, str(path)))
        where = f"no IMEX archive in {s.archive_dir}" if s.archive_dir else "no --imex-archive-dir"
        if not state.feature_gates.get(DOWNLOAD_GATE):
            return _BinaryPlan(None, f"{where} and the {DOWNLOAD_GATE} feature gate is off")
        if s.archive_url is None:
            return _BinaryPlan(
                None, f"{where}; {DOWNLOAD_GATE} is on but --imex-archive-url is not set"
            )
        if s.archive_sha256 is None:
            return _BinaryPlan(None, f"{where}; download of {s.archive_url} refused: "
                               "no --imex-archive-sha256 pin")
        cache_path = f"{layout.CACHE_DIR}/{s.archive_name}"
        cached = host.resolve(cache_path)
        if cached.is_file():
            try:
                return _BinaryPlan(self._from_file(cached, cache_path), keep_cache=True)
            except ArchiveError as exc:
                logger.warning("imex: cached archive unusable, downloading again: %s", exc)
        data = archive.download(
            s.archive_url, s.archive_sha256,
            timeout=s.download_timeout, max_bytes=s.max_archive_bytes,
        )
        binaries = archive.unpack(data, s.archive_url)
        return _BinaryPlan(binaries, keep_cache=True, cache_write=(cache_path, data))

    def _from_file(self, path: Path, origin: str) -> ImexBinaries:
        """Verify and unpack an archive file, or reuse the last result for the same file."""
        pin = self.settings.archive_sha256
        assert pin is not None
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino, pin)
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        data = archive.read_verified(path, pin, max_bytes=self.settings.max_archive_bytes)
        binaries = archive.unpack(data, origin)
        self._memo = (key, binaries)
        return binaries

    def _converge_sync(self, host: Host, plan: _BinaryPlan) -> ConvergeReport:
        """One batch: the overlay is computed here too, so a bad base fails before any write."""
        s = self.settings
        overlay = procdevices.overlay(
            procdevices.read_base(host), channel_major=s.channel_major, caps_major=s.caps_major
        )
        artifacts: list[Artifact] = [
            *channels.channel_artifacts(s.channel_count, s.channel_major),
            channels.capability_artifact(),
            File(layout.IMEX_PROC_DEVICES, overlay, OVERLAY_MODE),
        ]
        if plan.binaries is not None:
            artifacts += [
                File(IMEX_REAL_BIN, plan.binaries.imex, BIN_MODE),
                File(IMEX_BIN, SHIM, BIN_MODE),
                File(IMEX_CTL_BIN, plan.binaries.imex_ctl, BIN_MODE),
            ]
        if plan.keep_cache:
            artifacts.append(Directory(layout.CACHE_DIR))
        else:
            host.discard(CACHE_OWNER)  # before its directory goes with OWNER's converge
        report = host.converge(OWNER, artifacts)
        if plan.cache_write is not None:
            path, data = plan.cache_write
            host.converge(CACHE_OWNER, [File(path, data, CACHE_MODE)])
        return report


def _discard_sync(host: Host) -> None:
    """Remove everything either owner recorded, in the order that empties directories."""
    # The cache file first: its directory belongs to OWNER.
    host.discard(CACHE_OWNER)
    host.discard(OWNER)
