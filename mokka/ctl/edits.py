"""What each ``mokka ctl`` verb changes in the overrides document.

A verb's flags become an ``Edit``: a function that changes one target's
section (``all`` or ``devices[T]``) of the parsed overrides file in place
(``build_edit``; ``apply`` runs it on the right section, ``reset`` drops
sections).  Flag values are converted and checked here, before the lock
is taken, so a bad flag never touches the file; what the overrides schema
checks (ranges, known fields) is left to it, so every such message names
the field in the file.

Nothing here writes a file (``mig --create`` reads the engine config for
the GPU's board): ``mokka.ctl.command`` finds the file, takes the lock and
validates the whole result (``update_overrides``).  Kept apart
from it so the document changes, where the units, the paired fields and
the replace-or-merge rules live, read without any of the file handling.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mokka.ctl.node_files import engine_config_path
from mokka.errors import CtlError, SpecError
from mokka.state.checks import found
from mokka.state.engine_values import KEY_SEGMENT, MAX_KEY_LENGTH
from mokka.state.override_schema import FABRIC_HEALTH, PSTATES, THROTTLE_REASONS, pstate_range
from mokka.state.reader import MAX_DEPTH, excerpt, load_yaml, read_input

#: A verb's change to one target's section (``all`` or ``devices[T]``), in place.
Edit = Callable[[dict[str, Any]], None]

#: Levels a ``set`` key may have: the file's reader takes ``MAX_DEPTH``
#: levels, and a key's first one sits below ``devices`` and its target.
#: Checked before the key is built into the document, which would
#: otherwise be refused only as a whole, without naming the key.
SET_KEY_MAX_DEPTH = MAX_DEPTH - 2
#: Bytes a ``set`` value may have: twice a whole processes list a drill
#: would write, half of what Linux passes in one argument (128 KiB), and
#: far below the file's 4 MiB, so a pasted blob costs no YAML parse.
SET_VALUE_MAX_BYTES = 64 * 1024


def apply(doc: dict[str, Any], target: str, edit: Edit) -> None:
    """Run ``edit`` on ``doc["all"]`` or ``doc["devices"][target]``, creating the section."""
    section = doc.setdefault("all", {}) if target == "all" else (
        doc.setdefault("devices", {}).setdefault(target, {}))
    edit(section)


def reset(doc: dict[str, Any], target: str | None) -> dict[str, Any] | None:
    """Drop one target's section, or (no target) return a fresh empty document.

    ``update_overrides``' contract: a returned document replaces the old
    one, ``None`` means ``doc`` was edited in place.  Resetting ``all``
    leaves the per-GPU sections alone, and the reverse.
    """
    if target is None:
        return {"version": 1}
    if target == "all":
        doc.pop("all", None)
    else:
        doc.get("devices", {}).pop(target, None)
    return None


def put(section: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``section[a][b][c] = value`` for ``"a.b.c"``, creating the mappings on the way.

    A non-mapping in the way is replaced: the user asked for the nested
    field, and the schema check on the result reports anything still wrong.
    """
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = section.get(key)
        if not isinstance(child, dict):
            child = section[key] = {}
        section = child
    section[leaf] = value


def new_xid(code: int) -> dict[str, Any]:
    # a random id: each injection is a new Xid, also after a reset of the file
    # (64 random bits; the compiled Xid id is a hash over it, see compile._xid).
    # ``os.urandom``, what ``secrets.token_hex`` reads, without importing
    # ``secrets`` (and ``random``) into every ``mokka ctl`` call.
    return {"code": code, "id": os.urandom(8).hex()}


def build_edit(args: argparse.Namespace) -> Edit:
    """The change a verb makes to its target's section (validation happens on the whole file).

    Flag values are converted and checked here, before the lock is taken;
    what the schema checks (ranges, known fields) is left to it, so every
    such message names the file field.  Raises ``CtlError`` on a bad flag.
    """
    verb = args.verb
    if verb == "fail":
        failure: dict[str, Any] = {"mode": args.mode}
        for key in ("after_calls", "probability", "seed"):
            if getattr(args, key) is not None:
                failure[key] = getattr(args, key)
        if args.xid is not None:
            failure["xid"] = new_xid(args.xid)
        # The whole block is replaced, not merged: triggers of an earlier
        # ``fail`` (say ``after_calls``) must not carry over to this one.
        return lambda s: s.__setitem__("failure", failure)
    if verb == "xid":
        # appended: earlier Xids keep their ids and are not announced again
        return lambda s: s.setdefault("xids", []).append(new_xid(args.code))
    if verb == "temp":
        return lambda s: put(s, "thermal.temperature_gpu_c", args.celsius)
    if verb == "power":
        # argparse's ``float`` takes "nan" and "inf", which have no milliwatts
        if not math.isfinite(args.watts):
            raise CtlError(f"--watts: {args.watts}, expected a number of watts")
        milliwatts = round(args.watts * 1000)
        # NVML reports power in whole milliwatts
        return lambda s: put(s, "power.current_draw_mw", milliwatts)
    if verb == "util":
        def util(s: dict[str, Any]) -> None:
            put(s, "utilization.gpu", args.gpu_pct)
            if args.mem_pct is not None:
                put(s, "utilization.memory", args.mem_pct)
        return util
    if verb == "clocks":
        def clocks(s: dict[str, Any]) -> None:
            # The SM clock runs at the graphics clock on these GPUs; nvidia-smi
            # shows both, and a pin of one alone would read as a contradiction.
            put(s, "clocks.graphics_current", args.graphics)
            put(s, "clocks.sm_current", args.graphics)
            if args.memory is not None:
                put(s, "clocks.memory_current", args.memory)
        return clocks
    if verb == "throttle":
        # every reason is written, true or false, so the result is exactly
        # the set asked for whatever an earlier call left
        active = _reasons(args.reasons)
        return lambda s: s.__setitem__(
            "clocks_throttle_reasons", {r: r in active for r in THROTTLE_REASONS})
    if verb == "pstate":
        # checked here, once for the flag: the schema would report each of the
        # two fields it is written to
        state = args.state.strip().upper()
        if state not in PSTATES:
            raise CtlError(f"--state: {found(args.state)} is not a performance state, "
                           f"expected {pstate_range()}")
        def pstate(s: dict[str, Any]) -> None:
            # NVML has two getters for the same thing (GetPerformanceState and
            # the older GetPowerState); both must agree.
            put(s, "performance_state", state)
            put(s, "power.power_state", state)
        return pstate
    if verb == "nvlink-error":
        if args.count < 1:
            raise CtlError(f"--count: {args.count}, expected a number of errors >= 1")
        def nvlink(s: dict[str, Any]) -> None:
            # added to the count so far: error counters only ever climb
            links = s.setdefault("nvlink_errors", {})
            key = str(args.link)
            links[key] = int(links.get(key, 0)) + args.count
        return nvlink
    if verb == "fabric-health":
        health = fabric_health(args.state)
        return lambda s: put(s, "fabric.health", health)
    if verb == "mig":
        return _mig_edit(args)
    if verb == "set":
        # parsed now, so a malformed assignment fails before the lock is taken
        pairs = [_assignment(text) for text in args.assignments]
        def assign(s: dict[str, Any]) -> None:
            for key, value in pairs:
                put(s, key, value)
        return assign
    raise CtlError(f"unknown verb {verb!r}")


def _mig_edit(args: argparse.Namespace) -> Edit:
    """``mig``: the GPU's MIG mode, or its whole layout, as node state.

    ``--create`` checks the GPU instances against the board's table the
    way the daemon checks a profile's ``mig.layout`` and ``nvidia-smi mig``
    (``mokka.state.mig_layout``), so a layout the board
    cannot hold is refused here, naming the flag, before the lock is taken.
    The board is the one the engine config beside the file names.
    """
    chosen = [flag for flag in ("create", "destroy", "mode") if getattr(args, flag)]
    if len(chosen) != 1:
        raise CtlError("mig: expected exactly one of --create, --destroy, --mode")
    if args.mode:
        mode = args.mode
        def set_mode(s: dict[str, Any]) -> None:
            put(s, "mig.mode_current", mode)
            put(s, "mig.mode_pending", mode)
            if mode == "disabled":  # no instance outlives MIG mode
                put(s, "mig.instances", [])
        return set_mode
    if args.destroy:
        return lambda s: put(s, "mig.instances", [])
    from mokka.state import mig_layout, mig_profiles

    name = engine_gpu_name(engine_config_path(args), args.gpu)
    if name is None:
        raise CtlError(f"--gpu: {found(args.gpu)}: the engine config names no such GPU, "
                       "expected one GPU of a node a daemon has staged")
    board = mig_profiles.board(name)
    if board is None:
        raise CtlError(f"--create: {name} is not MIG capable")
    labels = [label.strip() for label in args.create.split(",") if label.strip()]
    if not labels:
        raise CtlError(f"--create: {found(args.create)} names no GPU instance profile, expected "
                       "a comma-separated list such as 7x1g.10gb (--destroy removes them all)")
    try:
        instances = mig_layout.declared(board, labels)
    except mig_layout.LayoutRefusal as refusal:
        raise CtlError(f"--create: {name}: {refusal.reason}") from None
    def create(s: dict[str, Any]) -> None:
        put(s, "mig.mode_current", "enabled")
        put(s, "mig.mode_pending", "enabled")
        put(s, "mig.instances", instances)
    return create


#: The engine config's lines ``engine_gpu_name`` reads (``docs/engine-config.md``).
_ENGINE_GPU_LINE = re.compile(r'^device\.(\d{1,9})\.(index|uuid|name): *"?(.*?)"? *$', re.M)


def engine_gpu_name(config: Path, target: str) -> str | None:
    """The name (``NVIDIA H100 80GB HBM3``) of the GPU ``target`` (an index or a
    UUID) in the engine config; ``None`` when the file does not tell."""
    try:
        text = read_input(config, "the engine config", root=config.parent) or ""
    except SpecError:
        return None
    gpus: dict[str, dict[str, str]] = {}
    for position, field, value in _ENGINE_GPU_LINE.findall(text):
        gpus.setdefault(position, {})[field] = value
    want = target.strip().lower()
    for gpu in gpus.values():
        if want in (gpu.get("index"), gpu.get("uuid", "").lower()):
            return gpu.get("name")
    return None


def _reasons(text: str) -> set[str]:
    """``--reasons``: comma-separated names (``-`` or ``_``, any case), or ``none``."""
    names = {r.strip().lower().replace("-", "_") for r in text.split(",") if r.strip()}
    if names == {"none"}:
        return set()
    unknown = sorted(names - set(THROTTLE_REASONS))
    if unknown or not names:
        # as typed where that is one short line, quoted (escapes shown) where it is not
        named = ", ".join(excerpt(name, 60) if name.isprintable() else found(name)
                          for name in unknown) or found(text)
        raise CtlError(f"--reasons: {excerpt(named, 200)} unknown, expected "
                       f"'none' or some of: {', '.join(THROTTLE_REASONS)}")
    return names


def fabric_health(state: str) -> dict[str, Any]:
    """The ``fabric.health`` block a ``fabric-health --state`` writes.

    ``summary`` and ``bandwidth`` use the words ``nvidia-smi -q`` prints
    (Summary: Healthy, Bandwidth: Full).  All four flags are written, at
    most one of them true, and the block replaces the old one whole, so
    no flag of an earlier call survives.
    """
    name = state.strip().lower().replace("-", "_")
    if name not in FABRIC_HEALTH:
        raise CtlError(f"--state: {found(state)}, expected one of: {', '.join(FABRIC_HEALTH)}")
    flags = ("route_recovery_in_progress", "route_unhealthy", "access_timeout_recovery",
             "incorrect_configuration")
    block: dict[str, Any] = {
        "summary": "healthy" if name == "healthy" else "unhealthy",
        "bandwidth": "degraded" if name == "degraded_bandwidth" else "full",
    }
    chosen = {"route_recovery": "route_recovery_in_progress"}.get(name, name)
    block.update({flag: flag == chosen for flag in flags})
    return block


def _assignment(text: str) -> tuple[str, Any]:
    """``key.path=value`` for ``set``; the value is read as YAML.

    So ``80`` is an int, ``true`` a bool and ``[1, 2]`` a list, the same
    reading the file itself gets.  Text that is not valid YAML, or nothing
    at all after ``=``, stays a string; the schema check then says whether
    the field wanted one.
    """
    try:
        text.encode()
    except UnicodeEncodeError:  # bytes of the command line that were not UTF-8
        raise CtlError(f"{found(text)}: not UTF-8 text, expected key.path=value") from None
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise CtlError(f"{found(text)} is not key.path=value "
                       "(e.g. thermal.temperature_gpu_c=80)")
    # bounded before anything is built of them: a clear line, not a whole
    # document refused (or a parse of megabytes) for one pasted blob
    if len(key) > MAX_KEY_LENGTH:
        raise CtlError(f"{found(key)}: a key of {len(key)} characters, expected at most "
                       f"{MAX_KEY_LENGTH} (the engine config's limit)")
    if key.count(".") >= SET_KEY_MAX_DEPTH:
        raise CtlError(f"{found(key)}: a key {key.count('.') + 1} levels deep, expected at "
                       f"most {SET_KEY_MAX_DEPTH}")
    if len(raw.encode()) > SET_VALUE_MAX_BYTES:
        raise CtlError(f"{found(key)}: a value of {len(raw.encode())} bytes, expected at most "
                       f"{SET_VALUE_MAX_BYTES}")
    # every field's name, the schema's and an open block's alike, is one the
    # engine config can hold
    if not all(KEY_SEGMENT.fullmatch(part) for part in key.split(".")):
        raise CtlError(f"{found(key)}: not a field path, expected names of "
                       f"{KEY_SEGMENT.pattern} joined by dots")
    try:
        # ``load_yaml``, not ``yaml.safe_load``: the file is read without YAML
        # 1.1's base-60 numbers (``1:20`` is text, not 80), and a value the
        # loader cannot build (``2024-13-45``, ``!!int x``, ``&a [*a]``) is a
        # ``SpecError`` there rather than a ``ValueError`` or a cycle.
        value = load_yaml(raw, "value") if raw.strip() else raw
    except SpecError:
        value = raw
    return key, value
