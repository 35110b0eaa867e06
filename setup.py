"""Package build hook: compiles the native libraries alongside the Python code.

The mock NVML library and the filesystem shim are shared objects loaded by
other processes (nvidia-smi, lspci, the NVIDIA stack), not Python extensions,
so they are built by ``native/build.py`` with the system C compiler and shipped
as package data in ``mokka/_native``.  An editable install builds them into the
source tree (``mokka/_native`` is git-ignored) because the editable finder maps
the package to the source directory.

The wheel is tagged ``py3-none-<platform>``: it carries machine code (so it
is platform-specific), but none of it is a CPython extension, so any Python
3.11+ on this platform can install it.  ``native/`` ships in the sdist
(MANIFEST.in), so a wheel built from the sdist is the one ``pip wheel .``
builds.
"""

import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyWithNative(build_py):
    def run(self):
        super().run()
        sys.path.insert(0, str(HERE))
        from native.build import build_all

        if getattr(self, "editable_mode", False):
            out = HERE / "mokka" / "_native"
        else:
            out = Path(self.build_lib) / "mokka" / "_native"
        build_all(out)


class NativeDistribution(Distribution):
    """Marks the wheel as platform-specific: it ships machine code (.so, nvidia-smi)."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """``py3-none-<platform>``: no CPython ABI in the native files, only the platform's."""

    def get_tag(self):
        _python, _abi, platform = super().get_tag()
        return "py3", "none", platform


setup(
    cmdclass={"build_py": BuildPyWithNative, "bdist_wheel": PlatformWheel},
    distclass=NativeDistribution,
)
