"""``mokka ctl``: what one call costs, and how soon its change is seen.

Run: ``.venv/bin/python bench/ctl_latency.py [--rounds 30]``.

1. **Process**: wall time of a ``mokka ctl`` process (``status`` and
   ``temp``) against ``python -c pass`` with the same interpreter (the
   floor: starting Python at all).
2. **ctl temp -> NVML**: a daemon (built-in h100) runs on a scratch root;
   this process loads the node's own mock ``libnvidia-ml.so.1`` (from the
   driver root, so it reads the node's engine config) with ctypes and polls
   ``nvmlDeviceGetTemperature`` every millisecond.  Each round pins a new
   temperature with ``mokka ctl temp`` and times from the moment ctl
   returned until NVML answers the new value (and, apart, from ctl's start).
3. **ctl fail --xid -> kernel log**: ``mokka ctl fail --mode
   fallen_off_bus --xid 79`` on another GPU; time from ctl's return until
   the Xid record is in ``<root>/dev/kmsg`` (the scratch root's regular-file
   kernel log).  Rounds are spaced so that the kernel log's rate limit (10
   records per 5 s) never holds a record back: that wait would be the rate
   limit's, not the daemon's.

Prints p50/p95/p99 of each; asserts nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nodes
from figures import percentile, report

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--rounds", "5"]

BENCH = "ctl_latency"
#: Spacing of Xid rounds: the kernel log passes 10 records per 5 s window.
XID_SPACING = 0.6
#: A sample that takes longer than this is reported as lost.
SAMPLE_TIMEOUT = 30.0


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env=nodes.env(), timeout=120)
    return time.perf_counter() - started


def process_cost(root: Path, rounds: int) -> None:
    ctl = [*nodes.mokka_command(), "ctl", "--root", str(root)]
    floor = [timed([sys.executable, "-c", "pass"]) for _ in range(rounds)]
    status = [timed([*ctl, "status"]) for _ in range(rounds)]
    temp = [timed([*ctl, "temp", "--gpu", "3", "--celsius", str(40 + i % 30)])
            for i in range(rounds)]
    f = statistics.median(floor) * 1000
    report(BENCH, "mokka ctl status process (median)", statistics.median(status) * 1000, "ms",
           floor=f, floor_name="python -c pass", goal="<= 80 ms")
    report(BENCH, "mokka ctl temp process (median)", statistics.median(temp) * 1000, "ms",
           floor=f, floor_name="python -c pass", goal="<= 80 ms")


class Nvml:
    """The node's mock NVML library, loaded in this process."""

    def __init__(self, root: Path) -> None:
        found = sorted(root.glob("var/lib/nvml-mock/driver/usr/lib*/libnvidia-ml.so.1"))
        if not found:
            raise SystemExit(f"no libnvidia-ml.so.1 in the driver root under {root}")
        self.lib = ctypes.CDLL(str(found[0]))
        if self.lib.nvmlInit_v2() != 0:
            raise SystemExit(f"nvmlInit_v2 failed with {found[0]}")
        self.handles = {}

    def temperature(self, index: int) -> int | None:
        if index not in self.handles:
            handle = ctypes.c_void_p()
            self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle))
            self.handles[index] = handle
        value = ctypes.c_uint()
        code = self.lib.nvmlDeviceGetTemperature(self.handles[index], 0, ctypes.byref(value))
        return value.value if code == 0 else None


def wait_until(predicate, timeout: float = SAMPLE_TIMEOUT, poll: float = 0.001) -> float | None:
    """perf_counter when ``predicate()`` first held, None after ``timeout``."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if predicate():
            return time.perf_counter()
        time.sleep(poll)
    return None


def summarize(figure: str, samples: list[float], lost: int, goal: str) -> None:
    ms = [s * 1000 for s in samples]
    note = f" ({lost} lost)" if lost else ""
    report(BENCH, f"{figure} p50{note}", percentile(ms, 50), "ms")
    report(BENCH, f"{figure} p95", percentile(ms, 95), "ms")
    report(BENCH, f"{figure} p99", percentile(ms, 99), "ms", goal=goal)


def temp_to_nvml(root: Path, rounds: int) -> None:
    nvml = Nvml(root)
    ctl = [*nodes.mokka_command(), "ctl", "--root", str(root), "temp", "--gpu", "0"]
    after_return, from_start, lost = [], [], 0
    for i in range(rounds):
        celsius = 41 + i % 40
        if nvml.temperature(0) == celsius:
            celsius += 40
        started = time.perf_counter()
        subprocess.run([*ctl, "--celsius", str(celsius)], check=True, capture_output=True,
                       env=nodes.env(), timeout=120)
        returned = time.perf_counter()
        seen = wait_until(lambda c=celsius: nvml.temperature(0) == c)
        if seen is None:
            lost += 1
            continue
        after_return.append(max(seen - returned, 0.0))
        from_start.append(seen - started)
    summarize("ctl temp -> NVML, after ctl returned", after_return, lost, "<= 100 ms")
    summarize("ctl temp -> NVML, from ctl start", from_start, 0, "")


def xid_records(kmsg: Path) -> int:
    try:
        return kmsg.read_text(errors="replace").count("Xid (")
    except FileNotFoundError:
        return 0


def xid_to_kmsg(root: Path, rounds: int) -> None:
    kmsg = root / "dev" / "kmsg"
    ctl = [*nodes.mokka_command(), "ctl", "--root", str(root), "fail", "--gpu", "1",
           "--mode", "fallen_off_bus", "--xid", "79"]
    samples, lost, last = [], 0, 0.0
    for _ in range(rounds):
        time.sleep(max(0.0, last + XID_SPACING - time.perf_counter()))
        before = xid_records(kmsg)
        subprocess.run(ctl, check=True, capture_output=True, env=nodes.env(), timeout=120)
        returned = time.perf_counter()
        seen = wait_until(lambda b=before: xid_records(kmsg) > b)
        last = seen or time.perf_counter()
        if seen is None:
            lost += 1
            continue
        samples.append(max(seen - returned, 0.0))
    summarize("ctl fail --xid 79 -> kernel log", samples, lost, "<= 100 ms")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    nodes.warm_bytecode()
    with tempfile.TemporaryDirectory(prefix="mokka-bench-ctl-") as tmp:
        daemon = nodes.start(Path(tmp) / "node", "bench-ctl")
        try:
            nodes.wait_ready([daemon], timeout=600)
            process_cost(daemon.root, args.rounds)
            temp_to_nvml(daemon.root, args.rounds)
            xid_to_kmsg(daemon.root, args.rounds)
        finally:
            nodes.stop([daemon], timeout=120)


if __name__ == "__main__":
    main()
