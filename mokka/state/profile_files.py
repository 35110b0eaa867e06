"""Where a GPU profile's text comes from: a built-in profile, or a file.

The built-in profiles ship in ``mokka/state/profiles`` and are named on
the command line (``--profile h100``); anything else is a path, read
bounded like every input.  This module only finds and reads the text;
``mokka.state.profile`` parses and validates it.  It is separate because
the callers that only need to know whether a name is a built-in (the
daemon's start-up check, the file source deciding what to watch) or the
raw text (tests deriving variants of a built-in) need none of the
validation.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from mokka.errors import SpecError
from mokka.state.reader import read_input

#: Built-in profiles shipped in ``mokka/state/profiles``.  A name is matched
#: before any path: ``--profile h100`` is the built-in even if the working
#: directory holds a file called ``h100``.
BUILTIN_PROFILES: tuple[str, ...] = ("a100", "b200", "gb200", "gb300", "h100", "l40s", "t4")
#: The profile the daemon uses when none is given: the most common shape
#: consumers (device plugin, GFD, DRA) are tested against.
DEFAULT_PROFILE = "h100"


def is_builtin(name_or_path: str | Path) -> bool:
    """A built-in profile's name; a ``Path`` is always a file, even ``Path("h100")``."""
    return isinstance(name_or_path, str) and name_or_path in BUILTIN_PROFILES


def read_profile_text(name_or_path: str | Path) -> tuple[str, str]:
    """(label, text) of a built-in profile name or a file path; ``SpecError`` if unreadable.

    A built-in's label is ``<name>.yaml`` so its messages read like a file's.
    Built-ins are read through ``importlib.resources``, which works whether
    the package is installed as files or zipped.  Tests use the text to
    derive variants of a built-in.
    """
    if is_builtin(name_or_path):
        name = str(name_or_path)
        resource = importlib.resources.files("mokka.state") / "profiles" / f"{name}.yaml"
        return f"{name}.yaml", resource.read_text(encoding="utf-8")
    path = Path(name_or_path)
    # Bounded and refusing (a FIFO, /dev/zero, a huge file): ``mokka.state.reader``.
    # Symlinks are followed: the profile is an operator's path, often a ConfigMap volume.
    text = read_input(path, "the profile", optional=True)
    if text is None:
        raise SpecError(
            f"{path}: no such profile file, expected a readable YAML file or one of the "
            f"built-in profiles {', '.join(BUILTIN_PROFILES)}"
        )
    return str(path), text
