"""Settings of the cri simulator, and the flags they come from.

Everything here describes the *node's* container runtime (where containerd
keeps its configuration, how to reach the host's systemd, where the image
keeps the NVIDIA Container Toolkit), not the GPU profile, so it arrives
through flags rather than through the desired state.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path, PurePosixPath

import attrs

from mokka.errors import SpecError

#: How containerd learns about a changed drop-in.
RESTART_MODES = ("systemd", "none")

#: Where the image keeps the toolkit release it ships (a path in the daemon's
#: own filesystem, not under the node root).
DEFAULT_TOOLKIT_DIR = Path("/usr/local/lib/mokka/toolkit")

#: ``systemctl`` in the host's namespaces.  The pod runs with hostPID, so
#: PID 1 is the host's init; entering its mount, UTS, IPC, network and PID
#: namespaces gives ``systemctl`` the host's D-Bus socket and unit files
#: without mounting anything into the pod.
DEFAULT_SYSTEMCTL = ("nsenter", "-t", "1", "-m", "-u", "-i", "-n", "-p", "systemctl")

# Validators: each raises ``SpecError`` naming the field, what it got and
# what it expected, so a bad chart value fails the daemon's start with one line.


def _check_restart_mode(instance: object, attribute: attrs.Attribute, value: str) -> None:
    if value not in RESTART_MODES:
        raise SpecError(
            f"cri settings: {attribute.name}: got {value!r}, "
            f"expected one of {', '.join(RESTART_MODES)}"
        )


def _check_node_path(instance: object, attribute: attrs.Attribute, value: str) -> None:
    path = PurePosixPath(value)
    if not path.is_absolute() or ".." in path.parts:
        raise SpecError(
            f"cri settings: {attribute.name}: got {value!r}, "
            "expected an absolute host path without '..'"
        )


def _check_argv(instance: object, attribute: attrs.Attribute, value: tuple[str, ...]) -> None:
    if not value or not all(value):
        raise SpecError(
            f"cri settings: {attribute.name}: got {value!r}, expected a non-empty command"
        )


def _check_timeout(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not value > 0:
        raise SpecError(f"cri settings: {attribute.name}: got {value!r}, expected seconds > 0")


@attrs.frozen(kw_only=True)
class CriSettings:
    """Node-level knobs of the CDI specs and the containerd runtime setup."""

    #: Configure containerd for the ``nvidia`` runtime (SURFACES §6.2).  Off,
    #: only the CDI specs are published: enough for podman, CRI-O or a
    #: containerd someone else configured for CDI.
    container_runtime: bool = True
    #: Where the image keeps the toolkit release (daemon filesystem, not the
    #: node root).  Every regular file in it is installed on the node.
    toolkit_dir: Path = attrs.field(default=DEFAULT_TOOLKIT_DIR, converter=Path)
    #: containerd's main config (host path); the runtime setup adds one
    #: marked ``imports`` line for the drop-in directory to it, and takes
    #: it out again at teardown.
    containerd_config: str = attrs.field(
        default="/etc/containerd/config.toml", validator=_check_node_path
    )
    #: Directory of containerd drop-ins (host path); ours is ``50-mokka.toml``.
    containerd_config_dir: str = attrs.field(
        default="/etc/containerd/conf.d", validator=_check_node_path
    )
    #: Enable containerd's NRI plugin in the same drop-in (containerd 1.7
    #: ships it disabled) and publish the CDI spec of the project's NRI
    #: plugin (``mokka-nri.yaml``); off, neither.
    nri: bool = True
    #: Socket containerd's NRI plugin listens on (host path).
    nri_socket: str = attrs.field(default="/var/run/nri/nri.sock", validator=_check_node_path)
    #: ``systemd``: restart containerd when the drop-in changed and once at
    #: daemon start; ``none``: write the drop-in, log that a restart is
    #: pending, and leave the restart to the operator.
    restart_mode: str = attrs.field(default="systemd", validator=_check_restart_mode)
    #: argv prefix reaching the host's ``systemctl`` (tests put a recording
    #: fake here).
    systemctl: tuple[str, ...] = attrs.field(
        default=DEFAULT_SYSTEMCTL, converter=tuple, validator=_check_argv
    )
    #: Seconds one ``systemctl restart containerd`` or ``nvidia-ctk`` run
    #: may take.  containerd restarts in a few seconds; a unit stuck in
    #: ``activating`` should surface as not-ready, not hang the pass.
    command_timeout: float = attrs.field(default=120.0, validator=_check_timeout)

    @property
    def dropin(self) -> str:
        """Host path of our containerd drop-in.

        ``50-``: after distribution drop-ins (``00-``…), before an operator's
        own overrides (``99-``), since containerd merges imports in order.
        """
        return f"{self.containerd_config_dir.rstrip('/')}/50-mokka.toml"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CriSettings:
        """Build from the parsed daemon flags (see ``add_arguments``)."""
        return cls(
            container_runtime=args.container_runtime == "on",
            toolkit_dir=args.toolkit_dir,
            containerd_config=args.containerd_config,
            containerd_config_dir=args.containerd_config_dir,
            nri=args.nri == "on",
            nri_socket=args.nri_socket,
            restart_mode=args.restart_mode,
            systemctl=_split("--systemctl-command", args.systemctl_command),
        )


def _split(flag: str, text: str) -> tuple[str, ...]:
    """A command flag split the way a shell would, or a ``SpecError`` naming the flag."""
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise SpecError(f"{flag}: {text!r}: {exc}, expected a shell-quoted command") from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the cri flags, in their own argument group.

    The chart renders ``--container-runtime``, ``--containerd-config-dir``,
    ``--restart-mode``, ``--nri`` and ``--nri-socket`` from
    ``nodeAgent.containerRuntime`` and ``nodeAgent.nri``; the systemctl
    prefix exists for tests and unusual hosts.  on/off flags (not
    ``--x``/``--no-x``) so a rendered value is always explicit.
    """
    group = parser.add_argument_group("cri", "CDI specs and the containerd runtime setup")
    defaults = CriSettings()
    group.add_argument(
        "--container-runtime",
        choices=("on", "off"),
        default="on",
        help="install the NVIDIA Container Toolkit shipped in the image and configure "
        "containerd for it (default: %(default)s)",
    )
    group.add_argument(
        "--toolkit-dir",
        type=Path,
        default=defaults.toolkit_dir,
        metavar="DIR",
        help="the image's copy of the toolkit release (default: %(default)s)",
    )
    group.add_argument(
        "--containerd-config",
        default=defaults.containerd_config,
        metavar="PATH",
        help="containerd's main config on the host (default: %(default)s)",
    )
    group.add_argument(
        "--containerd-config-dir",
        default=defaults.containerd_config_dir,
        metavar="DIR",
        help="containerd drop-in directory on the host; ours is 50-mokka.toml "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--nri",
        choices=("on", "off"),
        default="on",
        help="enable containerd's NRI plugin in the drop-in and publish the NRI plugin's "
        "CDI spec (default: %(default)s)",
    )
    group.add_argument(
        "--nri-socket",
        default=defaults.nri_socket,
        metavar="PATH",
        help="socket of containerd's NRI plugin (default: %(default)s)",
    )
    group.add_argument(
        "--restart-mode",
        choices=RESTART_MODES,
        default=defaults.restart_mode,
        help="restart containerd through the host's systemd, or only log that a restart "
        "is pending (default: %(default)s)",
    )
    group.add_argument(
        "--systemctl-command",
        default=shlex.join(defaults.systemctl),
        metavar="CMD",
        help="command prefix reaching the host's systemctl (default: %(default)s)",
    )
    # nvidia-ctk no longer runs against the host's files (it works on a
    # scratch copy in the daemon's own filesystem, see ``runtime.py``), so
    # there is nothing left to prefix; command lines that still pass the
    # flag keep starting.
    group.add_argument(
        "--host-exec-command",
        metavar="CMD",
        help="no longer used: nvidia-ctk runs on a scratch copy of containerd's config "
        "in the daemon's own filesystem (accepted so existing command lines still start)",
    )
