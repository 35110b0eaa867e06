"""Mokka: makes a Kubernetes node look like it has NVIDIA GPUs.

The node daemon compiles a desired state from a GPU profile and converges the
node onto it; see ``mokka.daemon`` for the reconciler and ``mokka.simulators``
for what is written where.  The packages, lowest layer first: ``state``,
``noderoot``, ``simulators``, ``daemon``, ``ctl``; each says what it owns and
what it may use.  This module holds the version and may use nothing else of
the package (``mokka --version`` reads it without importing any command).
"""

__version__ = "0.1.0"
