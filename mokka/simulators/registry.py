"""Which simulators the daemon runs, and how each gets its settings from flags.

Every simulator module exposes ``PLUGIN = SimulatorPlugin(...)``: its name,
a function adding its own flags to the daemon's argument parser (each in an
argument group named after the simulator), and a factory that builds the
simulator from the parsed flags.  The daemon builds them in the order of
``PLUGIN_MODULES``; the waves run them concurrently, so the order only
matters for logs and health bodies.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

import attrs

from mokka.simulators.base import Simulator

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
