"""Settings of the ib simulator, and the flags they come from.

Node properties, so they arrive as flags: how much of an InfiniBand node
to simulate (a cluster may want HCAs on some GPU nodes only; whether the
*profile* has HCAs at all is the profile's business, its ``infiniband``
block, which ``auto`` follows), where the daemon's image keeps the real IB
tools it stages for nodes that lack them, and the relay between the nodes
of a fabric: its address, its peers and the file of the key they share.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import attrs

from mokka.errors import SpecError

#: ``auto``: ``sysfs`` when the profile has an enabled ``infiniband`` block,
#: else ``off``.  ``off``: nothing is staged.  ``sysfs``: the sysfs classes,
#: the device nodes and the ``ibstat``/``ibstatus`` wrappers.  ``full``:
#: ``sysfs`` plus the verbs shim ``libibshim.so`` and the ``ibv_devinfo`` and
#: ``ibv_devices`` wrappers.
MODES = ("auto", "off", "sysfs", "full")

#: Where the image keeps Debian's ``ibstat``, ``ibstatus``, ``ibv_devinfo``
#: and ``ibv_devices`` with their library closure (``bin/``, ``lib/``; laid
#: out by ``deploy/image/install-ib-tools.sh``).
DEFAULT_TOOLS_DIR = Path("/usr/local/lib/mokka/ib")

#: The relay's documented TCP port (``docs/ib.md``; the Helm chart passes it
#: as ``--ib-relay-port``): every daemon of a fabric listens on it and dials
#: its peers there unless ``--ib-peer`` names another address.
RELAY_PORT = 18515


def _peers(value: object) -> dict[str, tuple[str, int]]:
    """``{node: (host, port)}`` from ``NAME=HOST:PORT`` strings or a mapping."""
    if isinstance(value, dict):
        return dict(value)
    peers: dict[str, tuple[str, int]] = {}
    for item in value or ():  # type: ignore[attr-defined]
        name, sep, address = str(item).partition("=")
        host, colon, port = address.rpartition(":")
        if not (sep and colon and name and host and port.isdigit() and 0 < int(port) < 65536):
            raise SpecError(
                f"--ib-peer: {item!r}, expected NODE=HOST:PORT (the node's relay address)"
            )
        peers[name] = (host.strip("[]"), int(port))
    return peers


@attrs.frozen(kw_only=True)
class IbSettings:
    """Node-level knobs of the mock InfiniBand HCAs."""

    #: See ``MODES``.  ``auto`` by default: GPU profiles without HCAs (a100,
    #: l40s, t4) stay without them, HGX/GB200-class profiles (h100, b200,
    #: gb200, gb300) get them, with the surface every sysfs reader needs.
    #: ``full`` is opt-in: it stages a preload library as well.
    mode: str = "auto"
    #: Path, in the daemon's own filesystem (not under the node root), of
    #: the image's IB tools bundle.  When the directory exists its ``bin/``
    #: and ``lib/`` are staged into the driver tree and the wrappers run
    #: those copies, so a node needs no ``infiniband-diags`` or
    #: ``ibverbs-utils`` of its own; when it does not (a run from a
    #: checkout, the tests), the wrappers run the machine's installed tools.
    tools_dir: Path = attrs.field(default=DEFAULT_TOOLS_DIR, converter=Path)
    #: Address and port the relay listens on when the fabric has other nodes;
    #: no port, no relay (the fabric is opt-in: several mock nodes on one
    #: machine would otherwise contend for one port).
    relay_address: str = "0.0.0.0"
    relay_port: int | None = None
    #: Relay addresses of peers by node name; a peer not named here is dialled
    #: at its node name and ``relay_port`` (host network on a cluster).
    peers: dict[str, tuple[str, int]] = attrs.field(factory=dict, converter=_peers)
    #: The file holding the fabric's shared relay key (``relaykeys.load_keys``;
    #: a mounted Kubernetes Secret on a cluster).  Read when the relay starts
    #: and for every connection, never logged; the daemon refuses
    #: ``--ib-relay-port`` without it: a relay takes no peer it cannot
    #: authenticate.
    relay_key_file: Path | None = attrs.field(
        default=None, converter=lambda v: None if v is None else Path(v)
    )

    def __attrs_post_init__(self) -> None:
        if self.mode not in MODES:
            raise SpecError(f"--ib-mode: {self.mode!r}, expected one of {', '.join(MODES)}")
        if self.relay_port is not None and not 0 <= self.relay_port < 65536:
            raise SpecError(f"--ib-relay-port: {self.relay_port}, expected a TCP port 0..65535")

    def peer_address(self, node: str) -> tuple[str, int]:
        return self.peers.get(node, (node, self.relay_port or RELAY_PORT))

    def effective_mode(self, has_infiniband: bool) -> str:
        """``off``, ``sysfs`` or ``full`` for a state with or without an IB block."""
        if self.mode == "auto":
            return "sysfs" if has_infiniband else "off"
        return self.mode

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> IbSettings:
        """Build from the parsed daemon flags (see ``add_arguments``)."""
        if args.ib_relay_port is not None and args.ib_relay_key_file is None:
            raise SpecError(
                f"--ib-relay-port {args.ib_relay_port}: the relay needs --ib-relay-key-file, "
                "expected the file of the fabric's shared key (docs/ib.md: the relay key)"
            )
        return cls(
            mode=args.ib_mode, tools_dir=args.ib_tools_dir,
            relay_address=args.ib_relay_address, relay_port=args.ib_relay_port,
            peers=args.ib_peer, relay_key_file=args.ib_relay_key_file,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ib flags, in their own argument group."""
    group = parser.add_argument_group("ib", "mock InfiniBand HCAs (sysfs, device nodes, tools)")
    group.add_argument(
        "--ib-mode",
        choices=MODES,
        default=IbSettings().mode,
        help="InfiniBand HCAs: auto = sysfs when the profile has an enabled infiniband block; "
        "sysfs = sysfs tree, device nodes, ibstat/ibstatus wrappers; full = sysfs plus the "
        "verbs shim and ibv_devinfo/ibv_devices wrappers; off = none (default: %(default)s)",
    )
    group.add_argument(
        "--ib-tools-dir",
        type=Path,
        default=IbSettings().tools_dir,
        metavar="DIR",
        help="the image's real IB tools (bin/, lib/) to stage into the driver tree for the "
        "wrappers; when DIR does not exist the wrappers run the machine's own ibstat, "
        "ibstatus, ibv_devinfo, ibv_devices (default: %(default)s)",
    )
    group.add_argument(
        "--ib-relay-address",
        default=IbSettings().relay_address,
        metavar="HOST",
        help="address the InfiniBand relay listens on when the topology document puts this "
        "node in a fabric with others (default: %(default)s)",
    )
    group.add_argument(
        "--ib-relay-port",
        type=int,
        default=None,
        metavar="PORT",
        help="turn on the InfiniBand relay between the daemons of one fabric (the nodes of "
        f"the topology document) on this TCP port; the documented port is {RELAY_PORT} "
        "(default: off, each node is a fabric of its own)",
    )
    group.add_argument(
        "--ib-peer",
        action="append",
        default=[],
        metavar="NODE=HOST:PORT",
        help="relay address of a fabric peer (repeatable); peers not named are dialled at "
        "their node name and --ib-relay-port",
    )
    group.add_argument(
        "--ib-relay-key-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="the fabric's shared relay key (required with --ib-relay-port): at least 32 "
        "bytes, e.g. from a Kubernetes Secret; the relay takes only peers that prove it. "
        "Extra keys on further lines are accepted from peers (rotation)",
    )
