"""pcibus: the mock PCI bus (sysfs tree and ``libmockfs.so``) and the NFD feature file.

Modules, one concept each: ``hierarchy`` (which functions, bridges and
addresses a state calls for), ``endpoints`` (the GPUs and NVSwitches the
tree places: ids, classes, links, the NVSwitch device id),
``config_space`` (their 256-byte config space), ``sysfs`` (the tree as
artifacts),
``dmi`` (the system's DMI identity), ``nfd`` (the feature file),
``settings`` (flags), ``simulator`` (the ``Simulator``/``Applier`` tying
them to the waves).
"""

from __future__ import annotations

import argparse

from mokka.simulators.pcibus.settings import PcibusSettings, add_arguments
from mokka.simulators.pcibus.simulator import PcibusSimulator
from mokka.simulators.registry import SimulatorPlugin

__all__ = ["PLUGIN", "PcibusSettings", "PcibusSimulator"]


def _build(args: argparse.Namespace) -> PcibusSimulator:
    return PcibusSimulator(PcibusSettings.from_args(args))


PLUGIN = SimulatorPlugin(name="pcibus", add_arguments=add_arguments, build=_build)
