"""Port counters at run time: ``mokka ctl ib-counter`` and the daemon's side of it.

Monitoring reads an HCA port's error counters from sysfs
(``/sys/class/infiniband/<ca>/ports/1/counters/``) or asks the port's PMA
(``perfquery``); a fault drill raises one and expects both to show it.  The
counters live in the ib simulator (``IbSimulator.counters``), which writes
them into the staged sysfs files, and the ``mock-ib`` daemon answers
PortCounters from those files, so the two can never disagree.

``mokka ctl ib-counter`` reaches the running daemon over its umad socket
(a control frame, ``mad.CTL_COUNTER``): the change takes effect in the
running node at once, and, like a real HCA's counters, it is gone when the
node daemon restarts (the driver reloads, the counters start from zero).
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys

from mokka.noderoot import Host
from mokka.simulators.ib import mad
from mokka.simulators.ib.mockib import UMAD_SOCKET
from mokka.simulators.ib.sysfs import COUNTERS
from mokka.state.checks import found

VERB = "ib-counter"
#: Bound on the daemon's answer (it re-stages the counter files first).
REPLY_TIMEOUT = 10.0
#: The largest value a change carries: the control frame's 64-bit field
#: (``mad.counter_frame``), as wide as the ``port_*`` counters sysfs shows.
COUNTER_MAX = 2**64 - 1
#: The error counters a drill usually raises, for the help text.
ERROR_COUNTERS = (
    "symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
    "port_xmit_discards", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
)


class CounterError(Exception):
    """A counter change that could not be made; the message says why."""


def add_verb(verbs: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """``mokka ctl ib-counter --hca mlx5_0 symbol_error=5 [--set]``."""
    v = verbs.add_parser(
        VERB, parents=[common],
        help="raise an InfiniBand port counter (sysfs and perfquery)",
        epilog="counters: " + ", ".join(COUNTERS),
    )
    v.add_argument("--hca", required=True, metavar="mlx5_N", help="the HCA (its port 1)")
    v.add_argument("changes", nargs="+", metavar="counter=N",
                   help=f"add N to the counter (e.g. {', '.join(ERROR_COUNTERS[:3])})")
    v.add_argument("--set", action="store_true", help="set the counters to N instead of adding")


def parse_changes(texts: list[str]) -> list[tuple[str, int]]:
    """``name=N`` pairs; ``CounterError`` naming the bad one."""
    changes = []
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or name not in COUNTERS:
            raise CounterError(
                f"{VERB}: {found(text)}, expected counter=N with a counter among "
                f"{', '.join(COUNTERS)}"
            )
        # ASCII digits, and few enough to convert: ``"²".isdigit()`` holds but
        # ``int("²")`` raises, and ``int`` refuses text of over 4300 digits
        number = int(value) if value.isascii() and value.isdigit() and len(value) <= 20 else -1
        if not 0 <= number <= COUNTER_MAX:
            raise CounterError(f"{VERB}: {found(text)}: N must be an integer >= 0 "
                               f"and at most {COUNTER_MAX}")
        changes.append((name, number))
    return changes


def parse_hca(text: str) -> int:
    # at most 9 digits: the frame carries the index in 32 bits
    digits = text[5:]
    if not (text.startswith("mlx5_") and digits.isascii() and digits.isdigit()
            and len(digits) <= 9):
        raise CounterError(f"{VERB} --hca: {found(text)}, expected an HCA name such as mlx5_0")
    return int(digits)


def change_counters(
    host: Host, hca: int, changes: list[tuple[str, int]], *, set_: bool
) -> list[int]:
    """Send the changes to the node's daemon; the counters' new values."""
    path = host.resolve(UMAD_SOCKET)
    values = []
    dirfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY) if path.parent.exists() else None
    if dirfd is None:
        raise CounterError(f"{path}: no mock-ib daemon (is the node daemon running with IB on?)")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.settimeout(REPLY_TIMEOUT)
            try:
                sock.connect(f"/proc/self/fd/{dirfd}/{path.name}")
            except OSError as exc:
                raise CounterError(
                    f"{path}: no mock-ib daemon answers ({exc.strerror}); is the node daemon "
                    "running with InfiniBand on?"
                ) from exc
            mode = mad.COUNTER_SET if set_ else mad.COUNTER_ADD
            for name, value in changes:
                sock.send(mad.counter_frame(hca, name, mode, value))
                result, new = mad.parse_counter_reply(sock.recv(64))
                if result == -errno.ENODEV:
                    raise CounterError(f"{VERB} --hca: mlx5_{hca}: the node has no such HCA")
                if result < 0:
                    raise CounterError(f"{VERB}: {name}: refused ({os.strerror(-result)})")
                values.append(new)
    finally:
        os.close(dirfd)
    return values


def run(args: argparse.Namespace, host: Host | None) -> int:
    """Carry out ``mokka ctl ib-counter``: 0, or 2 for a bad request, 1 when the node can't."""
    if host is None:
        print(f"mokka ctl: error: {VERB} needs the node root (--root), not --file",
              file=sys.stderr)
        return 2
    try:
        hca = parse_hca(args.hca)
        changes = parse_changes(args.changes)
    except CounterError as exc:
        print(f"mokka ctl: error: {exc}", file=sys.stderr)
        return 2
    try:
        values = change_counters(host, hca, changes, set_=args.set)
    except (CounterError, OSError, ValueError) as exc:
        print(f"mokka ctl: error: {exc}", file=sys.stderr)
        return 1
    for (name, _), value in zip(changes, values, strict=True):
        print(f"mlx5_{hca} port 1 {name} = {value}")
    return 0

