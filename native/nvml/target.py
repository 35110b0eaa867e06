"""Native target: the mock NVML library ``libnvidia-ml.so.1``.

``build(out_dir, cc)`` generates the stubs for every function ``nvml.h``
declares (``exports.py``), compiles the hand-written C files with them into
one shared object with SONAME ``libnvidia-ml.so.1``, and writes the export
coverage (implemented / total) to ``nvml-coverage.json`` beside it.

Header choice: ``nvidia-nvml-dev==13.0.39`` (CUDA 13.0).  It declares every
function of the CUDA 12.2 header that matches driver 535 (all 327, with
identical prototypes and only additive struct changes), plus the newer API
that current consumers call (``nvmlDeviceGetAddressingMode`` for the DRA
driver, ``nvmlDeviceGetGpuFabricInfoV`` v3, ``nvmlDeviceGetTemperatureV``),
so one header serves nvidia-smi 535, nvidia-ml-py and the newer Go
consumers alike.  Only ``nvmlInternalGetExportTable`` (nvidia-smi's
private entry point) is declared by hand.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from native.toolchain import compile_into

HERE = Path(__file__).resolve().parent
LIBRARY = "libnvidia-ml.so.1"
COVERAGE = "nvml-coverage.json"

#: The hand-written sources, one concern each (see mock.h).
SOURCES = (
    "config.c",
    "lookup.c",
    "values.c",
    "library.c",
    "snapshot.c",
    "notice.c",
    "refresh.c",
    "locate.c",
    "remote.c",
    "setters.c",
    "mig.c",
    "mig_profiles.c",
    "mig_gpu_instances.c",
    "mig_compute_instances.c",
    "mig_devices.c",
    "errors.c",
    "call.c",
    "devices.c",
    "firmware.c",
    "modes.c",
    "failure.c",
    "pci.c",
    "affinity.c",
    "memory.c",
    "processes.c",
    "power.c",
    "thermal.c",
    "clocks.c",
    "utilization.c",
    "nvlink.c",
    "nvlink_counters.c",
    "nvlink_wiring.c",
    "fabric.c",
    "meters.c",
    "samples.c",
    "gpm.c",
    "fields.c",
    "workload.c",
    "patterns.c",
    "board.c",
    "idle_signature.c",
    "dynamics.c",
    "readings.c",
    "energy.c",
    "events.c",
    "export_table.c",
    "system.c",
    "deprecation.c",
    "encoder.c",
    "pstates.c",
)

CFLAGS = (
    "-std=gnu11",
    "-O2",
    "-fPIC",
    "-pthread",
    "-fvisibility=hidden",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-DNVML_NO_UNVERSIONED_FUNC_DEFS",
)


def _exports():
    spec = importlib.util.spec_from_file_location("native_nvml_exports", HERE / "exports.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def build(out_dir: Path, cc: str, extra_cflags: Sequence[str] = ()) -> list[Path]:
    """Build the library into ``out_dir``; ``extra_cflags`` serve experiments in tests."""
    exports = _exports()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    header = exports.find_header()
    sources = [HERE / name for name in SOURCES]
    surface = exports.surface(header, cc, sources)
    with tempfile.TemporaryDirectory(prefix="mokka-nvml-") as scratch:
        stubs = Path(scratch) / "stubs.c"
        stubs.write_text(exports.render_stubs(surface))
        args = [
            *CFLAGS,
            *extra_cflags,
            f"-I{header.parent}",
            f"-I{HERE}",
            "-shared",
            f"-Wl,-soname,{LIBRARY}",
            "-Wl,--no-undefined",
            *(str(s) for s in sources),
            str(stubs),
            "-ldl",
            "-lm",
        ]
        compile_into(out_dir / LIBRARY, cc, args, label="native/nvml")
    coverage_path = out_dir / COVERAGE
    exports.write_coverage(surface, coverage_path)
    print(
        f"native/nvml: {LIBRARY}: {len(surface.implemented)} implemented / "
        f"{len(surface.prototypes)} exported ({len(surface.stubs)} NOT_SUPPORTED stubs) "
        f"from {header}",
        file=sys.stderr,
    )
    return [out_dir / LIBRARY, coverage_path]
