"""The command line of ``mokka ctl``: every verb, its summary and flags, built on demand.

This module owns what a person types and reads: the verbs table
(``VERBS``, in ``--help`` order), each verb's flags and help text, the
``--root``/``--file``/``--gpu`` options the verbs share, and the argparse
action (``_Verbs``) that builds a verb's parser only when the command line
names it.  Running a parsed call is ``mokka.ctl.command``'s business, and what a
verb changes in the overrides file is ``mokka.ctl.edits``'.

It is separate because its cost is separate: argparse's parsers cost a
call about as much as its work does, so ``mokka ctl temp`` builds the
``temp`` parser alone, and imports the ``ib-counter`` verb's module (the
ib simulator, which defines that verb with ``add_verb(action, common)``)
only when that verb is named.  Importing this module builds nothing.
"""

from __future__ import annotations

import argparse
import functools
import importlib
from collections.abc import Callable
from typing import Any

from mokka import layout
from mokka.helpformat import Formatter
from mokka.state.device_checks import FAILURE_MODES
from mokka.state.override_schema import (
    FABRIC_HEALTH,
    TEMPERATURE_RANGE_C,
    THROTTLE_REASONS,
    known_paths,
    pstate_range,
)

#: ``ib-counter`` is defined with the ib simulator, whose import costs more
#: than everything else ``mokka ctl`` needs: like every verb, it is built
#: only when named (``_Verbs``).  Its name and one-line summary are what
#: ``mokka ctl --help`` lists until then (``tests/test_ctl_messages.py``
#: keeps them equal to the module's own).
IB_COUNTER_VERB = "ib-counter"
IB_COUNTER_MODULE = "mokka.simulators.ib.counters"
IB_COUNTER_SUMMARY = "raise an InfiniBand port counter (sysfs and perfquery)"
#: ``mokka ctl --help``'s description, under ``mokka`` and standalone (``mokka.ctl.command``).
DESCRIPTION = (
    "Change the mock GPUs of a running node: every verb edits the node's overrides file "
    "under a lock, validates the result and replaces the file atomically; the node agent "
    "and the mock NVML library pick the change up at once."
)
GPU_HELP = "GPU index, 'all', or a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"


class _Verbs(argparse._SubParsersAction):
    """The verbs' subparsers action, with verbs whose parser is built when named.

    A deferred verb is listed (name and summary) in ``mokka ctl --help`` and
    accepted as a choice at once, but its defining module is imported, and
    its real parser built, only when the command line names it (or
    ``load`` is asked for it): ``mokka ctl temp`` must not pay for the ib
    simulator's import to offer ``ib-counter``, nor for building the
    parsers of the thirteen verbs it does not name.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deferred: dict[str, Callable[[_Verbs], None]] = {}

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        # No abbreviations, whatever parser ``mokka ctl`` hangs under: argparse
        # hands a subparser its parent's class, but not its ``allow_abbrev``.
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", Formatter)
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


def _add_location(parser: argparse.ArgumentParser, default: object) -> None:
    """``--root`` or ``--file`` (not both) on ``parser``, with ``default`` for each."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--root", metavar="DIR", default=default, help=(
        "node root (env MOKKA_ROOT; default ./mokka-node); the file is "
        f"<root>{layout.OVERRIDES}"))
    where.add_argument("--file", metavar="PATH", default=default, help="the overrides file itself")
    # beside the location: a call says where it writes and whether a daemon
    # there applies it, and exits 3 when none does (``mokka.ctl.command``)
    parser.add_argument("--no-daemon-ok", action="store_true", default=default or False, help=(
        "exit 0 when no daemon holds the node root (the change is written and applies "
        "when one starts; env MOKKA_CTL_NO_DAEMON_OK=1); default: exit 3"))


class _Parents:
    """The parent parsers the verbs share, each built when a verb first needs it."""

    @functools.cached_property
    def common(self) -> argparse.ArgumentParser:
        """``--root``/``--file`` after the verb.  They default to SUPPRESS so that,
        when absent, they do not overwrite a value given before the verb."""
        parser = argparse.ArgumentParser(add_help=False, formatter_class=Formatter)
        _add_location(parser, argparse.SUPPRESS)
        return parser

    # Verbs that change one thing need an explicit target; ``set``, ``status``
    # and ``reset`` default to every target, which for them is the natural reading.
    @functools.cached_property
    def target(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            add_help=False, parents=[self.common], formatter_class=Formatter
        )
        parser.add_argument("--gpu", required=True, metavar="T", help=GPU_HELP)
        return parser

    @functools.cached_property
    def optional_target(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            add_help=False, parents=[self.common], formatter_class=Formatter
        )
        parser.add_argument("--gpu", metavar="T", help=GPU_HELP + " (default: every target)")
        return parser


def _fail_flags(v: argparse.ArgumentParser) -> None:
    # The triggers are the mock library's: counted per process, sticky once fired
    # (lost and fallen_off_bus only: an ECC injection is node state).
    v.add_argument("--mode", required=True, choices=FAILURE_MODES, help=(
        "lost, fallen_off_bus: guarded NVML calls return GPU_IS_LOST; ecc_uncorrectable: "
        "one uncorrectable ECC error (node state; triggers do not apply); healthy: no failure"))
    v.add_argument("--after-calls", type=int, metavar="N", help="fail after N guarded NVML calls")
    v.add_argument("--probability", type=float, metavar="P", help="fail each call with P (0..1)")
    v.add_argument("--seed", type=int, metavar="S", help="seed of the probability draw")
    v.add_argument("--xid", type=int, metavar="CODE", help="also raise this Xid")


def _xid_flags(v: argparse.ArgumentParser) -> None:
    # Delivered once on the kernel log and once through NVML events.
    v.add_argument("--code", type=int, required=True, metavar="N",
                   help="the Xid number, e.g. 79 (fallen off the bus) or 48 (double-bit ECC)")


def _temp_flags(v: argparse.ArgumentParser) -> None:
    low, high = TEMPERATURE_RANGE_C
    v.add_argument("--celsius", type=int, required=True, metavar="N",
                   help=f"GPU temperature in degrees Celsius, {low}..{high}")


def _power_flags(v: argparse.ArgumentParser) -> None:
    # Watts on the command line (how people speak of power), mW in the file
    # (how NVML reports it); ``mokka.ctl.edits.build_edit`` converts.
    v.add_argument("--watts", type=float, required=True, metavar="N",
                   help="power draw in watts (fractions allowed; NVML reports whole mW)")


def _util_flags(v: argparse.ArgumentParser) -> None:
    v.add_argument("--gpu-pct", type=int, required=True, metavar="N",
                   help="GPU (SM) utilization in percent, 0..100")
    v.add_argument("--mem-pct", type=int, metavar="N",
                   help="memory controller utilization in percent, 0..100")


def _clocks_flags(v: argparse.ArgumentParser) -> None:
    v.add_argument("--graphics", type=int, required=True, metavar="MHZ",
                   help="graphics clock in MHz (the SM clock follows it)")
    v.add_argument("--memory", type=int, metavar="MHZ", help="memory clock in MHz")


def _throttle_flags(v: argparse.ArgumentParser) -> None:
    v.add_argument("--reasons", required=True, metavar="a,b",
                   help=f"comma-separated, or 'none'; known: {', '.join(THROTTLE_REASONS)}")


def _pstate_flags(v: argparse.ArgumentParser) -> None:
    # Not ``choices=``: argparse compares exactly, and ``p2`` should work as
    # well as ``P2``; ``mokka.ctl.edits.build_edit`` checks the value (in any
    # case) instead.
    v.add_argument("--state", required=True, metavar=pstate_range(),
                   help=f"{pstate_range()} (P0 is full performance), in any case")


def _nvlink_error_flags(v: argparse.ArgumentParser) -> None:
    v.add_argument("--link", type=int, required=True, metavar="N",
                   help="the NVLink's number on this GPU, 0..17")
    v.add_argument("--count", type=int, default=1, metavar="N",
                   help="errors to add to the link's count (default 1)")


def _fabric_health_flags(v: argparse.ArgumentParser) -> None:
    v.add_argument("--state", required=True, metavar="|".join(FABRIC_HEALTH),
                   help="the health nvidia-smi -q and NVML's fabric info report")


def _set_flags(v: argparse.ArgumentParser) -> None:
    v.epilog = "fields: " + ", ".join(known_paths())
    v.add_argument("assignments", nargs="+", metavar="key.path=value",
                   help="a field and its value, read as YAML (80, true, [1, 2], text)")


def _mig_flags(v: argparse.ArgumentParser) -> None:
    what = v.add_mutually_exclusive_group(required=True)
    what.add_argument("--create", metavar="PROFILES", help=(
        "the GPU's MIG layout becomes these GPU instances, each with one compute "
        "instance over all of it, replacing the layout in force, e.g. "
        "1g.10gb,1g.10gb or 7x1g.10gb (MIG mode is switched on)"))
    what.add_argument("--destroy", action="store_true",
                      help="destroy every GPU and compute instance of the GPU")
    what.add_argument("--mode", choices=("enabled", "disabled"),
                      help="MIG mode, current and pending (disabled destroys the instances)")


def _status_flags(v: argparse.ArgumentParser) -> None:
    v.add_argument("--json", action="store_true", help="print the document as JSON")


#: Each verb, in ``--help`` order: its summary, whether ``--gpu`` is required
#: (else it defaults to every target), and what adds the verb's own flags.
VERBS: dict[str, tuple[str, bool, Callable[[argparse.ArgumentParser], None]]] = {
    "fail": ("inject a failure mode", True, _fail_flags),
    "xid": ("raise an Xid (kernel log + NVML event)", True, _xid_flags),
    "temp": ("pin the GPU temperature", True, _temp_flags),
    "power": ("pin the power draw", True, _power_flags),
    "util": ("pin utilization", True, _util_flags),
    "clocks": ("pin current clocks", True, _clocks_flags),
    "throttle": ("set the active clocks event reasons", True, _throttle_flags),
    "pstate": ("set the performance state", True, _pstate_flags),
    "nvlink-error": ("add errors on an NVLink", True, _nvlink_error_flags),
    "fabric-health": ("set the NVLink fabric health", True, _fabric_health_flags),
    "mig": ("change a GPU's MIG mode or layout", True, _mig_flags),
    "set": ("set any overridable field", False, _set_flags),
    "status": ("show the overrides in force", False, _status_flags),
    "reset": ("remove overrides (of one target)", False, lambda v: None),
}


def _build_verb(name: str, parents: _Parents, verbs: _Verbs) -> None:
    """Add verb ``name``'s real parser to ``verbs`` (``_Verbs.load`` calls this)."""
    summary, needs_target, add_flags = VERBS[name]
    parent = parents.target if needs_target else parents.optional_target
    add_flags(verbs.add_parser(name, parents=[parent], help=summary))


def add_verbs(parser: argparse.ArgumentParser) -> None:
    """Every verb and its flags, on ``parser`` (the ``ctl`` subcommand or ``main``'s own).

    Every verb is deferred (``_Verbs``): a call builds the parser of the one
    verb it names, not all fourteen (argparse's parsers cost a call about
    as much as its work does).
    """
    # ``--root``/``--file`` are accepted before the verb (``mokka ctl --root D fail``)
    # and after it (``mokka ctl fail --root D``, from ``_Parents.common``).
    _add_location(parser, None)
    parents = _Parents()
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True, action=_Verbs)
    for name, (summary, _, _) in VERBS.items():
        verbs.add_deferred(name, summary, functools.partial(_build_verb, name, parents))
    verbs.add_deferred(
        IB_COUNTER_VERB, IB_COUNTER_SUMMARY,
        lambda action: importlib.import_module(IB_COUNTER_MODULE).add_verb(action, parents.common))
