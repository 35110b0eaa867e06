"""The node daemon: one process per node that converges it onto the desired state.

Owns the reconciler and its waves, the supervisor of the simulators'
daemons, teardown, the probes and metrics server, the state source it
watches, and the ``mokka daemon``/``mokka cleanup`` commands.  May use the
simulators, the node root's face (``mokka.noderoot``), the state and the
shared top-level modules; never ``mokka ctl``.
"""
