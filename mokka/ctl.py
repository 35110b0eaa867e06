"""``mokka ctl``: change the mock GPUs of a running node.

Every verb edits the node's overrides file (``mokka.state.overrides``):
under the exclusive lock, read, change, validate the whole result, write a
temp file and rename it in place.  The node agent notices the rename
(inotify) and the mock library sees the new values on its next call; a
rejected change leaves the file untouched.

Targets (``--gpu``): an index (``0``), ``all``, or a GPU UUID.  A UUID is
checked against the engine config beside the overrides file
(``config.yaml``, which lists every GPU's index and per-node UUID) when that
file is there and readable; otherwise any well-formed ``GPU-`` UUID is
accepted as a key and matches nothing until a GPU with that UUID exists.

The file is found from the node root (``--root``, env ``MOKKA_ROOT``, the
same default as the daemon) or named directly (``--file``).  Under a node
root the file and its lock are never reached through a symlink, and both
are written through ``Host``, which records them in the manifests of
``overrides.MANIFEST_OWNERS`` before creating them: ``mokka cleanup`` then
removes them, and the directories they kept, after a killed daemon.

The file is the whole interface: ``mokka ctl`` never talks to the daemon,
so it works from ``kubectl exec`` in the pod, from the host, or from a
test, with nothing listening.  The daemon recompiles the engine config
from it, and the library re-reads that at its next call (the daemon bumps a change
counter beside the engine config).

Exit status: 0 done; 2 the request was wrong (a bad value, an unknown
GPU, a change the schema refuses), as for argparse's own usage errors;
1 the node could not be read or changed (e.g. no config directory under
the root: a wrong ``--root``, or an agent that has not staged yet; every
verb, ``status`` too, says so alike).  A script may wait and retry on 1;
on 2 it must change its call.

A call imports only what its verb needs (a drill makes one per change):
nothing of the daemon, and the ``ib-counter`` verb's module only when it
is named (``_Verbs``); a ``--gpu`` target is checked by reading the engine
config's identity lines (``mokka.ctl_targets``), not by parsing the whole
file as YAML.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mokka import layout
from mokka.ctl_targets import parse_target
from mokka.errors import CtlError, MokkaError, SpecError
from mokka.host import File, Host
from mokka.settings import LOCAL_ROOT
from mokka.state.device_checks import FAILURE_MODES
from mokka.state.override_schema import (
    FABRIC_HEALTH,
    PSTATES,
    TEMPERATURE_RANGE_C,
    THROTTLE_REASONS,
    known_paths,
    pstate_range,
)
from mokka.state.overrides import (
    FILE_MODE,
    MANIFEST_OWNERS,
    load_overrides,
    lock_path,
    require_config_dir,
    update_overrides,
)
from mokka.state.reader import load_yaml

#: A verb's change to one target's section (``all`` or ``devices[T]``), in place.
Edit = Callable[[dict[str, Any]], None]
#: ``ib-counter`` is defined with the ib simulator, whose import costs more
#: than everything else ``mokka ctl`` needs: it is built only when named
#: (``_Verbs``).  Its name and one-line summary are what ``mokka ctl --help``
#: lists until then (``tests/test_ctl_messages.py`` keeps them equal to the
#: module's own).
IB_COUNTER_VERB = "ib-counter"
IB_COUNTER_MODULE = "mokka.simulators.ib.counters"
IB_COUNTER_SUMMARY = "raise an InfiniBand port counter (sysfs and perfquery)"
DESCRIPTION = (
    "Change the mock GPUs of a running node: every verb edits the node's overrides file "
    "under a lock, validates the result and replaces the file atomically; the node agent "
    "and the mock NVML library pick the change up at once."
)
GPU_HELP = "GPU index, 'all', or a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"


# ---- arguments -------------------------------------------------------------


class _Verbs(argparse._SubParsersAction):
    """The verbs' subparsers action, with verbs whose parser is built when named.

    A deferred verb is listed (name and summary) in ``mokka ctl --help`` and
    accepted as a choice at once, but its defining module is imported, and
    its real parser built, only when the command line names it (or
    ``load`` is asked for it): ``mokka ctl temp`` must not pay for the ib
    simulator's import to offer ``ib-counter``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deferred: dict[str, Callable[[_Verbs], None]] = {}

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        # No abbreviations, whatever parser ``mokka ctl`` hangs under: argparse
        # hands a subparser its parent's class, but not its ``allow_abbrev``.
        kwargs.setdefault("allow_abbrev", False)
        return super().add_parser(name, **kwargs)

    def add_deferred(self, name: str, summary: str, build: Callable[[_Verbs], None]) -> None:
        """List ``name`` now; ``build(self)`` adds its real parser when it is used."""
        self.add_parser(name, help=summary, add_help=False)
        self._deferred[name] = build

    def load(self, name: str) -> argparse.ArgumentParser:
        """The verb's parser, built now if it was deferred (in its place in ``--help``)."""
        build = self._deferred.pop(name, None)
        if build is not None:
            del self._name_parser_map[name]
            position = next(i for i, a in enumerate(self._choices_actions) if a.dest == name)
            del self._choices_actions[position]
            build(self)
            self._choices_actions.insert(position, self._choices_actions.pop())
        return self._name_parser_map[name]

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        # argparse has already checked that the name is among the choices
        self.load(values[0])
        super().__call__(parser, namespace, values, option_string)


def verbs_action(parser: argparse.ArgumentParser) -> _Verbs:
    """The ``_Verbs`` action ``add_verbs`` put on ``parser``."""
    return next(a for a in parser._actions if isinstance(a, _Verbs))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``mokka ctl`` to the ``mokka`` command line (``mokka.cli``)."""
    parser = subparsers.add_parser(
        "ctl", help="change the mock GPUs at runtime (failures, Xids, metrics)",
        description=DESCRIPTION,
    )
    add_verbs(parser)
    parser.set_defaults(func=run)


def _add_location(parser: argparse.ArgumentParser, default: object) -> None:
    """``--root`` or ``--file`` (not both) on ``parser``, with ``default`` for each."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--root", metavar="DIR", default=default, help=(
        "node root (env MOKKA_ROOT; default ./mokka-node); the file is "
        f"<root>{layout.OVERRIDES}"))
    where.add_argument("--file", metavar="PATH", default=default, help="the overrides file itself")


def add_verbs(parser: argparse.ArgumentParser) -> None:
    """Every verb and its flags, on ``parser`` (the ``ctl`` subcommand or ``main``'s own)."""
    # ``--root``/``--file`` are accepted before the verb (``mokka ctl --root D fail``)
    # and after it (``mokka ctl fail --root D``).  The verb-level copies
    # default to SUPPRESS so that, when absent, they do not overwrite a value
    # given before the verb.
    _add_location(parser, None)
    common = argparse.ArgumentParser(add_help=False)
    _add_location(common, argparse.SUPPRESS)
    # Verbs that change one thing need an explicit target; ``set``, ``status``
    # and ``reset`` default to every target, which for them is the natural reading.
    target = argparse.ArgumentParser(add_help=False, parents=[common])
    target.add_argument("--gpu", required=True, metavar="T", help=GPU_HELP)
    optional_target = argparse.ArgumentParser(add_help=False, parents=[common])
    optional_target.add_argument("--gpu", metavar="T", help=GPU_HELP + " (default: every target)")

    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True, action=_Verbs)
    # The triggers are the mock library's: counted per process, sticky once fired.
    v = verbs.add_parser("fail", parents=[target], help="inject a failure mode")
    v.add_argument("--mode", required=True, choices=FAILURE_MODES, help=(
        "lost, fallen_off_bus: guarded NVML calls return GPU_IS_LOST; ecc_uncorrectable: "
        "the uncorrectable ECC counters climb; healthy: no failure"))
    v.add_argument("--after-calls", type=int, metavar="N", help="fail after N guarded NVML calls")
    v.add_argument("--probability", type=float, metavar="P", help="fail each call with P (0..1)")
    v.add_argument("--seed", type=int, metavar="S", help="seed of the probability draw")
    v.add_argument("--xid", type=int, metavar="CODE", help="also raise this Xid")
    # Delivered once on the kernel log and once through NVML events.
    v = verbs.add_parser("xid", parents=[target], help="raise an Xid (kernel log + NVML event)")
    v.add_argument("--code", type=int, required=True, metavar="N",
                   help="the Xid number, e.g. 79 (fallen off the bus) or 48 (double-bit ECC)")
    v = verbs.add_parser("temp", parents=[target], help="pin the GPU temperature")
    low, high = TEMPERATURE_RANGE_C
    v.add_argument("--celsius", type=int, required=True, metavar="N",
                   help=f"GPU temperature in degrees Celsius, {low}..{high}")
    # Watts on the command line (how people speak of power), mW in the file
    # (how NVML reports it); see ``build_edit``.
    v = verbs.add_parser("power", parents=[target], help="pin the power draw")
    v.add_argument("--watts", type=float, required=True, metavar="N",
                   help="power draw in watts (fractions allowed; NVML reports whole mW)")
    v = verbs.add_parser("util", parents=[target], help="pin utilization")
    v.add_argument("--gpu-pct", type=int, required=True, metavar="N",
                   help="GPU (SM) utilization in percent, 0..100")
    v.add_argument("--mem-pct", type=int, metavar="N",
                   help="memory controller utilization in percent, 0..100")
    v = verbs.add_parser("clocks", parents=[target], help="pin current clocks")
    v.add_argument("--graphics", type=int, required=True, metavar="MHZ",
                   help="graphics clock in MHz (the SM clock follows it)")
    v.add_argument("--memory", type=int, metavar="MHZ", help="memory clock in MHz")
    v = verbs.add_parser("throttle", parents=[target], help="set the active clocks event reasons")
    v.add_argument("--reasons", required=True, metavar="a,b",
                   help=f"comma-separated, or 'none'; known: {', '.join(THROTTLE_REASONS)}")
    # Not ``choices=``: argparse compares exactly, and ``p2`` should work as
    # well as ``P2``; ``build_edit`` checks the value (in any case) instead.
    v = verbs.add_parser("pstate", parents=[target], help="set the performance state")
    v.add_argument("--state", required=True, metavar=pstate_range(),
                   help=f"{pstate_range()} (P0 is full performance), in any case")
    v = verbs.add_parser("nvlink-error", parents=[target], help="add errors on an NVLink")
    v.add_argument("--link", type=int, required=True, metavar="N",
                   help="the NVLink's number on this GPU, 0..17")
    v.add_argument("--count", type=int, default=1, metavar="N",
                   help="errors to add to the link's count (default 1)")
    v = verbs.add_parser("fabric-health", parents=[target], help="set the NVLink fabric health")
    v.add_argument("--state", required=True, metavar="|".join(FABRIC_HEALTH),
                   help="the health nvidia-smi -q and NVML's fabric info report")
    v = verbs.add_parser("set", parents=[optional_target], help="set any overridable field",
                         epilog="fields: " + ", ".join(known_paths()))
    v.add_argument("assignments", nargs="+", metavar="key.path=value",
                   help="a field and its value, read as YAML (80, true, [1, 2], text)")
    v = verbs.add_parser("status", parents=[optional_target], help="show the overrides in force")
    v.add_argument("--json", action="store_true", help="print the document as JSON")
    verbs.add_parser("reset", parents=[optional_target], help="remove overrides (of one target)")
    verbs.add_deferred(
        IB_COUNTER_VERB, IB_COUNTER_SUMMARY,
        lambda action: importlib.import_module(IB_COUNTER_MODULE).add_verb(action, common))


def main(argv: Sequence[str] | None = None) -> int:
    """``mokka ctl`` as a standalone entry point (tests, scripts)."""
    # no abbreviations, as for ``mokka``'s own parsers (``mokka.cli``)
    parser = argparse.ArgumentParser(prog="mokka ctl", description=DESCRIPTION,
                                     allow_abbrev=False)
    add_verbs(parser)
    return run(parser.parse_args(argv))


# ---- running ---------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Carry out a parsed ``mokka ctl`` command; returns the exit status (see the module).

    The verb's change is built before the lock is taken, so a bad flag
    fails without touching the file; the change then runs inside
    ``update_overrides``, which validates the whole result before writing.
    Without ``--gpu`` a change goes to ``all``.
    """
    if args.verb == IB_COUNTER_VERB:
        return importlib.import_module(IB_COUNTER_MODULE).run(args, node_host(args))
    try:
        host = node_host(args)
        path = overrides_path(args)
        if args.verb == "status":
            # read-only and lock-free: a rename never shows a half-written file
            return status(path, args, root=None if host is None else host.root)
        target = None if args.gpu is None else parse_target(args.gpu, path)
        if args.verb == "reset":
            change(path, host, lambda doc: reset(doc, target))
        else:
            edit = build_edit(args)
            change(path, host, lambda doc: apply(doc, target or "all", edit))
    except (CtlError, SpecError) as exc:
        # one line per problem, each already naming the flag or the field
        problems = exc.problems if isinstance(exc, SpecError) else (str(exc),)
        for problem in problems:
            print(f"mokka ctl: error: {problem}", file=sys.stderr)
        return 2
    except MokkaError as exc:
        print(f"mokka ctl: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        # The node could not be changed (the lock or the file cannot be
        # written): exit 1 with the file and the reason, not a traceback.
        print(f"mokka ctl: error: {exc.filename or 'overrides file'}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return 0


def node_host(args: argparse.Namespace) -> Host | None:
    """The node root's ``Host``; ``None`` with ``--file`` (a file named directly)."""
    if args.file:
        return None
    return Host(Path(args.root or os.environ.get("MOKKA_ROOT") or str(LOCAL_ROOT)))


def overrides_path(args: argparse.Namespace) -> Path:
    """The overrides file: ``--file`` as given, else its place under the node root.

    The root is mapped through ``Host.resolve``, the daemon's own mapping,
    so both agree on the path and a layout path can never escape the root.
    """
    host = node_host(args)
    return Path(args.file) if host is None else host.resolve(layout.OVERRIDES)


def change(path: Path, host: Host | None,
           edit: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    """``update_overrides``, through the node root's ``Host`` when there is one.

    Under a root, the lock is converged first (owner ``MANIFEST_OWNERS[1]``,
    an empty file) so it is recorded before it exists, and the new text is
    converged as the file (owner ``MANIFEST_OWNERS[0]``) in place of the
    plain write: two owners, because each converge names the whole set of
    its owner's paths and the lock is made before the file's text is known.
    Nothing is created while the config directory is missing:
    ``update_overrides`` reports that (a wrong ``--root``).
    """
    if host is None:
        update_overrides(path, edit)
        return
    file_owner, lock_owner = MANIFEST_OWNERS
    lock = lock_path(Path(layout.OVERRIDES)).as_posix()
    if path.parent.is_dir():
        host.converge(lock_owner, [File(lock, b"", FILE_MODE)])
    update_overrides(
        path, edit, root=host.root,
        store=lambda text: host.converge(file_owner, [File(layout.OVERRIDES, text, FILE_MODE)]),
    )


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
            raise CtlError(f"--state: {args.state!r} is not a performance state, "
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
    if verb == "set":
        # parsed now, so a malformed assignment fails before the lock is taken
        pairs = [_assignment(text) for text in args.assignments]
        def assign(s: dict[str, Any]) -> None:
            for key, value in pairs:
                put(s, key, value)
        return assign
    raise CtlError(f"unknown verb {verb!r}")


def _reasons(text: str) -> set[str]:
    """``--reasons``: comma-separated names (``-`` or ``_``, any case), or ``none``."""
    names = {r.strip().lower().replace("-", "_") for r in text.split(",") if r.strip()}
    if names == {"none"}:
        return set()
    unknown = sorted(names - set(THROTTLE_REASONS))
    if unknown or not names:
        raise CtlError(f"--reasons: {', '.join(unknown) or repr(text)} unknown, expected "
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
        raise CtlError(f"--state: {state!r}, expected one of: {', '.join(FABRIC_HEALTH)}")
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
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise CtlError(f"{text!r} is not key.path=value (e.g. thermal.temperature_gpu_c=80)")
    try:
        # ``load_yaml``, not ``yaml.safe_load``: the file is read without YAML
        # 1.1's base-60 numbers (``1:20`` is text, not 80), and a value the
        # loader cannot build (``2024-13-45``, ``!!int x``, ``&a [*a]``) is a
        # ``SpecError`` there rather than a ``ValueError`` or a cycle.
        value = load_yaml(raw, "value") if raw.strip() else raw
    except SpecError:
        value = raw
    return key, value


# ---- status ----------------------------------------------------------------


def status(path: Path, args: argparse.Namespace, *, root: Path | None = None) -> int:
    """Print the overrides in force: one ``TARGET FIELD VALUE`` row per leaf, or JSON.

    With ``--gpu`` only that target's own section is shown; what ``all``
    adds to it is not merged in, because the file (not the merge) is what
    ``set`` and ``reset`` act on.  Reading an invalid file is a ``SpecError``;
    a missing config directory is a ``MokkaError``, as for every writer
    (``require_config_dir``): "no overrides" is said only of a staged node.
    """
    require_config_dir(path)
    overrides = load_overrides(path, root=root)
    doc = overrides.to_mapping() if overrides is not None else {"version": 1}
    if args.gpu is not None:
        target = parse_target(args.gpu, path)
        section = doc.get("all") if target == "all" else doc.get("devices", {}).get(target)
        # the narrowed document keeps the file's shape: ``--json`` output is
        # itself a valid overrides file
        doc = {"version": 1, **({} if not section else (
            {"all": section} if target == "all" else {"devices": {target: section}}))}
    if args.json:
        # Keys as text: the open subtrees (``fan``, ``processes``) may mix int
        # and string keys, which ``sort_keys`` cannot order; ``default=str``
        # spells the values JSON has no type for (a YAML date).
        print(json.dumps(_text_keys(doc), indent=2, sort_keys=True, default=str))
        return 0
    rows = [("all", k, v) for k, v in _flatten(doc.get("all", {}))]
    for target, section in doc.get("devices", {}).items():
        rows += [(target, k, v) for k, v in _flatten(section)]
    if not rows:
        print(f"no overrides in {path}")
        return 0
    rows.insert(0, ("TARGET", "FIELD", "VALUE"))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    for target, key, value in rows:
        print(f"{target:<{widths[0]}}  {key:<{widths[1]}}  {value}")
    return 0


def _flatten(section: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted field, printed value)`` rows for ``status``'s table.

    Booleans and nulls print as JSON (``true``, ``null``), the words the
    user types to ``set``; lists print as compact JSON on one row.
    """
    rows: list[tuple[str, str]] = []
    for key, value in section.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            rows.extend(_flatten(value, path))
        elif isinstance(value, list):
            rows.append((path, json.dumps(_text_keys(value), separators=(",", ":"), default=str)))
        else:
            rows.append((path, json.dumps(value) if isinstance(value, bool) or value is None
                         else str(value)))
    return rows


def _text_keys(value: Any) -> Any:
    """``value`` with every mapping key turned into its text, as JSON spells keys anyway."""
    if isinstance(value, dict):
        return {str(k): _text_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_text_keys(v) for v in value]
    return value
