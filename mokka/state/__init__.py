"""The desired state: what a node should look like, before anything is written.

Owns the profiles (the built-in YAML and a user's), their compilation into
``State``, the runtime overrides and their schema, the sources the state is
read from, and the tables every layer reads alike (MIG profiles and
layouts, CPU lists).  May use only the shared top-level modules (errors,
layout, settings, logs); nothing above it, so the node root, the
simulators, the daemon and ``mokka ctl`` can all read it.
"""
