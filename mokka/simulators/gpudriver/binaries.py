"""The mock NVML library and ``nvidia-smi`` in the driver tree (SURFACES §3, §4).

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
"""

from __future__ import annotations

from pathlib import Path

import attrs

from mokka import layout, native
from mokka.errors import NativeArtifactMissing
from mokka.host import Artifact, CopyOf, Symlink

#: The SONAME every consumer loads.
NVML_SONAME = "libnvidia-ml.so.1"
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


@attrs.frozen
class SmiChoice:
    """Which ``nvidia-smi`` gets staged, and why (for logs and readiness)."""

    #: the file to copy, or None when neither candidate exists
    source: Path | None
    #: ``real``, ``fallback`` or ``none``
    kind: str
    #: human-readable account of the choice
    detail: str


def choose_nvidia_smi(real_binary: Path) -> SmiChoice:
    """Prefer the image's real ELF, else the project's fallback, else nothing.

    No ``nvidia-smi`` is not a stage failure: every NVML client except the
    GPU Operator validator still works, so the simulator stages the rest and
    reports itself not ready with the reason.
    """
    if real_binary.is_file():
        return SmiChoice(real_binary, "real", f"real nvidia-smi from {real_binary}")
    try:
        fallback = native.artifact(native.FALLBACK_NVIDIA_SMI)
    except NativeArtifactMissing as exc:
        return SmiChoice(
            None,
            "none",
            f"no nvidia-smi available: {real_binary} does not exist and {exc}",
        )
    return SmiChoice(fallback, "fallback", f"fallback nvidia-smi from {fallback}")


def smi_artifacts(choice: SmiChoice) -> list[Artifact]:
    """The staged ``nvidia-smi`` (none when there is nothing to stage)."""
    if choice.source is None:
        return []
    return [CopyOf(NVIDIA_SMI, choice.source, EXEC_MODE)]
