"""Kernel log records for injected Xids, and the ``/dev/kmsg`` rate limit.

What the NVIDIA driver prints when a GPU reports an Xid (no level prefix):

    NVRM: GPU at PCI:0000:53:00: GPU-<uuid>
    NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.

The first line appears once per GPU, before its first Xid.  The PCI tag is
domain:bus:device in upper-case hex, without the function.

Two *styles*, because a userspace write to ``/dev/kmsg`` is not a kernel
message: it gets facility *user*, and journald then takes a leading
``NVRM:`` as the syslog identifier and strips it from MESSAGE.  Journald
readers (which match ``NVRM: Xid`` in MESSAGE) would miss a single prefix,
so the ``journald`` style doubles it, as NVIDIA's own injector does; raw
``/dev/kmsg``/``dmesg`` readers (node-problem-detector, gpud) match either.

The limiter mirrors the kernel's: ``/dev/kmsg`` writes are rate limited per
open file (``printk.devkmsg=ratelimit``: at most 10 records in a 5 s window
that starts at the first record), and excess records are *silently
dropped*.  So the writer waits for the next window instead of writing.
"""

from __future__ import annotations

import math

import attrs
import trio

from mokka.state.model import Gpu

STYLES = ("journald", "raw")
#: The kernel refuses longer ``/dev/kmsg`` writes (LOG_LINE_MAX is about 1 KiB).
MAX_RECORD_BYTES = 1024

#: NVIDIA's documented meaning of the Xids consumers most often act on
#: (NVIDIA "XID Errors" catalog, the "Xid description" column).
DESCRIPTIONS: dict[int, str] = {
    13: "Graphics Engine Exception.",
    31: "GPU memory page fault.",
    43: "GPU stopped processing.",
    45: "Preemptive cleanup, due to previous errors.",
    48: "Double Bit ECC Error.",
    61: "Internal micro-controller breakpoint/warning.",
    62: "Internal micro-controller halt.",
    63: "ECC page retirement or row remapping recording event.",
    64: "ECC page retirement or row remapper recording failure.",
    68: "NVDEC0 Exception.",
    69: "Graphics Engine class error.",
    74: "NVLINK Error.",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate.",
    94: "Contained ECC error.",
    95: "Uncontained ECC error.",
    109: "Context Switch Timeout Error.",
    119: "GSP RPC Timeout.",
    120: "GSP Error.",
    154: "GPU Recovery Action Changed.",
}
#: For codes the table does not name: consumers key on the number, not the text.
UNKNOWN_DESCRIPTION = "Unspecified error."


def pci_tag(gpu: Gpu) -> str:
    """``PCI:DDDD:BB:DD`` from the canonical ``dddd:bb:dd.f`` bus id."""
    domain, bus, devfn = gpu.bus_id.split(":", 2)
    device = devfn.split(".", 1)[0]
    return f"PCI:{int(domain, 16):04X}:{int(bus, 16):02X}:{int(device, 16):02X}"


def _uuid(gpu: Gpu) -> str:
    return gpu.uuid if gpu.uuid.startswith("GPU-") else f"GPU-{gpu.uuid}"


def _prefix(style: str) -> str:
    if style not in STYLES:
        raise ValueError(f"kmsg style {style!r}, expected one of {', '.join(STYLES)}")
    return "NVRM: NVRM: " if style == "journald" else "NVRM: "


def _record(text: str) -> bytes:
    data = (text + "\n").encode()
    if len(data) > MAX_RECORD_BYTES:
        # One write is one record; never split one.  Only a pathological UUID
        # could get here; cut it, keeping the record a valid UTF-8 line.
        data = data[: MAX_RECORD_BYTES - 1].decode(errors="ignore").encode() + b"\n"
    return data


def gpu_record(gpu: Gpu, style: str) -> bytes:
    """``NVRM: GPU at PCI:…: GPU-<uuid>``, printed once before a GPU's first Xid."""
    return _record(f"{_prefix(style)}GPU at {pci_tag(gpu)}: {_uuid(gpu)}")


def xid_record(gpu: Gpu, code: int, style: str) -> bytes:
    """``NVRM: Xid (PCI:…): <code>, pid='<unknown>', name=<unknown>, <description>``."""
    description = DESCRIPTIONS.get(code, UNKNOWN_DESCRIPTION)
    return _record(
        f"{_prefix(style)}Xid ({pci_tag(gpu)}): {code}, "
        f"pid='<unknown>', name=<unknown>, {description}"
    )


@attrs.define(eq=False)
class WindowLimiter:
    """At most ``burst`` records per window of ``interval`` seconds, like ``___ratelimit``.

    A window opens at the first record after the previous one closed; the
    kernel resets it only once ``interval`` has *fully* passed (strictly
    later, in jiffies), so the next window opens ``slack`` seconds after that
    to stay clear of the boundary.  ``wait`` sleeps with ``trio.sleep_until``,
    so tests run it on the autojump clock.
    """

    #: records per window (the kernel's DEFAULT_RATELIMIT_BURST)
    burst: int = 10
    #: window length in seconds (DEFAULT_RATELIMIT_INTERVAL, 5 * HZ)
    interval: float = 5.0
    #: margin past the window end; a few jiffies at any HZ
    slack: float = 0.05
    _window_start: float = attrs.field(default=-math.inf, init=False)
    _used: int = attrs.field(default=0, init=False)

    @property
    def _window_end(self) -> float:
        return self._window_start + self.interval + self.slack

    def grant(self, wanted: int) -> int:
        """Count up to ``wanted`` records into the current window; return how many fit.

        Opens a new window when the previous one has closed.  Never sleeps,
        so a caller can write every granted record in one batch.
        """
        now = trio.current_time()
        if now >= self._window_end:
            self._window_start, self._used = now, 0
        granted = max(0, min(wanted, self.burst - self._used))
        self._used += granted
        return granted

    async def wait(self) -> None:
        """Sleep until the current window has closed (a no-op if it already has)."""
        await trio.sleep_until(self._window_end)
