"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mokka.ctl.command import NO_DAEMON_OK_ENV
from mokka.noderoot.host import Host
from tests.nvml_support import compiler, load_target
from tests.support import real_nvidia_smi

# Most tests change a staged node root with ``mokka ctl`` while no daemon holds
# it, which a call reports with exit 3; here that is the point, not a mistake
# (subprocesses inherit it).  ``tests/test_ctl_report.py`` clears it to check
# the exit 3 itself.
os.environ.setdefault(NO_DAEMON_OK_ENV, "1")


@pytest.fixture
def node_root(tmp_path: Path) -> Path:
    """An empty node root for one test."""
    root = tmp_path / "node"
    root.mkdir()
    return root


@pytest.fixture
def host(node_root: Path) -> Host:
    return Host(node_root)


@pytest.fixture(scope="session")
def native(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mock NVML library, the fallback nvidia-smi and the CUDA stub, built
    from the current sources once per session (not the installed copy), so the
    tests prove the code in the tree."""
    out = tmp_path_factory.mktemp("native")
    load_target("nvml").build(out, compiler())
    load_target("nvidia-smi").build(out, compiler())
    load_target("libcuda").build(out, compiler())
    return out


@pytest.fixture(scope="session")
def smi() -> Path:
    """The real Debian nvidia-smi 535 binary (see ``tests.support.real_nvidia_smi``)."""
    return real_nvidia_smi()
