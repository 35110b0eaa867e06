"""nri: Mokka's NRI plugin, injecting into containers what a real GPU node shows them.

Modules, one concept each: ``model`` (the plain values at the boundary),
``wire``/``ttrpc``/``connection`` (NRI's protocol and the connection to the
runtime), ``inject`` (the policy: which GPUs a container sees and what it
gets), ``view`` (what the policy needs of a state, gathered once),
``settings`` (flags), ``simulator`` (the ``Daemon`` tying them together).
"""

from __future__ import annotations

import argparse

from mokka.simulators.nri.settings import NriSettings, add_arguments
from mokka.simulators.nri.simulator import NriSimulator
from mokka.simulators.registry import SimulatorPlugin

__all__ = ["PLUGIN", "NriSettings", "NriSimulator"]


def _build(args: argparse.Namespace) -> NriSimulator:
    return NriSimulator(settings=NriSettings.from_args(args))


PLUGIN = SimulatorPlugin(name="nri", add_arguments=add_arguments, build=_build)
