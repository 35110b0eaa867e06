"""Package build hook: compiles the native libraries alongside the Python code.

The mock NVML library and the filesystem shim are shared objects loaded by
other processes (nvidia-smi, lspci, the NVIDIA stack), not Python extensions,
so they are built by ``native/build.py`` with the system C compiler and shipped
as package data in ``mokka/_native``.  An editable install builds them into the
source tree (``mokka/_native`` is git-ignored) because the editable finder maps
the package to the source directory.

The wheel is tagged ``py3-none-manylinux_2_34_<arch>``: it carries machine
code (so it is platform-specific), but none of it is a CPython extension, so
any Python 3.11+ can install it, on any Linux whose glibc is 2.34 or newer:
the newest symbol version the native files import is ``GLIBC_2.34`` and they
link nothing outside the manylinux policy's libraries (``auditwheel show``
agrees, tests/test_packaging.py checks it).  ``native/`` ships in the sdist
(MANIFEST.in), so a wheel built from the sdist is the one ``pip wheel .``
builds.

Builds are reproducible: the native build maps the tree's path out of the
libraries (``native/toolchain.py``), and the wheel's timestamps are
``SOURCE_DATE_EPOCH`` (defaulted below), so two builds of the same sources in
two directories are bit-for-bit identical.
"""

import os
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
#: The manylinux policy the native files meet (glibc 2.34: ``pthread_*``,
#: ``dlsym`` and friends moved into libc.so.6 with versions GLIBC_2.34).
MANYLINUX = "manylinux_2_34"
#: 1980-01-01T00:00:00Z, the oldest time a zip entry can hold.  Without
#: ``SOURCE_DATE_EPOCH`` the wheel would stamp each entry with its file's
#: mtime, which differs for every build of the native files; an explicit
#: ``SOURCE_DATE_EPOCH`` (a release's date) still wins.
os.environ.setdefault("SOURCE_DATE_EPOCH", "315532800")


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
    """``py3-none-manylinux_2_34_<arch>``: no CPython ABI in the native files, only glibc's."""

    def get_tag(self):
        _python, _abi, platform = super().get_tag()
        # bdist_wheel names the build machine (linux_x86_64), which an index
        # refuses; the native files need only what manylinux_2_34 promises.
        if platform.startswith("linux_"):
            platform = f"{MANYLINUX}_{platform.removeprefix('linux_')}"
        return "py3", "none", platform


setup(
    cmdclass={"build_py": BuildPyWithNative, "bdist_wheel": PlatformWheel},
    distclass=NativeDistribution,
)
