"""The mock NVML library, the CUDA stub and ``nvidia-smi`` in the driver tree (SURFACES §3, §4).

Both are copied from files outside the node root (the native build, the
image), so this module only *plans* the copies: it decides which source to
use and names every artifact; ``Host.converge`` compares digests and copies
only when a source changed.

The library is laid out the way the driver installer does it::

    usr/lib64/libnvidia-ml.so.<driver_version>   the file (SONAME libnvidia-ml.so.1)
    usr/lib64/libnvidia-ml.so.1 -> libnvidia-ml.so.<driver_version>
    usr/lib64/libnvidia-ml.so   -> libnvidia-ml.so.1

Consumers reach it by all three names: nvidia-smi and pynvml ``dlopen``
``libnvidia-ml.so.1``, the DRA driver opens it by explicit path, the
container toolkit globs ``libnvidia-ml.so.*`` to learn the driver version.
Links are relative so they resolve inside a container that mounts only the
driver root, and through ``/run/nvidia/driver``.

``libcuda`` is laid out the same way (``libcuda.so.<driver_version>``, then
``libcuda.so.1`` and ``libcuda.so``).  It is a stub that reports no CUDA
device (``native/libcuda``): Mokka simulates no compute, but the tools that
write CDI specs from a driver root (the container toolkit's ``nvcdi``, which
``nvidia-ctk cdi generate`` and the device plugin's ``cdi-*`` strategies
use) require ``libcuda.so.<driver_version>`` there, as a real driver root
has it.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from mokka import layout, native
from mokka.errors import NativeArtifactMissing
from mokka.noderoot import Artifact, CopyOf, Symlink

#: The SONAME every consumer loads.
NVML_SONAME = "libnvidia-ml.so.1"
#: The CUDA driver's SONAME.
CUDA_SONAME = "libcuda.so.1"
#: Where nvidia-smi goes: the GPU Operator validator runs exactly this path.
NVIDIA_SMI = f"{layout.DRIVER_BIN}/nvidia-smi"
#: Shared objects and executables: readable and executable by everyone.
EXEC_MODE = 0o755


def library_artifacts(driver_version: str) -> list[Artifact]:
    """The library file and its two links, for ``driver_version``.

    Raises ``NativeArtifactMissing`` (whose message says "not built") while
    the native build has not produced the library: staging must fail rather
    than publish a driver tree that no NVML client can load.
    """
    source = native.artifact(native.NVML_LIBRARY)
    versioned = f"libnvidia-ml.so.{driver_version}"
    lib = layout.DRIVER_LIB
    return [
        CopyOf(f"{lib}/{versioned}", source, EXEC_MODE),
        Symlink(f"{lib}/{NVML_SONAME}", versioned),
        Symlink(f"{lib}/libnvidia-ml.so", NVML_SONAME),
    ]


def cuda_artifacts(driver_version: str) -> list[Artifact]:
    """The CUDA stub and its two links, for ``driver_version``.

    Raises ``NativeArtifactMissing`` while the stub is not built.  Unlike a
    missing NVML library that is no stage failure (every NVML client works
    without it; only CDI spec generation needs it): the simulator stages the
    rest and reports itself not ready with the reason, as for a missing
    ``nvidia-smi``.
    """
    source = native.artifact(native.CUDA_LIBRARY)
    versioned = f"libcuda.so.{driver_version}"
    lib = layout.DRIVER_LIB
    return [
        CopyOf(f"{lib}/{versioned}", source, EXEC_MODE),
        Symlink(f"{lib}/{CUDA_SONAME}", versioned),
        Symlink(f"{lib}/libcuda.so", CUDA_SONAME),
    ]


#: Text only NVIDIA's own ``nvidia-smi`` carries: the banner of its ``-h``.
#: The fallback's banner reads "NVIDIA System Management Interface (fallback
#: ...", so it never passes for the real one.
REAL_SMI_BANNER = b"NVIDIA System Management Interface -- v"


@attrs.frozen
class SmiChoice:
    """Which ``nvidia-smi`` gets staged, and why (for logs and readiness)."""

    #: the file to copy, or None when no candidate exists
    source: Path | None
    #: ``real``, ``fallback`` or ``none``
    kind: str
    #: human-readable account of the choice: which file, and where it came from
    detail: str


def is_real_nvidia_smi(path: Path) -> bool:
    """Whether ``path`` (links followed) is NVIDIA's own ``nvidia-smi`` ELF.

    A machine's ``/usr/bin/nvidia-smi`` may be Debian's (an alternatives link
    to ``/usr/lib/nvidia/current/nvidia-smi``, NVIDIA's binary), but also a
    wrapper script, or this project's fallback installed by hand: only an ELF
    file with NVIDIA's banner is staged as the real one.
    """
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return data[:4] == b"\x7fELF" and REAL_SMI_BANNER in data


def choose_nvidia_smi(image_binary: Path, installed_binary: Path) -> SmiChoice:
    """The image's real ELF, else the machine's installed real one, else the fallback.

    ``image_binary`` is where the image keeps NVIDIA's binary (patched with
    RPATH ``$ORIGIN/../lib64``); it is trusted as is.  ``installed_binary``
    (``/usr/bin/nvidia-smi``) matters for a local run on a machine with
    Debian's ``nvidia-smi`` package: NVIDIA's binary is a better consumer
    than the fallback, and it ``dlopen``s ``libnvidia-ml.so.1`` through the
    library path and ``/usr/lib64``, which the driver tree provides (chroot,
    CDI) or ``LD_LIBRARY_PATH`` names.

    No ``nvidia-smi`` at all is not a stage failure: every NVML client
    except the GPU Operator validator still works, so the simulator stages
    the rest and reports itself not ready with the reason.
    """
    if image_binary.is_file():
        return SmiChoice(image_binary, "real",
                         f"real nvidia-smi from --nvidia-smi-binary {image_binary}")
    if is_real_nvidia_smi(installed_binary):
        return SmiChoice(
            installed_binary,
            "real",
            f"real nvidia-smi installed at {installed_binary} ({image_binary} is absent)",
        )
    rejected = (
        f", {installed_binary} is not NVIDIA's nvidia-smi"
        if installed_binary.exists()
        else f" and {installed_binary} does not exist"
    )
    try:
        fallback = native.artifact(native.FALLBACK_NVIDIA_SMI)
    except NativeArtifactMissing as exc:
        return SmiChoice(
            None,
            "none",
            f"no nvidia-smi available: {image_binary} does not exist{rejected}, and {exc}",
        )
    return SmiChoice(
        fallback,
        "fallback",
        f"fallback nvidia-smi from {fallback} ({image_binary} does not exist{rejected})",
    )


def smi_artifacts(choice: SmiChoice) -> list[Artifact]:
    """The staged ``nvidia-smi`` (none when there is nothing to stage)."""
    if choice.source is None:
        return []
    return [CopyOf(NVIDIA_SMI, choice.source, EXEC_MODE)]
