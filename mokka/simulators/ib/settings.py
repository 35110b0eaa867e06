"""Settings of the ib simulator, and the flag they come from.

One knob: how much of an InfiniBand node to simulate.  It is a node
property (a cluster may want HCAs on some GPU nodes only), so it arrives as
a flag; whether the *profile* has HCAs at all is the profile's business
(its ``infiniband`` block), which ``auto`` follows.
"""

from __future__ import annotations

import argparse

import attrs

from mokka.errors import SpecError

#: ``auto``: ``sysfs`` when the profile has an enabled ``infiniband`` block,
#: else ``off``.  ``off``: nothing is staged.  ``sysfs``: the sysfs classes,
#: the device nodes and the ``ibstat``/``ibstatus`` wrappers.  ``full``:
#: ``sysfs`` plus the verbs shim ``libibshim.so`` and an ``ibv_devinfo``
#: wrapper.
MODES = ("auto", "off", "sysfs", "full")


@attrs.frozen(kw_only=True)
class IbSettings:
    """Node-level knobs of the mock InfiniBand HCAs."""

    #: See ``MODES``.  ``auto`` by default: GPU profiles without HCAs (a100,
    #: l40s, t4) stay without them, HGX/GB200-class profiles (h100, b200,
    #: gb200, gb300) get them, with the surface every sysfs reader needs.
    #: ``full`` is opt-in: it stages a preload library as well.
    mode: str = "auto"

    def __attrs_post_init__(self) -> None:
        if self.mode not in MODES:
            raise SpecError(f"--ib-mode: {self.mode!r}, expected one of {', '.join(MODES)}")

    def effective_mode(self, has_infiniband: bool) -> str:
        """``off``, ``sysfs`` or ``full`` for a state with or without an IB block."""
        if self.mode == "auto":
            return "sysfs" if has_infiniband else "off"
        return self.mode

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> IbSettings:
        """Build from the parsed daemon flags (see ``add_arguments``)."""
        return cls(mode=args.ib_mode)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ib flag, in its own argument group."""
    group = parser.add_argument_group("ib", "mock InfiniBand HCAs (sysfs, device nodes, tools)")
    group.add_argument(
        "--ib-mode",
        choices=MODES,
        default=IbSettings().mode,
        help="InfiniBand HCAs: auto = sysfs when the profile has an enabled infiniband block; "
        "sysfs = sysfs tree, device nodes, ibstat/ibstatus wrappers; full = sysfs plus the "
        "verbs shim and an ibv_devinfo wrapper; off = none (default: %(default)s)",
    )
