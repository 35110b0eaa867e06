"""Settings of the gpudriver simulator, and the flags they come from.

Everything here is a property of the *node* (which majors the host's kernel
hands out, where the image keeps the real ``nvidia-smi``, whether the daemon
may mount), not of the GPU profile, so it arrives through flags rather than
through the desired state.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import attrs

from mokka import layout
from mokka.errors import SpecError

#: How the driver tree is published at ``/run/nvidia/driver``.
PUBLISH_MODES = ("auto", "bind", "symlink")

#: The words ``--idle-signature`` takes.
SWITCH_WORDS = {"on": True, "off": False}

#: Character majors the kernel can hand out (``register_chrdev`` caps them at 4095).
_MAX_MAJOR = 4095

#: Where the image keeps the real ``nvidia-smi`` (patched at image build with
#: RPATH ``$ORIGIN/../lib64`` so it finds the staged library beside it).
DEFAULT_NVIDIA_SMI_BINARY = Path("/usr/local/lib/mokka/nvidia-smi")
#: Where a machine's own installation puts ``nvidia-smi`` (Debian's package:
#: an alternatives link to NVIDIA's binary), used when the image's is absent.
DEFAULT_INSTALLED_NVIDIA_SMI = Path("/usr/bin/nvidia-smi")


def _check_major(instance: object, attribute: attrs.Attribute, value: int) -> None:
    # 195 is the NVIDIA driver's static major: a dynamic one can never equal it.
    if not 1 <= value <= _MAX_MAJOR or value == 195:
        raise SpecError(
            f"gpudriver settings: {attribute.name}: got {value}, "
            f"expected a character major in 1..{_MAX_MAJOR} other than 195"
        )


def _check_publish(instance: object, attribute: attrs.Attribute, value: str) -> None:
    # argparse's choices already guard the flag; this guards direct construction.
    if value not in PUBLISH_MODES:
        raise SpecError(
            f"gpudriver settings: {attribute.name}: got {value!r}, "
            f"expected one of {', '.join(PUBLISH_MODES)}"
        )


def _check_switch(instance: object, attribute: attrs.Attribute, value: bool) -> None:
    # ``--idle-signature`` maps its words; this guards direct construction.
    if not isinstance(value, bool):
        raise SpecError(
            f"gpudriver settings: {attribute.name}: got {value!r}, expected true or false"
        )


@attrs.frozen(kw_only=True)
class GpuDriverSettings:
    """Node-level knobs of the driver footprint."""

    #: Character major of ``/dev/nvidia-uvm`` and ``/dev/nvidia-uvm-tools``.
    #: The real ``nvidia-uvm`` module gets a *dynamic* major (often 510, but
    #: 234 to 511 are all seen), so it is a setting; 510 is the common value.
    uvm_major: int = attrs.field(default=510, validator=_check_major)
    #: Character major of ``/dev/nvidia-caps/nvidia-cap<N>`` (MIG capability
    #: devices); dynamic on real hosts as well.  Shared with the imex
    #: overlay, which announces the same major (see ``layout.NVIDIA_CAPS_MAJOR``).
    caps_major: int = attrs.field(default=layout.NVIDIA_CAPS_MAJOR, validator=_check_major)
    #: Path (in the daemon's own filesystem, not under the node root) of the
    #: real ``nvidia-smi`` ELF the image ships.  When absent, the project's
    #: fallback binary from the native build is staged instead.
    nvidia_smi_binary: Path = attrs.field(default=DEFAULT_NVIDIA_SMI_BINARY, converter=Path)
    #: Path (in the daemon's own filesystem) of an ``nvidia-smi`` installed on
    #: the machine; staged when ``nvidia_smi_binary`` is absent and it is
    #: NVIDIA's real binary (a local run on a machine with Debian's package).
    installed_nvidia_smi: Path = attrs.field(default=DEFAULT_INSTALLED_NVIDIA_SMI, converter=Path)
    #: ``bind`` mounts the driver tree on ``/run/nvidia/driver``; ``symlink``
    #: points a relative symlink there; ``auto`` binds only when the daemon
    #: holds CAP_SYS_ADMIN against a real host root (``/`` or ``/host``),
    #: because a bind mount in a test or local root would outlive nothing
    #: useful and needs privileges a normal run lacks.
    publish: str = attrs.field(default="auto", validator=_check_publish)
    #: Whether the engine config asks the library for each GPU's own idle
    #: signature (``idle_signature: true``; docs/nvml.md, "Idle readings"):
    #: on, a node at rest looks like a real one, each GPU at its own
    #: temperature, draw and PCIe traffic; off, every idle reading is exactly
    #: the profile's figure.
    idle_signature: bool = attrs.field(default=True, validator=_check_switch)

    def __attrs_post_init__(self) -> None:
        # Both ranges start at minor 1 (``nvidia-uvm-tools``, ``nvidia-cap1``):
        # one major for both would make them one device, and a container
        # given the UVM nodes would be given MIG configuration too.
        if self.uvm_major == self.caps_major:
            raise SpecError(
                f"gpudriver settings: uvm_major and caps_major: both {self.uvm_major}, "
                "expected two distinct majors (--uvm-major, --nvidia-caps-major)"
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GpuDriverSettings:
        """Build from the parsed daemon flags (see ``add_arguments``)."""
        return cls(
            uvm_major=args.uvm_major,
            caps_major=args.nvidia_caps_major,
            nvidia_smi_binary=args.nvidia_smi_binary,
            installed_nvidia_smi=args.installed_nvidia_smi,
            publish=args.driver_publish,
            idle_signature=SWITCH_WORDS[args.idle_signature],
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the gpudriver flags, in their own argument group.

    Defaults come from ``GpuDriverSettings`` itself, so the flags and the
    class cannot disagree; validation happens in ``from_args`` (a bad major
    is a ``SpecError`` naming the field, not an argparse usage error).
    """
    group = parser.add_argument_group(
        "gpudriver", "driver footprint: device nodes, NVML, nvidia-smi"
    )
    defaults = GpuDriverSettings()
    group.add_argument(
        "--uvm-major",
        type=int,
        default=defaults.uvm_major,
        metavar="MAJOR",
        help="character major of /dev/nvidia-uvm and nvidia-uvm-tools (default: %(default)s)",
    )
    group.add_argument(
        "--nvidia-caps-major",
        type=int,
        default=defaults.caps_major,
        metavar="MAJOR",
        help="character major of /dev/nvidia-caps/nvidia-cap* (default: %(default)s)",
    )
    group.add_argument(
        "--nvidia-smi-binary",
        type=Path,
        default=defaults.nvidia_smi_binary,
        metavar="PATH",
        help="real nvidia-smi to stage; the built-in fallback is used when it is absent "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--installed-nvidia-smi",
        type=Path,
        default=defaults.installed_nvidia_smi,
        metavar="PATH",
        help="nvidia-smi installed on this machine, staged when --nvidia-smi-binary is absent "
        "and it is NVIDIA's real binary, before the fallback (default: %(default)s)",
    )
    group.add_argument(
        "--driver-publish",
        choices=PUBLISH_MODES,
        default=defaults.publish,
        help="how to publish the driver tree at /run/nvidia/driver: bind mount, relative "
        "symlink, or auto (bind with CAP_SYS_ADMIN on a real host root) (default: %(default)s)",
    )
    group.add_argument(
        "--idle-signature",
        choices=tuple(SWITCH_WORDS),
        default="on" if defaults.idle_signature else "off",
        help="give each idle GPU its own temperature, power draw and PCIe traffic, drifting "
        "slowly, as a real node shows; off: every idle reading is the profile's figure "
        "(default: %(default)s)",
    )
