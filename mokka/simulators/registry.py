"""Which simulators the daemon runs, and how each gets its settings from flags.

Every simulator module exposes ``PLUGIN = SimulatorPlugin(...)``: its name,
a function adding its own flags to the daemon's argument parser (each in an
argument group named after the simulator), and a factory that builds the
simulator from the parsed flags.  The daemon builds them in the order of
``PLUGIN_MODULES``; the waves run them concurrently, so the order only
matters for logs and health bodies.

A simulator's settings class validates its own fields and names them as
fields (``gpudriver settings: uvm_major: ...``), since it is also built
directly.  ``add_plugin_arguments`` remembers which flag feeds which field,
and ``build_simulators`` rewrites such a message to name the flag the user
typed (``--uvm-major: ...``).
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Callable, Mapping

import attrs

from mokka.errors import SpecError
from mokka.simulators.base import Simulator

#: Where ``add_plugin_arguments`` leaves ``{simulator: {dest: flag}}`` in the namespace.
FLAGS_ATTRIBUTE = "simulator_flags"

#: ``<simulator> settings: <field>: <the rest>``, the settings classes' wording.
_FIELD_PROBLEM = re.compile(r"^(?P<sim>[\w-]+) settings: (?P<field>\w+): (?P<rest>.*)$", re.S)

#: Simulator modules, in the order they are listed in logs and health bodies.
PLUGIN_MODULES: tuple[str, ...] = (
    "mokka.simulators.gpudriver",
    "mokka.simulators.pcibus",
    "mokka.simulators.nvlink",
    "mokka.simulators.cri",
    "mokka.simulators.imex",
    "mokka.simulators.fabricmanager",
    "mokka.simulators.kernellog",
    "mokka.simulators.ib",
    "mokka.simulators.workload",
    "mokka.simulators.nri",
)


@attrs.frozen
class SimulatorPlugin:
    name: str
    #: adds this simulator's flags (``--imex``, ``--driver-publish``, ...) to the parser
    add_arguments: Callable[[argparse.ArgumentParser], None]
    #: builds the simulator from the parsed flags
    build: Callable[[argparse.Namespace], Simulator]


def load_plugins() -> list[SimulatorPlugin]:
    plugins = []
    for module_name in PLUGIN_MODULES:
        module = importlib.import_module(module_name)
        plugins.append(module.PLUGIN)
    return plugins


def add_plugin_arguments(parser: argparse.ArgumentParser) -> None:
    """Every plugin's flags on ``parser``, and which flags each plugin added."""
    flags: dict[str, dict[str, str]] = {}
    for plugin in load_plugins():
        before = len(parser._actions)
        plugin.add_arguments(parser)
        flags[plugin.name] = {
            action.dest: action.option_strings[-1]
            for action in parser._actions[before:]
            if action.option_strings
        }
    parser.set_defaults(**{FLAGS_ATTRIBUTE: flags})


def flag_for(flags: Mapping[str, str], field: str) -> str | None:
    """The flag feeding ``field``: same name, or the one unique flag named ``..._field``."""
    if field in flags:
        return flags[field]
    candidates = [flag for dest, flag in flags.items() if dest.endswith(f"_{field}")]
    return candidates[0] if len(candidates) == 1 else None


def name_flags(error: SpecError, flags: Mapping[str, Mapping[str, str]]) -> SpecError:
    """``error`` with each ``<sim> settings: <field>:`` problem naming the flag instead."""
    problems = []
    for problem in error.problems:
        match = _FIELD_PROBLEM.match(problem)
        flag = match and flag_for(flags.get(match["sim"], {}), match["field"])
        problems.append(f"{flag}: {match['rest']}" if match and flag else problem)
    return SpecError(problems)


def build_simulators(args: argparse.Namespace) -> list[Simulator]:
    """Every registered simulator, built from its own flags (registry order).

    A ``SpecError`` names the flags (when ``add_plugin_arguments`` declared them).
    """
    flags = getattr(args, FLAGS_ATTRIBUTE, {})
    try:
        return [plugin.build(args) for plugin in load_plugins()]
    except SpecError as exc:
        raise name_flags(exc, flags) from None
