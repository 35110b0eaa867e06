"""Where the package's built native artifacts live.

The package build (``setup.py`` → ``native/build.py``) compiles the mock NVML
library, the CUDA driver stub, the filesystem shim, the verbs shim and the
fallback ``nvidia-smi`` into ``mokka/_native``.  ``MOKKA_NATIVE_DIR`` points
elsewhere (a test build, an image that ships them separately).  A missing
artifact is an explicit error, never a silent fallback, so a simulator reports
"not built" instead of staging something that does not work.
"""

from __future__ import annotations

import os
from pathlib import Path

from mokka.errors import NativeArtifactMissing

PACKAGE_NATIVE_DIR = Path(__file__).resolve().parent / "_native"

#: File names of the artifacts, as the native build writes them.
NVML_LIBRARY = "libnvidia-ml.so.1"
#: The CUDA driver stub (``native/libcuda``): no device, present for the CDI spec generators.
CUDA_LIBRARY = "libcuda.so.1"
MOCKFS_LIBRARY = "libmockfs.so"
FALLBACK_NVIDIA_SMI = "nvidia-smi"
#: The verbs shim (``native/ibshim``), staged by the ib simulator in ``full`` mode.
IBSHIM_LIBRARY = "libibshim.so"
#: The management-datagram shim (``native/umadshim``), staged by the ib simulator.
UMADSHIM_LIBRARY = "libumadshim.so"


def native_dir() -> Path:
    override = os.environ.get("MOKKA_NATIVE_DIR")
    return Path(override) if override else PACKAGE_NATIVE_DIR


def artifact(name: str) -> Path:
    """Return the path of a built artifact, or raise ``NativeArtifactMissing``."""
    path = native_dir() / name
    if not path.is_file():
        raise NativeArtifactMissing(
            f"native artifact {name!r} not built: expected it at {path} "
            "(reinstall the package with a C compiler present, or set MOKKA_NATIVE_DIR)"
        )
    return path
