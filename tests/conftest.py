"""Fixtures shared by the whole suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from mokka.host import Host


@pytest.fixture
def node_root(tmp_path: Path) -> Path:
    """An empty node root for one test."""
    root = tmp_path / "node"
    root.mkdir()
    return root


@pytest.fixture
def host(node_root: Path) -> Host:
    return Host(node_root)
