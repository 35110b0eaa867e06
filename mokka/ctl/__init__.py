"""``mokka ctl`` and ``mokka fabricmanager-ctl``: the commands an operator runs on a live node.

Owns each verb's command line (``verbs``), what it changes in the overrides
(``edits``), which GPU it targets (``targets``), the status table
(``status``), whether its files are already recorded (``records``), whether a
daemon holds the node (``daemon_presence``), which files of the node a call
reads and writes (``node_files``) and the line it prints (``report``);
``command`` ties them together.  May use the node root's
package, ``mokka.state`` and the shared top-level modules; never the daemon
or the simulators.  Empty on purpose: ``mokka fabricmanager-ctl`` and a
recorded ``mokka ctl`` call import only the modules they need.
"""
