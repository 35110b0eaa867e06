"""``mokka ctl --gpu``: which GPU a target names, checked against the engine config.

A target is ``all``, an index or a GPU UUID.  When the engine config beside
the overrides file is readable, the index or UUID must be one of this
node's GPUs; without it, any well-formed target is accepted (the daemon may
not have staged yet).  Only the config's ``format`` line and the GPUs'
``index`` and ``uuid`` lines are read, the way the mock library reads them:
parsing the whole file as YAML would be most of a ``mokka ctl`` call's time.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mokka.errors import CtlError, SpecError
from mokka.state import checks
from mokka.state.reader import load_yaml, read_input

#: The engine config's lines that name a GPU: ``device.<pos>.index: 3`` and
#: ``device.<pos>.uuid: "GPU-…"`` (``<pos>`` is the position in the file, not
#: the index).  The format is one ``key: value`` per line, unindented
#: (``docs/engine-config.md``), which is how the mock library reads it too.
#: A line's start is spelled ``\n`` (the text is searched with one put in
#: front), not ``^``: a pattern that begins with literal text is searched
#: for that text, six times faster over the ~180 KiB file than trying ``^``
#: at every character.
_ENGINE_DEVICE_LINE = re.compile(r"\ndevice\.(\d{1,9})\.(index|uuid): *(.*?) *$", re.MULTILINE)
_ENGINE_FORMAT_LINE = re.compile(r"\nformat: *(.*?) *$", re.MULTILINE)
#: The engine config's values ``engine_gpus`` reads: a decimal index, a
#: double-quoted string (escapes ``\"`` and ``\\`` only).
_ENGINE_INT = re.compile(r"\d{1,9}")
_ENGINE_STRING = re.compile(r'"((?:[^"\\]|\\["\\])*)"')


#: ``parse_target``'s default: read the engine config beside the file.
_READ = object()


def parse_target(text: str, path: Path, *, known: Any = _READ) -> str:
    """``all``, an index, or a UUID; checked against the engine config when it is readable.

    Returns the key as the overrides file spells it (``device_key``'s
    normalization: ``"03"`` is ``"3"``, UUIDs lower-case after ``GPU-``).
    Without a readable engine config nothing can be checked, and a
    well-formed target is accepted: the daemon may not have staged yet.
    ``known``: what ``engine_gpus`` already read of it (a caller that also
    names the GPU reads the file once).
    """
    text = text.strip()
    if known is _READ:
        # the engine config sits beside the overrides file (both in driver/config/)
        known = engine_gpus(path.with_name("config.yaml"))
    if text == "all":
        return "all"
    # ASCII digits only: ``"²".isdigit()`` holds, but ``int("²")`` raises
    if text.isascii() and text.isdigit() and len(text) <= 32:
        if known is not None and int(text) not in known.values():
            raise CtlError(f"--gpu: no GPU with index {text} on this node "
                           f"(indices: {', '.join(map(str, sorted(known.values())))})")
        return str(int(text))
    if checks.GPU_UUID_RE.fullmatch(text):
        uuid = "GPU-" + text[4:].lower()
        if known is not None and uuid not in known:
            raise CtlError(f"--gpu: no GPU with UUID {text} on this node")
        return uuid
    raise CtlError(f"--gpu: {checks.found(text)} is not a GPU index, 'all' or a GPU UUID "
                   "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")


def engine_gpus(config: Path) -> dict[str, int] | None:
    """UUID → index from the engine config, or ``None`` when it cannot tell.

    The engine config is flat, one ``key: value`` per line (``device.<position>.uuid:
    "GPU-…"``, see ``docs/engine-config.md``): only its ``format`` line and
    the GPUs' ``index`` and ``uuid`` lines are read, the way the mock library
    reads them, not the whole file as YAML (some 180 KiB for eight GPUs,
    most of the time a ``mokka ctl`` call would take).  A file without such
    lines is read as YAML, for a nested ``devices: [{index, uuid}]`` list.
    Any surprise in the file gives ``None`` (no check) rather than a guess,
    so a format change can never make valid targets fail.
    """
    try:
        # Bounded like every input; not followed through a symlink, as it sits
        # beside the overrides file (under the node root, or wherever --file is).
        text = read_input(config, "the engine config", root=config.parent) or ""
    except SpecError:
        return None
    lines = "\n" + text  # every line, the first too, starts after a newline
    flat: dict[str, dict[str, Any]] = {}
    for position, field, value in _ENGINE_DEVICE_LINE.findall(lines):
        # a later line wins, as in YAML loaders and the library
        flat.setdefault(position, {})[field] = _engine_value(value)
    if flat:
        formats = _ENGINE_FORMAT_LINE.findall(lines)
        # the library refuses a file whose (last) format is not 1
        if not formats or formats[-1] != "1":
            return None
        entries: Any = list(flat.values())
    else:
        try:
            doc = load_yaml(text, str(config))
        except SpecError:
            return None
        entries = doc.get("devices") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        return None
    found: dict[str, int] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            return None
        uuid, index = entry.get("uuid"), entry.get("index")
        if not isinstance(uuid, str) or not isinstance(index, int):
            return None
        # the same spelling ``parse_target`` compares with
        found[uuid.lower().replace("gpu-", "GPU-", 1)] = index
    return found or None


def _engine_value(text: str) -> int | str | None:
    """An engine config value ``engine_gpus`` reads: an index or a string; else ``None``."""
    if _ENGINE_INT.fullmatch(text):
        return int(text)
    if match := _ENGINE_STRING.fullmatch(text):
        return re.sub(r"\\(.)", r"\1", match.group(1))
    return None
