"""Native target: the fallback ``nvidia-smi`` (staged when no real one is available).

It links only the mock NVML library (``-L out_dir -l:libnvidia-ml.so.1``)
with RPATH ``$ORIGIN/../lib64``, so it finds the library beside it both in
the driver root (``usr/bin`` next to ``usr/lib64``) and in a container that
mounts it at ``/usr/bin`` with the library at ``/usr/lib64``.

Build order: ``native/build.py`` runs targets in sorted directory order and
``nvidia-smi`` sorts before ``nvml``.  Rather than teach the shared driver
an ordering scheme for one dependency, this target builds the library first
when it is not in ``out_dir`` yet (the ``nvml`` target then rebuilds it,
which is cheap and keeps each target self-contained when run alone).
"""

from __future__ import annotations

import sys
from pathlib import Path

from native.toolchain import compile_into, load_target

HERE = Path(__file__).resolve().parent
BINARY = "nvidia-smi"
NVML_LIBRARY = "libnvidia-ml.so.1"
SOURCES = ("main.c", "gpu.c", "table.c", "query.c", "report.c")
CFLAGS = ("-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror")


def build(out_dir: Path, cc: str) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nvml = load_target("nvml")
    if not (out_dir / NVML_LIBRARY).is_file():
        nvml.build(out_dir, cc)
    header = nvml._exports().find_header()
    args = [
        *CFLAGS,
        f"-I{header.parent}",
        f"-I{HERE}",
        *(str(HERE / s) for s in SOURCES),
        f"-L{out_dir}",
        f"-l:{NVML_LIBRARY}",
        "-Wl,-rpath,$ORIGIN/../lib64:$ORIGIN",
    ]
    compile_into(out_dir / BINARY, cc, args, label="native/nvidia-smi")
    print(f"native/nvidia-smi: {BINARY} linked against {NVML_LIBRARY}", file=sys.stderr)
    return [out_dir / BINARY]
