"""``mokka ctl``: the line a writing verb prints, saying what it changed and who applies it.

A drill reads its own log: ``gpu 0 (GPU-…): temperature 70 C; applied by
the daemon holding /host (pid 4242)`` says which GPU the target turned out
to be (an index and its UUID, as the engine config pairs them), the value
in the unit the verb takes, and whether anything will act on it.  Written
from the parsed flags, not from the file: the line says what this call
asked for, in the user's words, not the file's field names.

Nothing here reads or writes the overrides file; ``mokka.ctl.command`` prints the
line once the file is written, and decides the exit status from the
daemon's part (``mokka.ctl.daemon_presence``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def target_label(target: str | None, known: dict[str, int] | None) -> str:
    """``gpu 0 (GPU-…)``, ``every GPU`` (the ``all`` section) or, with no engine config to
    pair them, the index or UUID as given."""
    if target is None or target == "all":
        return "every GPU"
    if target.isdigit():
        uuid = next((u for u, i in (known or {}).items() if i == int(target)), None)
        return f"gpu {target}" + (f" ({uuid})" if uuid else "")
    index = (known or {}).get(target)
    return target if index is None else f"gpu {index} ({target})"


def _number(value: float) -> str:
    """``350``, ``350.5``: a number as a person writes it."""
    return f"{value:g}"


def _fail_text(args: argparse.Namespace) -> str:
    triggers = [f"after {args.after_calls} guarded NVML calls"
                if args.after_calls is not None else "",
                f"with probability {_number(args.probability)}"
                if args.probability is not None else "",
                f"seed {args.seed}" if args.seed is not None else ""]
    text = f"failure mode {args.mode}"
    text += "".join(f", {t}" for t in triggers if t)
    return text + (f", Xid {args.xid}" if args.xid is not None else "")


def _optional(value: object, text: str) -> str:
    """``text`` when the flag was given, else nothing."""
    return "" if value is None else text


#: Each writing verb's change in its own units, from its parsed flags.
_SAID: dict[str, Callable[[argparse.Namespace], str]] = {
    "fail": _fail_text,
    "xid": lambda a: f"Xid {a.code} raised",
    "temp": lambda a: f"temperature {a.celsius} C",
    "power": lambda a: f"power draw {_number(a.watts)} W",
    "util": lambda a: (f"utilization gpu {a.gpu_pct} %"
                       + _optional(a.mem_pct, f", memory {a.mem_pct} %")),
    "clocks": lambda a: (f"clocks graphics and SM {a.graphics} MHz"
                         + _optional(a.memory, f", memory {a.memory} MHz")),
    "throttle": lambda a: f"clocks event reasons {a.reasons.strip() or 'none'}",
    "pstate": lambda a: f"performance state {a.state.strip().upper()}",
    "nvlink-error": lambda a: f"NVLink {a.link}: {a.count} error(s) added",
    "fabric-health": lambda a: f"fabric health {a.state.strip().lower().replace('-', '_')}",
    "mig": lambda a: (f"MIG layout {a.create.strip()}" if a.create
                      else "MIG instances destroyed" if a.destroy else f"MIG mode {a.mode}"),
    "set": lambda a: ", ".join(text.strip() for text in a.assignments),
    "reset": lambda a: "overrides removed",
}


def change_text(args: argparse.Namespace) -> str:
    """What the verb's flags change, in the verb's units (``temperature 70 C``)."""
    said = _SAID.get(args.verb)
    return args.verb if said is None else said(args)


def daemon_text(root: Path | None, holder: int | OSError | None) -> str:
    """Who applies the change: the daemon holding ``root`` (pid when known), or nobody."""
    if root is None:
        return "written to --file; whether a daemon reads it is not checked"
    if isinstance(holder, OSError):
        return (f"whether a daemon holds {root} is unknown "
                f"({holder.filename or root}: {holder.strerror or holder})")
    if holder is None:
        return f"no daemon holds {root}: nothing applies it until one starts"
    return f"applied by the daemon holding {root}" + (f" (pid {holder})" if holder else "")


def report_line(args: argparse.Namespace, target: str | None, known: dict[str, int] | None,
                root: Path | None, holder: int | OSError | None) -> str:
    """The one line a writing verb prints (``reset`` with no target: the whole file)."""
    if args.verb == "reset" and target is None:
        what = "every override removed"
    else:
        what = f"{target_label(target, known)}: {change_text(args)}"
    return f"{what}; {daemon_text(root, holder)}"
