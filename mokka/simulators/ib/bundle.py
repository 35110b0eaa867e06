"""The image's real IB tools, staged into the driver tree.

Real Kubernetes nodes rarely have ``infiniband-diags`` or ``ibverbs-utils``
installed, so the image carries Debian's ``ibstat``, ``ibstatus``,
``ibv_devinfo`` and ``ibv_devices`` with their non-glibc library closure
(``deploy/image/install-ib-tools.sh``), laid out as::

    <tools dir>/bin/<tool>      RUNPATH $ORIGIN/../lib (ibstatus: a shell script)
    <tools dir>/lib/<soname>    RUNPATH $ORIGIN

The ib simulator copies ``bin/`` and ``lib/`` as siblings into the driver
tree (``STAGED_BIN``, ``STAGED_LIB``), so the relative RUNPATHs still lead
each binary to the copied libraries, whichever path the driver tree is
reached by (the state root, the ``/run/nvidia/driver`` symlink or bind
mount): the node's own libraries, if any, are never consulted, and only
glibc comes from the node.

The bundle is read from the daemon's own filesystem (the image), not from
the node root; a missing directory means "no bundle" (a run from a checkout
uses the machine's tools), while a directory that exists but is not a
bundle is an error, since an image that ships half a bundle is broken.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from mokka import layout
from mokka.errors import SpecError
from mokka.noderoot import Artifact, CopyOf

#: Where the bundle lands inside the driver tree (``bin/`` and ``lib/`` as
#: siblings, like in the image, so ``$ORIGIN/../lib`` holds).
STAGED_DIR = f"{layout.DRIVER_LOCAL_LIB}/mokka-ib"
STAGED_BIN = f"{STAGED_DIR}/bin"
STAGED_LIB = f"{STAGED_DIR}/lib"

#: Executables and shared libraries; a library needs no execute bit (Debian
#: ships them 0644).
BIN_MODE = 0o755
LIB_MODE = 0o644


@attrs.frozen
class ToolBundle:
    """A tools directory that holds a bundle: its file names, sorted."""

    #: the directory in the daemon's filesystem (``--ib-tools-dir``)
    directory: Path
    #: file names in ``bin/`` (the tools)
    binaries: tuple[str, ...]
    #: file names in ``lib/`` (sonames)
    libraries: tuple[str, ...]


def _files(directory: Path, problems: list[str]) -> tuple[str, ...]:
    """The regular files in ``directory``; anything else is a problem."""
    if not directory.is_dir():
        problems.append(f"{directory}: missing, expected a directory")
        return ()
    names = []
    for entry in sorted(directory.iterdir()):
        if entry.is_file():
            names.append(entry.name)
        else:
            problems.append(f"{entry}: not a regular file, expected only files in {directory}")
    return tuple(names)


def find_bundle(directory: Path, needed: tuple[str, ...]) -> ToolBundle | None:
    """The bundle at ``directory``, or ``None`` when the directory does not exist.

    ``needed`` names the tools the current mode wraps; each must be in
    ``bin/``.  Every problem is reported at once (``SpecError``), before
    anything is written.
    """
    if not directory.exists():
        return None
    problems: list[str] = []
    if not directory.is_dir():
        raise SpecError(f"--ib-tools-dir: {directory} is not a directory")
    binaries = _files(directory / "bin", problems)
    libraries = _files(directory / "lib", problems)
    for tool in needed:
        if (directory / "bin").is_dir() and tool not in binaries:
            problems.append(
                f"{directory / 'bin'}: no {tool}, expected the tools "
                f"{', '.join(needed)} (laid out by deploy/image/install-ib-tools.sh)"
            )
    if problems:
        raise SpecError([f"--ib-tools-dir: {p}" for p in problems])
    return ToolBundle(directory=directory, binaries=binaries, libraries=libraries)


def bundle_artifacts(bundle: ToolBundle) -> list[Artifact]:
    """Copies of every tool and library, compared by digest (no rewrite when unchanged)."""
    artifacts: list[Artifact] = [
        CopyOf(f"{STAGED_BIN}/{name}", bundle.directory / "bin" / name, mode=BIN_MODE)
        for name in bundle.binaries
    ]
    artifacts += [
        CopyOf(f"{STAGED_LIB}/{name}", bundle.directory / "lib" / name, mode=LIB_MODE)
        for name in bundle.libraries
    ]
    return artifacts
