"""Settings of the imex simulator, and the flags they come from.

All of these describe the *node* (which majors its kernel hands out, where
the chart put the IMEX archive, which archive is trusted), not the GPU
profile, so they arrive through flags.  Whether IMEX is on at all defaults
to the profile's shape (``auto``: on for fabric-attached, GB200-style
profiles).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from urllib.parse import urlsplit

import attrs

from mokka import layout
from mokka.errors import SpecError
from mokka.simulators.imex.procdevices import MAX_MAJOR

MODES = ("auto", "on", "off")
#: The NVIDIA driver's static character major (``/dev/nvidia<i>``, ``nvidiactl``).
NVIDIA_MAJOR = 195
#: The gpudriver's default ``--uvm-major``, for settings built without its flag.
UVM_MAJOR_DEFAULT = 510
#: Linux minors are 20 bits wide; a channel number is a minor.
MAX_CHANNELS = 1 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@attrs.frozen(kw_only=True)
class ImexSettings:
    """Node-level knobs of the IMEX footprint; validated as a whole in ``__attrs_post_init__``."""

    #: ``auto`` follows the profile (on for fabric-attached profiles), ``on``
    #: forces IMEX on any profile, ``off`` never stages it.
    mode: str = "auto"
    #: Number of ``channel<i>`` nodes.  2048: the driver's default
    #: ``NVreg_ImexChannelCount``.
    channel_count: int = 2048
    #: Character major of the channel nodes.  Dynamic on real hosts; 235 is a
    #: value commonly seen there.
    channel_major: int = 235
    #: Character major announced for ``nvidia-caps`` in the overlay.  The same
    #: value as the gpudriver's ``/dev/nvidia-caps`` nodes: both come from the
    #: one ``--nvidia-caps-major`` flag (gpudriver's), so they cannot disagree.
    caps_major: int = layout.NVIDIA_CAPS_MAJOR
    #: The major of ``nvidia-uvm`` (the gpudriver's ``--uvm-major``), only so
    #: the channel major cannot take it: ``channel0``/``channel1`` would be
    #: ``nvidia-uvm``/``nvidia-uvm-tools`` under another name.
    uvm_major: int = UVM_MAJOR_DEFAULT
    #: Directory the chart's ``imex.binaries.image`` fills with the IMEX
    #: archive (a ``.tar.gz``/``.tar.xz`` file, see ``archive.find_in_dir``).
    #: ``None``: no such volume.
    archive_dir: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    #: Where the archive is downloaded from while the ``IMEXDownload`` feature
    #: gate is on; its last path component also names the archive in
    #: ``archive_dir``.  No default: the project ships no pin it cannot verify.
    archive_url: str | None = None
    #: The archive's sha256 (64 hex digits).  Every archive, from the volume or
    #: downloaded, must match it; without it nothing is installed.
    archive_sha256: str | None = attrs.field(
        default=None, converter=attrs.converters.optional(lambda s: s.strip().lower())
    )
    #: Seconds a stalled download may wait on the network per socket operation.
    #: 60 s: generous for a CDN, short enough that a wave is not stuck for long.
    download_timeout: float = 60.0
    #: Largest archive accepted, in bytes.  The archive is held in memory while
    #: it is verified; NVIDIA's IMEX archives are a few tens of MiB, so 512 MiB
    #: only guards against a wrong URL serving something huge.
    max_archive_bytes: int = 512 << 20

    def __attrs_post_init__(self) -> None:
        problems = []
        if self.mode not in MODES:
            problems.append(f"--imex: {self.mode!r}, expected one of {', '.join(MODES)}")
        if not 1 <= self.channel_count <= MAX_CHANNELS:
            problems.append(f"--imex-channels: {self.channel_count}, expected 1..{MAX_CHANNELS}")
        for flag, value in (
            ("--imex-channel-major", self.channel_major),
            ("--nvidia-caps-major", self.caps_major),
        ):
            if not 1 <= value <= MAX_MAJOR:
                problems.append(f"{flag}: {value}, expected a character major in 1..{MAX_MAJOR}")
        if self.channel_major == self.caps_major:
            problems.append(
                f"--imex-channel-major and --nvidia-caps-major: both {self.channel_major}, "
                "expected two distinct majors"
            )
        if self.channel_major == NVIDIA_MAJOR:
            problems.append(
                f"--imex-channel-major: {NVIDIA_MAJOR}, expected a major other than "
                f"{NVIDIA_MAJOR} (NVIDIA's own static major: channel<i> would be /dev/nvidia<i>)"
            )
        elif self.channel_major == self.uvm_major:
            problems.append(
                f"--imex-channel-major and --uvm-major: both {self.channel_major}, "
                "expected two distinct majors"
            )
        if self.archive_sha256 is not None and not _SHA256.match(self.archive_sha256):
            problems.append(
                f"--imex-archive-sha256: {self.archive_sha256!r}, expected 64 hexadecimal digits"
            )
        if self.archive_url is not None:
            parts = urlsplit(self.archive_url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                problems.append(
                    f"--imex-archive-url: {self.archive_url!r}, expected an http:// or https:// URL"
                )
            elif not self.archive_name:
                problems.append(
                    f"--imex-archive-url: {self.archive_url!r} has no file name in its path, "
                    "expected e.g. https://host/path/nvidia-imex-<version>-archive.tar.xz"
                )
        if self.download_timeout <= 0:
            problems.append(f"download timeout: {self.download_timeout}, expected > 0 seconds")
        if problems:
            raise SpecError(problems)

    @property
    def archive_name(self) -> str | None:
        """The archive's file name: the URL's last path component, if a URL is set."""
        if self.archive_url is None:
            return None
        return urlsplit(self.archive_url).path.rsplit("/", 1)[-1] or None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ImexSettings:
        """Build from the parsed daemon flags (see ``add_arguments``)."""
        return cls(
            mode=args.imex,
            channel_count=args.imex_channels,
            channel_major=args.imex_channel_major,
            caps_major=getattr(args, "nvidia_caps_major", layout.NVIDIA_CAPS_MAJOR),
            uvm_major=getattr(args, "uvm_major", UVM_MAJOR_DEFAULT),
            archive_dir=args.imex_archive_dir,
            archive_url=args.imex_archive_url,
            archive_sha256=args.imex_archive_sha256,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the imex flags, in their own argument group."""
    group = parser.add_argument_group("imex", "IMEX channels, /proc/devices overlay, nvidia-imex")
    defaults = ImexSettings()
    group.add_argument("--imex", choices=MODES, default=defaults.mode, help=(
        "stage IMEX: auto = for fabric-attached (GB200-style) profiles (default: %(default)s)"))
    group.add_argument("--imex-channels", type=int, default=defaults.channel_count,
                       metavar="N", help="number of IMEX channel devices (default: %(default)s)")
    group.add_argument("--imex-channel-major", type=int, default=defaults.channel_major,
                       metavar="MAJOR", help=(
                           "character major of the IMEX channel devices (default: %(default)s)"))
    group.add_argument("--imex-archive-dir", metavar="DIR", help=(
        "directory holding the pinned IMEX archive (.tar.gz/.tar.xz), e.g. the volume the "
        "chart's imex.binaries.image fills"))
    group.add_argument("--imex-archive-url", metavar="URL", help=(
        "where the IMEX archive is downloaded from (only with the IMEXDownload feature gate); "
        "its file name also names the archive in --imex-archive-dir"))
    group.add_argument("--imex-archive-sha256", metavar="HEX", help=(
        "sha256 the IMEX archive must have; without it no archive is installed"))
