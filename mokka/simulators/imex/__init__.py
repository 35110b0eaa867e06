"""imex: IMEX channels, the ``/proc/devices`` overlay, and ``nvidia-imex`` from a pinned archive.

Modules, one concept each: ``channels`` (device nodes and the capability
file), ``procdevices`` (the overlay), ``archive`` (finding, verifying,
downloading and unpacking the archive), ``settings`` (flags), ``simulator``
(the stage/discard logic tying them together).
"""

from __future__ import annotations

import argparse

from mokka.simulators.imex.settings import ImexSettings, add_arguments
from mokka.simulators.imex.simulator import ImexSimulator
from mokka.simulators.registry import SimulatorPlugin

__all__ = ["PLUGIN", "ImexSettings", "ImexSimulator"]


def _build(args: argparse.Namespace) -> ImexSimulator:
    return ImexSimulator(settings=ImexSettings.from_args(args))


PLUGIN = SimulatorPlugin(name="imex", add_arguments=add_arguments, build=_build)
