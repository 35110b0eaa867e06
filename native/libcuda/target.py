"""Native target: ``libcuda.so.1``, a CUDA driver stub that reports no device.

``native/build.py`` loads this file and calls ``build(out_dir, cc)``.  The
tools that write CDI specs from a driver root (the container toolkit's
``nvcdi``: ``nvidia-ctk cdi generate``, the device plugin's ``cdi-*``
strategies) require ``libcuda.so.<driver version>`` there; the gpudriver
simulator stages this library under that name.  It exports only what a
loader probes (``cuda.c`` lists it) and needs no CUDA headers: ``stub.h``
declares the few types from NVIDIA's published driver API reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from native.toolchain import compile_into

HERE = Path(__file__).resolve().parent

#: The artifact name (``mokka.native.CUDA_LIBRARY``) and the real driver's
#: SONAME; literal here so the native build does not need the package.
LIBRARY = "libcuda.so.1"

SOURCES = ("cuda.c", "version.c")

CFLAGS = (
    "-std=gnu11",
    "-O2",
    "-fPIC",
    "-fvisibility=hidden",
    "-Wall",
    "-Wextra",
    "-Werror",
)


def build(out_dir: Path, cc: str, extra_cflags: Sequence[str] = ()) -> list[Path]:
    """Compile the stub into ``out_dir/libcuda.so.1`` and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        *CFLAGS,
        *extra_cflags,
        f"-I{HERE}",
        "-shared",
        f"-Wl,-soname,{LIBRARY}",
        "-Wl,--no-undefined",
        *(str(HERE / s) for s in SOURCES),
        "-ldl",
    ]
    return [compile_into(out_dir / LIBRARY, cc, args, label="native/libcuda")]
