"""Requests as a tool's libibmad writes them, for the umad tests and the IB
benches (``bench/ib_flood.py``): the MAD built byte by byte here, in the
umad header ``mad.Umad`` packs.

It imports nothing but mokka's wire module: the benches import it too,
without the test suite's own packages.
"""

from __future__ import annotations

from mokka.simulators.ib import mad, smp


def smp_get(lid: int, *, timeout_ms: int = 100, retries: int = 0, tid: int = 1) -> bytes:
    """A LID-routed NodeInfo Get to ``lid``, as libibmad writes it."""
    request = bytearray(256)
    request[0:4] = bytes([1, mad.CLASS_SMP_LID, 1, mad.METHOD_GET])
    request[8:16] = tid.to_bytes(8, "big")
    request[16:18] = smp.ATTR_NODE_INFO.to_bytes(2, "big")
    return mad.Umad(agent_id=0, timeout_ms=timeout_ms, retries=retries, lid=lid,
                    mad=bytes(request)).pack()
