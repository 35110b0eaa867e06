"""Settings of the pcibus simulator, and the flags they come from.

Node properties, not profile ones: where NFD looks for local features, and
how many CPUs this machine has (a root complex the profile gives no
``cpulist`` is local to all of them).
"""

from __future__ import annotations

import argparse
import os
from pathlib import PurePosixPath

import attrs

from mokka import layout
from mokka.errors import SpecError
from mokka.state.cpulists import MAX_CPUS


def _host_cpus() -> int:
    # The CPUs this process may run on, which in a pod is what the node has
    # (the DaemonSet is not CPU-pinned); os.cpu_count() as a fallback.
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _check_features_dir(instance: object, attribute: attrs.Attribute, value: str) -> None:
    path = PurePosixPath(value)
    if not path.is_absolute() or ".." in path.parts:
        raise SpecError(
            f"pcibus settings: --nfd-features-dir: got {value!r}, expected an absolute node "
            "path without '..' (it is resolved under the node root)"
        )


def _check_cpus(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if not 1 <= value <= MAX_CPUS:
        raise SpecError(
            f"pcibus settings: {attribute.name}: got {value}, expected 1..{MAX_CPUS} CPUs"
        )


@attrs.frozen(kw_only=True)
class PcibusSettings:
    """Node-level knobs of the mock PCI bus."""

    #: Node path of NFD's local feature directory; ``mokka.features`` is
    #: written there on Apply.  The default is where NFD's worker looks
    #: (``/etc/kubernetes/node-feature-discovery/features.d``).
    nfd_features_dir: str = attrs.field(
        default=layout.NFD_FEATURES_DIR, validator=_check_features_dir
    )
    #: Number of CPUs (``0..n-1``) a root complex is local to when the
    #: profile gives it no ``cpulist``; default: the CPUs this process may
    #: use, i.e. the node's.  Unit: CPUs.
    fallback_cpus: int = attrs.field(factory=_host_cpus, validator=_check_cpus)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PcibusSettings:
        """Build from the parsed daemon flags (see ``add_arguments``)."""
        return cls(nfd_features_dir=args.nfd_features_dir)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the pcibus flags, in their own argument group."""
    group = parser.add_argument_group("pcibus", "mock PCI tree, libmockfs.so, NFD feature file")
    group.add_argument(
        "--nfd-features-dir",
        default=layout.NFD_FEATURES_DIR,
        metavar="PATH",
        help="node path of NFD's local feature directory; mokka.features is written there "
        "(default: %(default)s)",
    )
