"""Settings of the nri simulator (Mokka's NRI plugin), and the flags they come from.

The plugin talks to the containerd NRI socket the cri simulator configures
(``--nri-socket``); whether it runs is its own flag, ``--nri-plugin``, since
containerd's NRI can be on for other plugins while Mokka's is off.
"""

from __future__ import annotations

import argparse
import posixpath
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs

from mokka.errors import SpecError

#: The connection's entry point: ``run_plugin(socket_path, name, index,
#: on_create, *, task_status)`` (``mokka.simulators.nri.connection``).
RunPlugin = Callable[..., Awaitable[Any]]

ON_OFF = ("on", "off")
#: The plugin's name and index as containerd lists them (``ctr plugins``,
#: logs).  Index 10: early, so later plugins see (and may override) what it
#: injected.
PLUGIN_NAME = "mokka"
PLUGIN_INDEX = "10"


@attrs.frozen(kw_only=True)
class NriSettings:
    """Knobs of the NRI plugin; validated as a whole in ``__attrs_post_init__``."""

    #: Run the plugin.  On by default: it injects nothing into a container
    #: that sees no mock GPU, and a node without NRI merely reports it not
    #: registered.
    enabled: bool = True
    #: Give every container ``nvidia-smi``, the library and the engine config
    #: (``mokka.io/nri: "off"`` opts a pod out).  Off by default: a pod that
    #: asked for no GPU sees none, as on a real node.
    ambient: bool = False
    #: Also bind ``/proc/driver/nvidia`` and the IMEX ``/proc/devices``
    #: overlay.  Off by default: runc refuses any mount inside ``/proc`` (but
    #: a few lxcfs files) and would fail the container.
    proc_mounts: bool = False
    #: Give containers that see mock GPUs a ``/sys/devices`` of their own (the
    #: node's entries and the staged PCI roots of their devices) and the bus
    #: as links into it, so a device's ``/sys/devices/pci…`` path resolves.
    #: Off by default: the node's ``virtual/net`` then stands for the
    #: container's, among other caveats (docs/nri.md).
    sys_devices: bool = False
    #: containerd's NRI socket, as a path of the daemon's own filesystem
    #: (the chart mounts its directory at the same path).  ``None``: the cri
    #: simulator's ``--nri-socket`` under the node root.
    socket: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    #: The cri simulator's node path of the socket (the default above).
    node_socket: str = "/var/run/nri/nri.sock"
    #: The node root as containerd sees it: mount sources are node paths
    #: below it.  ``/`` when the daemon's node root is the host's ``/``
    #: (the chart's ``/host``); a local run with its own containerd passes
    #: the node root itself.
    mount_root: str = "/"
    #: The node's real sysfs (which PCI roots exist; with ``sys_devices``
    #: also the source of its ``/sys/devices`` entries, a path containerd
    #: sees alike: the chart's pod and the host both have it at ``/sys``).
    sysfs: Path = attrs.field(default=Path("/sys"), converter=Path)
    #: The connection to run; ``None``: ``connection.run_plugin`` (tests
    #: inject a fake here).
    run_plugin: RunPlugin | None = attrs.field(default=None, eq=False)

    def __attrs_post_init__(self) -> None:
        problems = []
        if not posixpath.isabs(self.mount_root):
            problems.append(
                f"nri settings: mount_root: {self.mount_root!r}, expected an absolute path"
            )
        if not posixpath.isabs(self.node_socket):
            problems.append(
                f"nri settings: node_socket: {self.node_socket!r}, expected an absolute path"
            )
        if self.socket is not None and not self.socket.is_absolute():
            problems.append(
                f"nri settings: socket: {str(self.socket)!r}, expected an absolute path"
            )
        if problems:
            raise SpecError(problems)

    def source(self, node_path: str) -> str:
        """Host path (as containerd sees it) of ``node_path``."""
        root = self.mount_root.rstrip("/")
        return f"{root}{node_path}"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NriSettings:
        """Build from the parsed daemon flags (see ``add_arguments``; ``--nri-socket`` is cri's)."""
        return cls(
            enabled=args.nri_plugin == "on",
            ambient=args.nri_ambient == "on",
            proc_mounts=args.nri_proc_mounts == "on",
            sys_devices=args.nri_sys_devices == "on",
            socket=args.nri_plugin_socket or None,
            node_socket=getattr(args, "nri_socket", cls.node_socket),
            mount_root=args.nri_mount_root,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the nri flags, in their own argument group."""
    group = parser.add_argument_group(
        "nri", "NRI plugin: what containers seeing mock GPUs get injected"
    )
    group.add_argument("--nri-plugin", choices=ON_OFF, default="on", help=(
        "run Mokka's NRI plugin on containerd's --nri-socket (default: %(default)s)"))
    group.add_argument("--nri-ambient", choices=ON_OFF, default="off", help=(
        "give every container nvidia-smi and NVML; the pod annotation mokka.io/nri "
        "opts out (default: %(default)s)"))
    group.add_argument("--nri-proc-mounts", choices=ON_OFF, default="off", help=(
        "also mount /proc/driver/nvidia and /proc/devices (runc refuses mounts inside "
        "/proc; default: %(default)s)"))
    group.add_argument("--nri-sys-devices", choices=ON_OFF, default="off", help=(
        "give containers seeing mock GPUs their own /sys/devices with the GPUs' staged "
        "PCI roots, so /sys/bus/pci/devices/<bdf> links resolve; see docs/nri.md for "
        "its caveats (default: %(default)s)"))
    group.add_argument("--nri-plugin-socket", default="", metavar="PATH", help=(
        "the NRI socket in the daemon's filesystem (default: --nri-socket under the "
        "node root)"))
    group.add_argument("--nri-mount-root", default="/", metavar="DIR", help=(
        "the node root as containerd sees it, prefixed to mount sources "
        "(default: %(default)s)"))
