"""Where the real consumers the tests run are: the locator over ``scripts/install-consumers``.

The install script owns the pins and the cache (``MOKKA_CONSUMERS``, default
``/var/cache/mokka/consumers``); its ``--list`` mode names every component,
its pinned version and its path, so the pins live in one place.  A locator
returns a path only when the component's stamp names the pinned version and
the binary is there; otherwise it fails the test naming the script (never
skips: a missing consumer is a broken test environment, and CI must say so).

The binaries' own ``--version`` is checked by the script when it installs and
by ``tests/test_consumers_install.py``, not on every lookup: the locators stay
cheap enough to call from any fixture.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import attrs
import pytest

from tests.support import ROOT

SCRIPT = ROOT / "scripts" / "install-consumers"
_HOW = "run scripts/install-consumers (./scripts/test does) to install the pinned real consumers"


@attrs.frozen
class Component:
    """One line of ``scripts/install-consumers --list``."""

    name: str
    #: As pinned: ``v1.20.2`` for a Go module, ``1.7.24~ds1-6+deb13u1`` for a Debian build.
    version: str
    #: The binary, or for containerd the ``usr/bin`` directory of the unpacked package.
    path: Path | None
    #: Why the component cannot be installed; empty when it can.
    unavailable: str = ""

    @property
    def upstream(self) -> str:
        """The release without ``v`` or Debian's suffixes (``1.20.2``, ``1.7.24``): what
        the binary's own version output names."""
        version = self.version.removeprefix("v")
        for sep in "~+-":
            version = version.split(sep, 1)[0]
        return version


@attrs.frozen
class Containerd:
    """One unpacked Debian containerd: the daemon, its runc shim and ``ctr``.

    ``bin_dir`` goes first on the PATH of a containerd a test starts, so that
    it finds the shim of its own release.
    """

    version: str
    deb_version: str
    bin_dir: Path

    @property
    def containerd(self) -> Path:
        return self.bin_dir / "containerd"

    @property
    def shim(self) -> Path:
        return self.bin_dir / "containerd-shim-runc-v2"

    @property
    def ctr(self) -> Path:
        return self.bin_dir / "ctr"


def cache_dir() -> Path:
    """The cache the install script fills (``MOKKA_CONSUMERS``)."""
    return Path(os.environ.get("MOKKA_CONSUMERS", "/var/cache/mokka/consumers"))


@functools.cache
def _components(cache: Path) -> dict[str, Component]:
    env = {**os.environ, "MOKKA_CONSUMERS": str(cache)}
    done = subprocess.run(
        [str(SCRIPT), "--list"], capture_output=True, text=True, env=env, timeout=30, check=True
    )
    result = {}
    for line in done.stdout.splitlines():
        name, version, path, *why = line.split("\t")
        unavailable = why[0].removeprefix("unavailable: ") if why else ""
        result[name] = Component(name, version, None if path == "-" else Path(path), unavailable)
    return result


def components() -> dict[str, Component]:
    """Every pinned component by name (``containerd-1.7.24`` for each containerd)."""
    return _components(cache_dir())


def _installed(component: Component) -> Path:
    if component.unavailable:
        pytest.fail(
            f"{component.name} {component.version} is not available: {component.unavailable}"
        )
    assert component.path is not None
    stamp = cache_dir() / "stamps" / component.name
    try:
        held = stamp.read_text().strip()
    except FileNotFoundError:
        pytest.fail(
            f"{component.name} {component.version} is not installed in {cache_dir()}; {_HOW}"
        )
    if held != component.version:
        pytest.fail(
            f"{cache_dir()} holds {component.name} {held}, the pin is {component.version}; {_HOW}"
        )
    if not component.path.exists():
        pytest.fail(f"{component.path} is missing although {stamp} names it; {_HOW}")
    return component.path


def consumer(name: str) -> Path:
    """The pinned Go-built binary ``name`` (``nvidia-ctk``, ``helm``, ...), or fail the test."""
    known = components()
    if name not in known or name.startswith("containerd-"):
        pytest.fail(f"no consumer {name!r} in scripts/install-consumers; known: {sorted(known)}")
    return _installed(known[name])


def containerd_versions() -> tuple[str, ...]:
    """The upstream releases of the pinned containerd builds, oldest first (``1.7.24``, ...)."""
    return tuple(c.upstream for c in components().values() if c.name.startswith("containerd-"))


def containerd(version: str) -> Containerd:
    """The unpacked containerd of release ``version``, or fail the test.

    ``version`` is a release or its prefix: ``"1.7"``, ``"2"`` and ``"2.1.9"``
    all work while exactly one pinned build matches it, so a test written for
    a series survives a bump of the patch release.
    """
    matches = [
        v for v in containerd_versions() if v == version or v.startswith(version.rstrip(".") + ".")
    ]
    if len(matches) != 1:
        pytest.fail(
            f"containerd {version!r} matches {matches or 'none'} of the pinned "
            f"{list(containerd_versions())} (scripts/install-consumers)"
        )
    component = components()[f"containerd-{matches[0]}"]
    return Containerd(matches[0], component.version, _installed(component))


#: The NVIDIA Container Toolkit's binaries, as the image's ``--toolkit-dir`` holds them.
TOOLKIT = ("nvidia-ctk", "nvidia-container-runtime", "nvidia-cdi-hook")


@functools.cache
def toolkit_dir() -> Path:
    """A directory holding exactly the toolkit's binaries (links to the pinned ones), or fail.

    The cri simulator installs every file of its ``--toolkit-dir``, so the
    cache's ``bin`` (which holds every consumer) cannot serve; one directory
    per test process, removed when it exits.
    """
    binaries = {name: consumer(name) for name in TOOLKIT}
    directory = Path(tempfile.mkdtemp(prefix="mokka-toolkit-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    for name, path in binaries.items():
        (directory / name).symlink_to(path)
    return directory
