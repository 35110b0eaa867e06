"""One module (or package) per simulator; ``base`` holds the protocols.

Each simulator owns one surface of the node (SURFACES.md) and stages it as
artifacts through the node root.  May use the node root's face
(``mokka.noderoot``), the state and the shared top-level modules; never the
daemon or ``mokka ctl``.
"""
