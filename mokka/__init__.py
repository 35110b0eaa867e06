"""Mokka: makes a Kubernetes node look like it has NVIDIA GPUs.

The node daemon compiles a desired state from a GPU profile and converges the
node onto it; see ``mokka.daemon`` for the reconciler and ``mokka.simulators``
for what is written where.
"""

__version__ = "0.1.0"
