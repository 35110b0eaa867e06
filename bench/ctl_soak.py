"""A daemon under a ``mokka ctl`` loop: what its memory and CPU do over many changes.

Run: ``.venv/bin/python bench/ctl_soak.py [--changes 1000]``.

A fault drill calls ``mokka ctl`` in a loop for as long as the test runs,
so what each change costs the daemon, and whether it keeps any of it, adds
up.  Two daemons on their own scratch roots, side by side:

* **as shipped**: one malloc arena (``mokka.daemon.memory``);
* **glibc's default arenas**: the same daemon with ``MALLOC_ARENA_MAX`` set
  to glibc's own default for this machine (eight per core), which the
  daemon leaves alone, as every daemon ran before the limit.

Each gets ``--changes`` calls, interleaved (``temp``, ``power``, ``util``
and ``xid`` in turn, one GPU after another).  Reported per daemon: PSS
when ready (the floor), PSS after every fifth of the calls and at the end
(ratio to the floor), the daemon's CPU per change, and the ``mokka ctl``
process's wall time (p50).  Each ``xid`` adds a record the node keeps (an
Xid stays in the kernel log), so a little growth is the node's own state.
Both roots must end empty after SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nodes
from figures import report

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--changes", "100"]

BENCH = "ctl_soak"
#: glibc's default arena limit: eight per core on 64-bit.
GLIBC_DEFAULT_ARENAS = 8 * (os.cpu_count() or 1)
VERBS = (
    ("temp", "--celsius", "{n}"),
    ("power", "--watts", "{n}"),
    ("util", "--gpu-pct", "{n}"),
    ("xid", "--code", "79"),
)


def ctl_argv(root: Path, call: int) -> list[str]:
    verb, flag, value = VERBS[call % len(VERBS)]
    return [*nodes.mokka_command(), "ctl", "--root", str(root), verb,
            "--gpu", str(call % 8), flag, value.format(n=40 + call % 50)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=1000, help="ctl calls per daemon")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per wait")
    args = parser.parse_args(argv)
    nodes.warm_bytecode()
    setups = {"as shipped": {}, "glibc's default arenas": {
        "MALLOC_ARENA_MAX": str(GLIBC_DEFAULT_ARENAS)}}
    with tempfile.TemporaryDirectory(prefix="mokka-ctl-soak-") as tmp:
        work = Path(tmp)
        daemons = {label: nodes.start(work / f"node{i}", f"soak-{i}", work=work, environ=extra)
                   for i, (label, extra) in enumerate(setups.items())}
        try:
            nodes.wait_ready(list(daemons.values()), args.timeout)
            ready = {label: nodes.pss_kib(d.pid) / 1024 for label, d in daemons.items()}
            cpu = {label: nodes.cpu_seconds(d.pid) for label, d in daemons.items()}
            walls: dict[str, list[float]] = {label: [] for label in daemons}
            marks: dict[str, list[tuple[int, float]]] = {label: [] for label in daemons}
            fifth = max(1, args.changes // 5)
            for call in range(args.changes):
                # each call's order reversed from the last: a call made while the
                # other daemon converges its change waits for the CPU, alike for both
                order = list(daemons.items())[::1 if call % 2 else -1]
                for label, daemon in order:
                    daemon.check_alive()
                    wall, _cpu = nodes.timed_process(ctl_argv(daemon.root, call),
                                                     env=nodes.env(), timeout=args.timeout)
                    walls[label].append(wall)
                    if (call + 1) % fifth == 0:
                        marks[label].append((call + 1, nodes.pss_kib(daemon.pid) / 1024))
            settle(list(daemons.values()), args.timeout)
            print(f"{args.changes} ctl changes per daemon ({os.cpu_count()} CPUs)")
            for label, daemon in daemons.items():
                spent = nodes.cpu_seconds(daemon.pid) - cpu[label]
                report(BENCH, f"{label}: PSS when ready", ready[label], "MiB")
                for call, pss in marks[label]:
                    report(BENCH, f"{label}: PSS after {call} changes", pss, "MiB",
                           floor=ready[label], floor_name="when ready")
                report(BENCH, f"{label}: daemon CPU per change", spent / args.changes * 1000,
                       "ms")
                report(BENCH, f"{label}: mokka ctl wall, p50",
                       statistics.median(walls[label]) * 1000, "ms")
        finally:
            outcomes = nodes.stop(list(daemons.values()), args.timeout)
        left = {label: nodes.files_left(d.root) for label, d in daemons.items()}
        print(f"  exit codes {[code for code, _ in outcomes.values()]}, files left {left}")
        return 0 if all(code == 0 for code, _ in outcomes.values()) and not any(
            left.values()) else 1


def settle(daemons: list[nodes.Daemon], timeout: float) -> None:
    """Until each daemon's last pass is an ``ok`` one and its log has been quiet for a second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        texts = [d.log_text() for d in daemons]
        time.sleep(1.0)
        if texts == [d.log_text() for d in daemons] and all(
                nodes.PASS_OK.findall(t) for t in texts):
            return
    sys.exit("the daemons did not settle after the last change")


if __name__ == "__main__":
    sys.exit(main())
