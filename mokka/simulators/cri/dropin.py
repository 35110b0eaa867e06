"""What Mokka's containerd drop-in holds, and what it is computed from.

Before containerd 2.1 a plugin table in an imported file *replaces* the
table of the same plugin read before it (the main config's, an earlier
drop-in's), and inside the CRI table the ``runtimes`` map replaces the
built-in one.  A drop-in holding only ``nvidia-ctk``'s keys would silently
drop what the node had: its ``SystemdCgroup``, sandbox image, CNI
directories, registry settings, another drop-in's settings, and even the
built-in ``runc`` handler (containerd 1.7 then has the ``nvidia`` runtime
only, and a pod asking for ``runc`` fails).  So the drop-in is:

1. the *inputs*: the main config and every file containerd imports before
   ours (``read_inputs``), their plugin tables laid over each other in
   containerd's order (``base``: 2.1's deep merge, whichever version runs);
2. ``nvidia-ctk``'s output for that base (it copies the CRI table and
   ``runc``'s options to the ``nvidia`` runtime itself);
3. the base's tables under it, NRI on, and the built-in ``runc`` handler
   when nothing before us names one (``compose``).

The inputs are read through the ``Host`` on every reconcile, so a changed
input (an operator's edit of ``config.toml``, a new drop-in) is both a
drift the repair pass notices (the reads are recorded) and a reason to
write the drop-in again (``Inputs`` compare unequal).
"""

from __future__ import annotations

import fnmatch
import logging
import posixpath
import tomllib
from collections.abc import Mapping
from typing import Any

import attrs

from mokka.errors import CommandError, HostPathError
from mokka.noderoot import Host
from mokka.simulators.cri import mainconfig, tomlwriter
from mokka.simulators.cri.settings import CriSettings

logger = logging.getLogger(__name__)

#: The runtime name containerd gets, and the default it becomes.
RUNTIME_NAME = "nvidia"
#: The CRI runtime plugin's name per config version: 2 (containerd 1.x) and
#: 3 (2.x).  ``nvidia-ctk`` writes the drop-in in the main config's version.
CRI_PLUGINS = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
NRI = "io.containerd.nri.v1.nri"
#: containerd's built-in ``runc`` handler, as its ``config default`` spells
#: it per config version (1.7.24, 2.1.9).  Written only when nothing before
#: our drop-in names a ``runc`` runtime: an imported ``runtimes`` map
#: replaces the built-in one before containerd 2.1.
DEFAULT_RUNC: dict[int, dict[str, Any]] = {
    2: {"runtime_type": "io.containerd.runc.v2", "sandbox_mode": "podsandbox"},
    3: {"runtime_type": "io.containerd.runc.v2", "sandboxer": "podsandbox"},
}

#: Says who wrote the drop-in and why it repeats the node's settings.
HEADER = (
    "# Written by mokka (cri simulator): nvidia-ctk's runtime settings over this node's\n"
    "# own plugin settings (the main config and the drop-ins imported before this one:\n"
    "# before containerd 2.1 an imported plugin table replaces the earlier ones whole),\n"
    "# the built-in runc handler, and NRI.  Rewritten when those change; removed at teardown.\n"
)


@attrs.frozen
class Inputs:
    """What the drop-in is computed from, as read from the node (compared whole)."""

    #: the main config's bytes; None when it does not exist
    main: bytes | None
    #: every file containerd reads after the main config and before our
    #: drop-in, in its order: (host path, bytes)
    earlier: tuple[tuple[str, bytes], ...]


def read_inputs(host: Host, settings: CriSettings) -> Inputs:
    """The inputs as the node has them now (blocking; every read is recorded)."""
    main = _read(host, settings.containerd_config)
    text = main.decode(errors="replace") if main is not None else ""
    earlier = []
    for path in _imported_before(host, settings, text):
        content = _read(host, path)
        if content is not None:
            earlier.append((path, content))
    return Inputs(main=main, earlier=tuple(earlier))


def _read(host: Host, path: str) -> bytes | None:
    try:
        return host.read_bytes(path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, HostPathError):
        return None


def _imported_before(host: Host, settings: CriSettings, main_text: str) -> list[str]:
    """The files containerd imports before our drop-in, in its order.

    containerd reads the main config's ``imports`` in order, each glob's
    matches sorted; our glob counts as imported (it is, once the line is
    added).  Imports of imported files are not followed: containerd 1.7
    and 2.x follow them only from the main config's own list in practice
    (nobody chains them), and the drop-in only needs what precedes it.
    """
    ours = settings.dropin
    glob = f"{settings.containerd_config_dir.rstrip('/')}/*.toml"
    entries = mainconfig.imported(main_text)
    if glob not in entries:
        entries.append(glob)
    found: list[str] = []
    for entry in entries:
        if not entry.startswith("/"):
            entry = posixpath.join(posixpath.dirname(settings.containerd_config), entry)
        entry = posixpath.normpath(entry)
        for path in _expand(host, entry, ours):
            if path == ours:
                return found
            if path != settings.containerd_config and path not in found:
                found.append(path)
    return found


def _expand(host: Host, entry: str, ours: str) -> list[str]:
    """An import entry's files, sorted like Go's ``filepath.Glob``; ours counts as present.

    Globs in the last component only (the only kind containerd configs use).
    """
    directory, pattern = posixpath.split(entry)
    if not any(c in pattern for c in "*?["):
        return [entry]
    try:
        # resolve() records the directory: a drop-in added later is a drift
        names = [p.name for p in host.resolve(directory, follow_last=True).iterdir()]
    except (OSError, HostPathError):
        names = []
    matches = {f"{directory}/{n}" for n in names if fnmatch.fnmatchcase(n, pattern)}
    if posixpath.dirname(ours) == directory and fnmatch.fnmatchcase(
        posixpath.basename(ours), pattern
    ):
        matches.add(ours)
    return sorted(matches)


def parse(path: str, content: bytes, *, after: str = "") -> dict:
    """A config as TOML, or a ``CommandError`` naming it (never half-parsed)."""
    try:
        return tomllib.loads(content.decode())
    except UnicodeDecodeError as exc:
        raise CommandError(f"{path}: not UTF-8 text{after}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CommandError(f"{path}: not valid TOML{after}: {exc}") from exc


def base(inputs: Inputs, main_path: str) -> tuple[bytes | None, dict | None]:
    """What ``nvidia-ctk`` is given as the main config, and the same parsed (None: not yet).

    The main config alone (its bytes as they are) when no drop-in comes
    before ours; otherwise the main config with each earlier file's plugin
    tables laid over it, in containerd's order.  A file of another config
    version than the main config is left out of the merge (its tables have
    other names; containerd 2.x migrates each file itself).
    """
    if not inputs.earlier:
        # Unparsed: a config the tool cannot load is its error to report.
        return inputs.main, None
    doc = parse(main_path, inputs.main) if inputs.main is not None else {}
    version = doc.get("version", 2)
    for path, content in inputs.earlier:
        try:
            other = parse(path, content)
        except CommandError as exc:
            logger.warning("%s; not repeating its settings in the drop-in", exc)
            continue
        if other.get("version", 2) != version:
            continue
        doc = overlay(doc, other)
    return tomlwriter.dumps(doc).encode(), doc


def compose(ctk: dict, node: Mapping[str, Any], settings: CriSettings) -> dict:
    """The drop-in: ``nvidia-ctk``'s output over the node's tables, NRI, ``runc`` kept."""
    doc = dict(ctk)
    if settings.nri:
        doc["plugins"] = {**doc.get("plugins", {}), NRI: nri_settings(settings.nri_socket)}
    doc = merge_plugins(node, doc)
    cri = CRI_PLUGINS.get(doc.get("version", 2))
    plugins = doc.get("plugins", {})
    if cri in plugins:
        runtimes = plugins[cri].setdefault("containerd", {}).setdefault("runtimes", {})
        if "runc" not in runtimes:
            runtimes["runc"] = dict(DEFAULT_RUNC[doc.get("version", 2)])
    return doc


def nri_settings(socket_path: str) -> dict[str, Any]:
    """The NRI plugin table: enabled, on ``socket_path``."""
    return {"disable": False, "socket_path": socket_path}


def merge_plugins(main: Mapping[str, Any], dropin: dict[str, Any]) -> dict[str, Any]:
    """The drop-in with each of its plugin tables laid over the main config's.

    Before containerd 2.1 a plugin table in an imported file *replaces* the
    main config's table of the same plugin: repeating the main config's
    keys under ours keeps the merged result what the node had plus what we
    add, whatever containerd version merges it.  Our keys win.
    """
    ours = dict(dropin.get("plugins", {}))
    theirs = main.get("plugins", {}) if isinstance(main.get("plugins"), Mapping) else {}
    for name, table in ours.items():
        if isinstance(table, Mapping) and isinstance(theirs.get(name), Mapping):
            ours[name] = _deep_merge(theirs[name], table)
    return {**dropin, "plugins": ours} if ours else dict(dropin)


def overlay(earlier: Mapping[str, Any], later: Mapping[str, Any]) -> dict[str, Any]:
    """``earlier`` with every plugin table of ``later`` laid over it (``later`` wins).

    How containerd 2.1 merges an imported file; the union the node's
    operator meant on every version.
    """
    plugins = dict(earlier.get("plugins", {}))
    for name, table in later.get("plugins", {}).items():
        if isinstance(table, Mapping) and isinstance(plugins.get(name), Mapping):
            plugins[name] = _deep_merge(plugins[name], table)
        else:
            plugins[name] = table
    return {**earlier, "plugins": plugins}


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` laid onto ``base`` table by table; values (arrays too) replace, never append."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def has_runtime(doc: Mapping[str, Any]) -> bool:
    """Whether ``nvidia-ctk`` wrote the ``nvidia`` runtime entry (a sanity check on its output).

    Catches a toolkit that silently wrote nothing useful (wrong flags for its
    version, a config version it did not expect) before containerd is
    restarted onto it.
    """
    plugins = doc.get("plugins", {})
    return any(
        RUNTIME_NAME in plugins.get(name, {}).get("containerd", {}).get("runtimes", {})
        for name in CRI_PLUGINS.values()
    )
