"""The one line Mokka adds to containerd's main config: the ``imports`` of its drop-in.

containerd reads a drop-in only when its main config imports it, so the
drop-in directory's glob (``/etc/containerd/conf.d/*.toml``) must be in the
main config's top-level ``imports``.  Mokka writes that line itself rather
than letting ``nvidia-ctk`` do it: the real tool re-serialises the whole
file (comments dropped, tables reordered), which no teardown could undo
short of restoring an old copy over whatever the operator edited since.

So the edit is one marked line, and undoing it is removing that line:

* no ``imports`` key yet: ``imports = ["<glob>"]  # <MARK>`` is put on top
  (a top-level key must precede the first table header; the top always does);
* a one-line ``imports`` without our glob: that line is kept, commented out
  behind ``# <WAS>``, and the extended list goes under it, marked;
* our glob already imported (by the operator, or a package): nothing to do,
  and nothing to undo.

``remove`` finds the marked line (and its ``WAS`` line) in whatever the
file holds by then, so an operator's edits elsewhere in the file survive
teardown, and a file nobody edited comes back byte for byte.  The marker
is in the file itself, so a fresh process (the next daemon, after a kill)
finds it without any bookkeeping.  ``mokka cleanup`` runs no simulator
code: after a crash the line stays until the next daemon's teardown, or
the manual step in ``docs/cri.md``; it names a glob and is harmless once
the drop-in is gone.
"""

from __future__ import annotations

import re

#: Ends the line Mokka added.
MARK = "# mokka: containerd drop-in directory, removed at teardown"
#: Starts the comment holding the ``imports`` line Mokka replaced.
WAS = "# mokka: was: "

_IMPORTS = re.compile(r"^imports\s*=\s*\[(?P<items>[^\]\n]*)\]\s*(#.*)?$")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"|\'([^\']*)\'')


class ImportsUnsupported(Exception):
    """The main config's ``imports`` is not one line Mokka can extend (say, a multi-line array)."""


def imported(text: str) -> list[str]:
    """The paths of the main config's one-line top-level ``imports``, in order."""
    for line in _top_level(text):
        match = _IMPORTS.match(line)
        if match:
            return [a or b for a, b in _STRING.findall(match.group("items"))]
    return []


def add(text: str, glob: str) -> str | None:
    """``text`` importing ``glob`` too, or None when it already does.

    Raises ``ImportsUnsupported`` for an ``imports`` key spread over lines.
    """
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.lstrip().startswith("["):
            break  # past the top level: no imports key of its own
        if not re.match(r"^imports\s*=", line):
            continue
        match = _IMPORTS.match(line.rstrip("\r\n"))
        if match is None:
            raise ImportsUnsupported(
                f"its imports key spans several lines ({line.strip()!r}); put "
                f"{glob!r} into it, or write it on one line"
            )
        paths = [a or b for a, b in _STRING.findall(match.group("items"))]
        if glob in paths:
            return None
        items = match.group("items").strip().rstrip(",").strip()
        extended = f'imports = [{items}, "{glob}"]' if items else f'imports = ["{glob}"]'
        body = line.rstrip("\r\n")
        lines[i] = f"{WAS}{body}\n{extended}  {MARK}{line[len(body):]}"
        return "".join(lines)
    return f'imports = ["{glob}"]  {MARK}\n' + text


def remove(text: str) -> str | None:
    """``text`` without the line ``add`` put in (the replaced line back), or None if absent."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.rstrip("\r\n").endswith(MARK) and line.startswith("imports"):
            if i > 0 and lines[i - 1].startswith(WAS):
                original = lines[i - 1][len(WAS):].rstrip("\n")
                ending = line[len(line.rstrip("\r\n")):]
                return "".join([*lines[: i - 1], original + ending, *lines[i + 1:]])
            return "".join([*lines[:i], *lines[i + 1:]])
    return None


def _top_level(text: str) -> list[str]:
    """The lines before the first table header."""
    top: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith("["):
            break
        top.append(line)
    return top
