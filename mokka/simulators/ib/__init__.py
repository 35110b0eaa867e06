"""ib: mock InfiniBand HCAs (sysfs classes, ``/dev/infiniband``, tool wrappers, verbs shim).

Modules, one concept each: ``hca`` (which HCAs a state calls for, every
value as sysfs spells it), ``sysfs`` (the tree as artifacts), ``tools``
(the ``ibstat``/``ibstatus``/``ibv_devinfo``/``ibv_devices`` wrappers),
``bundle`` (the image's real tools, staged into the driver tree),
``settings`` (``--ib-mode``, ``--ib-tools-dir``), ``simulator`` (the
``Simulator`` tying them to the waves).
The verbs shim itself is C: ``native/ibshim``.
"""

from __future__ import annotations

import argparse

from mokka.simulators.ib.settings import IbSettings, add_arguments
from mokka.simulators.ib.simulator import IbSimulator
from mokka.simulators.registry import SimulatorPlugin

__all__ = ["PLUGIN", "IbSettings", "IbSimulator"]


def _build(args: argparse.Namespace) -> IbSimulator:
    return IbSimulator(IbSettings.from_args(args))


PLUGIN = SimulatorPlugin(name="ib", add_arguments=add_arguments, build=_build)
