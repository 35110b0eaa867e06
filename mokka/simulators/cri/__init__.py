"""cri: CDI specs for the mock GPUs and the containerd runtime setup (SURFACES §6).

Modules, one concept each:

* ``settings``: the flags and the frozen ``CriSettings``;
* ``cdi``: the two CDI specs, built from the state, checked, published;
* ``toolkit``: installing the NVIDIA Container Toolkit the image ships;
* ``dropin``: what containerd's drop-in holds, and the inputs it is computed from;
* ``mainconfig``: the one marked ``imports`` line in containerd's main config;
* ``runtime``: containerd's runtime setup: ``nvidia-ctk``, the drop-in, restarts;
* ``simulator``: the ``CriSimulator`` the reconciler drives.
"""

from __future__ import annotations

import argparse

from mokka.simulators.cri.settings import CriSettings, add_arguments
from mokka.simulators.cri.simulator import CriSimulator
from mokka.simulators.registry import SimulatorPlugin


def build(args: argparse.Namespace) -> CriSimulator:
    return CriSimulator(CriSettings.from_args(args))


PLUGIN = SimulatorPlugin(name="cri", add_arguments=add_arguments, build=build)

__all__ = ["PLUGIN", "CriSettings", "CriSimulator"]
