"""Shared pieces of the image payload tests: real .debs built for a test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.support import require_tool


def debian_arch() -> str:
    return subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()


def build_deb(
    out_dir: Path, package: str, version: str, files: dict[str, str], arch: str | None = None
) -> Path:
    """A real .deb (``dpkg-deb --build``) holding ``files`` (path → script body, mode 0755)."""
    require_tool("dpkg-deb")
    arch = arch or debian_arch()
    tree = out_dir / f"tree-{package}-{version}-{arch}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: {arch}\n"
        "Maintainer: Mokka tests <tests@invalid>\nDescription: test package\n"
    )
    for rel, body in files.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        path.chmod(0o755)
    out_dir.mkdir(parents=True, exist_ok=True)
    deb = out_dir / f"{package}_{version}_{arch}.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(tree)
    return deb
