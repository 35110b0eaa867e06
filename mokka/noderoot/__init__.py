"""The node root: everything Mokka writes on a node goes through this package.

Owns where a node path lies beneath the node root (``paths``), the converge
that creates, compares, backs up and removes artifacts (``host``,
``convergence``, ``removal``, ``writebatch``, ``fsops``), and the bookkeeping
that lets teardown leave the node as it was found (``manifest``, ``backups``,
``statedir``, ``private_files``, ``shared_dirs``), with the fast paths of a
pass that changes nothing (``settled``, ``recording``, ``driftwatch``,
``filememo``).  May use ``mokka.errors``, ``mokka.layout``, the logging
helpers and ``mokka.state``; never the daemon, the simulators or ``mokka ctl``.
"""
