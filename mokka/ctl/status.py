"""``mokka ctl status``: the overrides in force, as a table or as JSON.

The one verb that only reads: no lock (a rename never shows a
half-written file) and nothing written, so a ``status`` call loads none
of the machinery writing takes (``tests/test_startup_imports.py``).  This
module owns how the file is shown: one ``TARGET FIELD VALUE`` row per
leaf, values spelt the way ``set`` takes them, and ``--json`` output that
is itself a valid overrides file.  It shares nothing with the verbs that
write (``mokka.ctl.edits``) but the file, hence a module of its own.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mokka import layout
from mokka.ctl.targets import parse_target
from mokka.errors import MokkaError
from mokka.noderoot import NodeRoot
from mokka.state.overrides import load_overrides, require_config_dir

#: Where the ib simulator stages each HCA's port counters (``mokka.simulators.ib.sysfs``,
#: not imported: it brings the simulator along): ``<class>/mlx5_<i>/ports/1/counters/<name>``.
IB_CLASS = f"{layout.IB_ROOT}/sys/class/infiniband"


def status(path: Path, args: argparse.Namespace, *, root: Path | None = None) -> int:
    """Print the overrides in force: one ``TARGET FIELD VALUE`` row per leaf, or JSON.

    With ``--gpu`` only that target's own section is shown; what ``all``
    adds to it is not merged in, because the file (not the merge) is what
    ``set`` and ``reset`` act on.  Reading an invalid file is a ``SpecError``;
    a missing config directory is a ``MokkaError``, as for every writer
    (``require_config_dir``): "no overrides" is said only of a staged node.
    """
    require_config_dir(path)
    overrides = load_overrides(path, root=root)
    doc = overrides.to_mapping() if overrides is not None else {"version": 1}
    if args.gpu is not None:
        target = parse_target(args.gpu, path)
        section = doc.get("all") if target == "all" else doc.get("devices", {}).get(target)
        # the narrowed document keeps the file's shape: ``--json`` output is
        # itself a valid overrides file
        doc = {"version": 1, **({} if not section else (
            {"all": section} if target == "all" else {"devices": {target: section}}))}
    if args.json:
        # Keys as text: the open subtrees (``fan``, ``processes``) may mix int
        # and string keys, which ``sort_keys`` cannot order; ``default=str``
        # spells the values JSON has no type for (a YAML date).
        print(json.dumps(_text_keys(doc), indent=2, sort_keys=True, default=str))
        return 0
    rows = [("all", k, v) for k, v in _flatten(doc.get("all", {}))]
    for target, section in doc.get("devices", {}).items():
        rows += [(target, k, v) for k, v in _flatten(section)]
    if not rows:
        print(shown(f"no overrides in {path}"))
    else:
        _table([("TARGET", "FIELD", "VALUE"), *rows])
    # What ``ib-counter`` raised lives in the daemon (and its staged sysfs
    # files), not in the overrides file: shown after it, for the whole node.
    counters = ib_counters(root) if root is not None and args.gpu is None else []
    if counters:
        print()
        _table([("IB PORT", "COUNTER", "VALUE"), *counters])
    return 0


def _table(rows: list[tuple[str, str, str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    for first, second, value in rows:
        print(shown(f"{first:<{widths[0]}}  {second:<{widths[1]}}  {value}"))


def ib_counters(root: Path) -> list[tuple[str, str, str]]:
    """``(mlx5_<i> port 1, counter, value)`` for every staged port counter that is not 0.

    Read from the files the daemon stages (the same ones sysfs readers and
    ``perfquery`` see); a node without InfiniBand, or a file that does not
    hold a number, shows nothing.
    """
    try:
        hcas = sorted(NodeRoot(root).resolve(IB_CLASS).glob("mlx5_*"),
                      key=lambda p: (len(p.name), p.name))
    except (OSError, MokkaError):
        return []
    rows = []
    for hca in hcas:
        try:
            files = sorted((hca / "ports" / "1" / "counters").iterdir())
        except OSError:
            continue
        for counter in files:
            try:
                text = counter.read_text().strip()
            except (OSError, UnicodeDecodeError):
                continue
            if text.isascii() and text.isdigit() and int(text):
                rows.append((f"{hca.name} port 1", counter.name, text))
    return rows


def shown(text: str) -> str:
    """``text`` printable on any stream: a path from a command line that was not UTF-8 holds
    lone surrogates (``os.fsdecode``), shown escaped (``\\udcff``) rather than refused."""
    return text.encode("utf-8", "backslashreplace").decode()


def _flatten(section: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted field, printed value)`` rows for ``status``'s table.

    Booleans and nulls print as JSON (``true``, ``null``), the words the
    user types to ``set``; lists print as compact JSON on one row.
    """
    rows: list[tuple[str, str]] = []
    for key, value in section.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            rows.extend(_flatten(value, path))
        elif isinstance(value, list):
            rows.append((path, json.dumps(_text_keys(value), separators=(",", ":"), default=str)))
        else:
            rows.append((path, json.dumps(value) if isinstance(value, bool) or value is None
                         else str(value)))
    return rows


def _text_keys(value: Any) -> Any:
    """``value`` with every mapping key turned into its text, as JSON spells keys anyway."""
    if isinstance(value, dict):
        return {str(k): _text_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_text_keys(v) for v in value]
    return value
