"""The ``/proc/devices`` overlay that tells consumers the IMEX majors.

The NVIDIA DRA driver finds the IMEX channel major by reading
``/proc/devices`` (or the file named by ``ALT_PROC_DEVICES_PATH``) with

    (?s)Character devices:.*?([0-9]+) nvidia-caps-imex-channels\\n.*Block devices:

so the overlay must stay a well-formed ``/proc/devices``: the host's own
list with our two names appended at the end of the character section.  The
base text is the host's file when the node root is a real host (the file
exists under it), otherwise a bundled sample of a Debian host, so a test or
laptop root gets a realistic file too.

Everything here is pure (text in, text out) except ``read_base``, which reads
one file; the simulator calls it inside its converge thread.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from mokka.errors import SpecError
from mokka.noderoot import Host

#: Names the NVIDIA driver registers; consumers look these up by name.
CHANNELS_NAME = "nvidia-caps-imex-channels"
CAPS_NAME = "nvidia-caps"
_OURS = (CHANNELS_NAME, CAPS_NAME)

#: A typical Debian host's ``/proc/devices``, used when the root is not a host.
SAMPLE = Path(__file__).resolve().parent.parent.parent / "data" / "proc-devices.sample"

_CHAR_HEADER = "Character devices:"
_BLOCK_HEADER = "Block devices:"
#: One entry: right-aligned major, one space, the name (which may hold spaces
#: or slashes: ``/dev/vc/0``).
_ENTRY = re.compile(r"^\s*([0-9]+) (\S.*)$")
#: ``register_chrdev`` caps majors at 4095 (CHRDEV_MAJOR_MAX - 1).
MAX_MAJOR = 4095


@attrs.frozen
class BaseText:
    """The ``/proc/devices`` text the overlay starts from, and where it came from."""

    text: str
    #: shown in errors and logs: the host path, or the sample's path
    source: str


def read_base(host: Host) -> BaseText:
    """The host's ``/proc/devices`` under the root, or the bundled sample.

    Blocking (reads a file); called from the simulator's converge thread.
    """
    real = host.resolve("/proc/devices", follow_last=True)
    if real.is_file():
        try:
            return BaseText(real.read_bytes().decode(), str(real))
        except UnicodeDecodeError as exc:
            # Refused like any other malformed base: before any write, one line.
            raise SpecError(
                f"{real}: not text ({exc.reason} at byte {exc.start}); expected the "
                "kernel's list of character and block devices"
            ) from None
    return BaseText(SAMPLE.read_text(), str(SAMPLE))


def consumer_pattern(name: str) -> re.Pattern[str]:
    """The regex the DRA driver applies to find ``name``'s major (kept here for tests and docs)."""
    return re.compile(
        r"(?s)Character devices:.*?([0-9]+) " + re.escape(name) + r"\n.*Block devices:"
    )


def overlay(base: BaseText, *, channel_major: int, caps_major: int) -> str:
    """``base`` with our two names at the end of the character section.

    Earlier lines naming ``nvidia-caps-imex-channels`` or ``nvidia-caps`` (a
    host with a real driver, or our own output fed back) are dropped first, so
    the result is the same however often it is applied.  Raises ``SpecError``
    when a major is out of range, both majors are equal, another name already
    holds one of them, or ``base`` is not a ``/proc/devices`` file.
    """
    problems = _check_majors(channel_major, caps_major)
    if problems:
        raise SpecError(problems)
    lines = base.text.splitlines()
    char_at = _find_header(lines, _CHAR_HEADER, 0, base.source)
    block_at = _find_header(lines, _BLOCK_HEADER, char_at + 1, base.source)
    kept: list[str] = []
    for number, line in enumerate(lines[char_at + 1 : block_at], start=char_at + 2):
        if not line.strip():
            continue  # the blank separator; re-added below
        match = _ENTRY.match(line)
        if match is None:
            raise SpecError(
                f"{base.source}: line {number}: {line!r} is not a device entry, "
                "expected '<major> <name>'"
            )
        major, name = int(match.group(1)), match.group(2)
        if name in _OURS:
            continue  # replaced by ours below
        for flag, wanted in _flags(channel_major, caps_major):
            if major == wanted:
                problems.append(
                    f"{base.source}: line {number}: character major {major} is already taken "
                    f"by {name!r}, expected {flag} to name a free major"
                )
        kept.append(line)
    if problems:
        raise SpecError(problems)
    out = [
        *lines[:char_at],
        _CHAR_HEADER,
        *kept,
        f"{channel_major:3d} {CHANNELS_NAME}",
        f"{caps_major:3d} {CAPS_NAME}",
        "",
        *lines[block_at:],
    ]
    return "\n".join(out).rstrip("\n") + "\n"


def _flags(channel_major: int, caps_major: int) -> tuple[tuple[str, int], ...]:
    """Each major with the flag that sets it, so errors tell the user what to change."""
    return (("--imex-channel-major", channel_major), ("--nvidia-caps-major", caps_major))


def _check_majors(channel_major: int, caps_major: int) -> list[str]:
    problems = []
    for flag, value in _flags(channel_major, caps_major):
        if not 1 <= value <= MAX_MAJOR:
            problems.append(f"{flag}: {value}, expected a character major in 1..{MAX_MAJOR}")
    if channel_major == caps_major:
        problems.append(
            f"--imex-channel-major and --nvidia-caps-major: both {channel_major}, "
            "expected two distinct majors"
        )
    return problems


def _find_header(lines: list[str], header: str, start: int, source: str) -> int:
    """Index of the section header line; a file without it is not ``/proc/devices``."""
    for index in range(start, len(lines)):
        if lines[index].strip() == header:
            return index
    where = "" if start == 0 else " after 'Character devices:'"
    raise SpecError(f"{source}: no {header!r} line{where}, expected a /proc/devices file")
