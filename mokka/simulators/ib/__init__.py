"""ib: mock InfiniBand HCAs (sysfs classes, ``/dev/infiniband``, tool wrappers,
verbs shim) and the ``mock-ib`` daemon that answers their management datagrams.

Modules, one concept each: ``hca`` (which HCAs a state calls for, every
value as sysfs spells it), ``lids`` (LIDs from the fabric's node list),
``sysfs`` (the tree as artifacts), ``tools`` (the wrappers of the sysfs,
verbs and MAD tools), ``bundle`` (the image's real tools, staged into the
driver tree), ``settings`` (the ``--ib-*`` flags), ``simulator`` (the
``Simulator`` and ``Daemon`` tying them to the waves).  The daemon:
``mad`` (frames and MAD headers as bytes), ``smp`` (attribute payloads),
``fabric`` (the subnet one daemon sees: entities, links, answers),
``service`` (the umad socket and routing), ``relay`` (MADs between the
daemons of a fabric), ``mockib`` (the service and relay kept in step with
the state), ``counters`` (``mokka ctl ib-counter``).
The shims are C: ``native/ibshim`` (verbs), ``native/umadshim`` (MADs).
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
