#!/usr/bin/env python3
"""Writes deploy/constraints.txt: the exact versions the image installs.

pyproject.toml keeps version ranges (a library's promise); the image must be
reproducible, so its build installs the runtime dependency closure pinned to
the versions tested here.  This walks mokka's runtime requirements (no
extras) through the installed distributions of the interpreter running it
and writes one ``name==version`` per line.  Run it with the project's venv
after changing a dependency or upgrading the venv:

    .venv/bin/python deploy/update-constraints.py

``--check`` compares instead of writing and exits 1 when the file is stale.
"""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "deploy" / "constraints.txt"
HEADER = """\
# Exact versions of Mokka's runtime dependencies, installed by the image build
# (Containerfile: pip wheel --constraint). Generated from a tested venv by
# deploy/update-constraints.py; pyproject.toml keeps the ranges.
"""


def runtime_closure() -> dict[str, str]:
    """Canonical name -> installed version of every runtime dependency, transitively.

    The roots are pyproject.toml's ``dependencies`` (the source of truth, even
    before the venv's editable install has been refreshed); requirements
    whose marker is false here (another Python, an extra) are left out: the
    image runs this Python version.
    """
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins: dict[str, str] = {}
    pending = [Requirement(line).name for line in project["dependencies"]]
    while pending:
        name = pending.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing = f"update-constraints: {name} is not installed in {sys.prefix}"
            raise SystemExit(missing) from None
        key = canonicalize_name(dist.metadata["Name"])
        if key in pins:
            continue
        pins[key] = dist.version
        for line in dist.requires or ():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                pending.append(req.name)
    return pins


def render(pins: dict[str, str]) -> str:
    return HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins))


def main(argv: list[str]) -> int:
    text = render(runtime_closure())
    if argv[1:] == ["--check"]:
        if CONSTRAINTS.read_text() != text:
            print(f"{CONSTRAINTS} is stale; run deploy/update-constraints.py", file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        raise SystemExit("usage: deploy/update-constraints.py [--check]")
    CONSTRAINTS.write_text(text)
    print(f"wrote {CONSTRAINTS.relative_to(ROOT)}: {text.count('==')} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
