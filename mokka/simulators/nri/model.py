"""What the NRI plugin sees of a container and what it may change: plain values.

The boundary between the wire (``mokka.simulators.nri.wire`` and
``connection``: ttrpc, NRI's multiplexer, protobuf) and the decision of what
a container gets (``mokka.simulators.nri.inject``).  The wire decodes NRI's
``CreateContainerRequest`` into a ``Container`` and encodes an
``Adjustment`` into NRI's ``ContainerAdjustment``; the policy never sees a
byte of protobuf, and the wire never decides anything.  Only the fields the
policy reads are kept.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Mount:
    """One OCI mount: ``destination`` in the container, ``source`` on the host."""

    destination: str
    source: str
    type: str = "bind"
    options: tuple[str, ...] = ("rbind", "ro", "nosuid", "nodev")


@attrs.frozen
class Device:
    """One device node of the container's OCI spec (``linux.devices``)."""

    path: str
    type: str
    major: int
    minor: int


@attrs.frozen
class Container:
    """The container being created, as NRI's ``CreateContainer`` describes it."""

    id: str
    name: str
    pod_name: str
    pod_namespace: str
    pod_uid: str
    #: the container's and the pod's annotations (the pod's hold the opt-in/out)
    annotations: dict[str, str] = attrs.field(factory=dict)
    pod_annotations: dict[str, str] = attrs.field(factory=dict)
    #: ``KEY=VALUE`` strings, as in the OCI spec
    env: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    devices: tuple[Device, ...] = ()


@attrs.frozen
class Adjustment:
    """What to add to the container; empty: leave it as it is."""

    mounts: tuple[Mount, ...] = ()
    #: ``KEY=VALUE`` strings to add (or replace)
    env: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.mounts or self.env)
