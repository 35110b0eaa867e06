"""CPU lists and masks the way the kernel prints them in sysfs.

A PCI device's ``local_cpulist`` (``0-55,112-167``) and ``local_cpus``
(``ffffff,ffffffff``) name the CPUs near its root complex.  The profile may
give the list per root complex (``pcie_topology.root_complexes[].cpulist``);
this module parses it strictly and renders both spellings, so the two files
always agree.  The profile's reading keeps the kernel's spelling of the
list (``format_cpulist``), so the engine config's ``cpu_affinity``, which the
library parses with ASCII digits only, reads the same CPUs as sysfs.
"""

from __future__ import annotations

import re

#: Upper bound on a CPU number we accept from a profile.  The kernel's
#: ``NR_CPUS`` tops out at 8192 on the largest configurations; a bigger
#: number is a typo, and rendering its mask would write kilobytes of zeros.
MAX_CPUS = 8192

#: One item of a CPU list: a CPU or a range, ASCII digits only (``int`` alone
#: would take other scripts' digits, which no reader of the list does).
_ITEM_RE = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", re.ASCII)

#: The kernel prints cpumasks in 32-bit chunks, most significant first.
_CHUNK_BITS = 32


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` → ``(0, 1, 2, 3, 8, 10, 11)``; ``ValueError`` says what is wrong."""
    cpus: set[int] = set()
    for item in text.strip().split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"empty item in CPU list {text!r}, expected e.g. 0-55,112-167")
        match = _ITEM_RE.fullmatch(item)
        if match is None:
            raise ValueError(
                f"{item!r} in CPU list {text!r} is not a CPU number or range like 0-55"
            )
        low = int(match[1])
        high = int(match[2]) if match[2] is not None else low
        if low < 0 or high < low:
            raise ValueError(f"range {item!r} in CPU list {text!r} is empty or negative")
        if high >= MAX_CPUS:
            raise ValueError(
                f"CPU {high} in CPU list {text!r} exceeds the kernel limit {MAX_CPUS - 1}"
            )
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: tuple[int, ...]) -> str:
    """Sorted CPU numbers → the kernel's ``%*pbl`` spelling (``0-3,8,10-11``)."""
    ranges: list[str] = []
    start = prev = None
    for cpu in cpus:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            ranges.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = cpu
    if start is not None:
        ranges.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(ranges)


def format_cpumask(cpus: tuple[int, ...], nbits: int) -> str:
    """CPU numbers → the kernel's ``%*pb`` mask over ``nbits`` CPUs.

    Mirrors ``bitmap_string`` in lib/vsprintf.c: 32-bit chunks, most
    significant first, separated by commas; the first chunk is zero-padded
    to the width its remaining bits need, the others to 8 hex digits.  So
    2 CPUs print ``3`` and 56 CPUs ``ffffff,ffffffff``.
    """
    if nbits <= 0:
        raise ValueError(f"cpumask width {nbits}, expected at least 1 CPU")
    mask = 0
    for cpu in cpus:
        if cpu >= nbits:
            raise ValueError(f"CPU {cpu} does not fit a mask of {nbits} CPUs")
        mask |= 1 << cpu
    chunks = (nbits + _CHUNK_BITS - 1) // _CHUNK_BITS
    first_bits = nbits % _CHUNK_BITS or _CHUNK_BITS
    parts = []
    for index in range(chunks - 1, -1, -1):
        value = (mask >> (index * _CHUNK_BITS)) & 0xFFFFFFFF
        width = (first_bits + 3) // 4 if index == chunks - 1 else 8
        parts.append(f"{value:0{width}x}")
    return ",".join(parts)
