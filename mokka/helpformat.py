"""argparse's help formatter, without ``shutil``.

argparse makes a formatter for every ``add_argument`` (it checks the metavar
with one), and the stock formatter asks ``shutil`` for the terminal's width.
Importing ``shutil`` brings ``bz2``, ``lzma`` and ``zlib`` along: about
2.5 ms, a sixteenth of a ``mokka ctl`` call that never prints any help.
``Formatter`` finds the same width by the same rules as
``shutil.get_terminal_size`` (``COLUMNS``, else the terminal on standard
output, else 80 columns) and is otherwise argparse's own, so every help text
reads exactly as before (``tests/test_helpformat.py`` compares them).
"""

from __future__ import annotations

import argparse
import os
import sys


def terminal_columns() -> int:
    """The width ``shutil.get_terminal_size().columns`` reports, found the same way."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


class Formatter(argparse.HelpFormatter):
    """``argparse.HelpFormatter`` with its default width from ``terminal_columns``."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        if width is None:
            width = terminal_columns() - 2  # the stock formatter's margin
        super().__init__(prog, indent_increment, max_help_position, width)
