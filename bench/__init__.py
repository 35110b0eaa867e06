"""Mokka's benchmarks: scripts that print figures against floors measured in the same run.

``python -m bench`` runs them all (see ``bench/__main__.py``); each script
also runs alone as ``python bench/<name>.py``.  Nothing here asserts a time:
speed is read from the figures, never tested.
"""
