"""A profile edit on a running daemon until the node has converged: 8 <-> 4 GPUs.

Run: ``.venv/bin/python bench/profile_change.py [--rounds 20]``.

A daemon runs on a scratch root with a profile file (the built-in h100, 8
GPUs).  Each round saves the other variant (the first four GPUs and their
PCIe root, or all eight again) the way an editor does (a temp file renamed
over the profile) and times from the rename until the daemon's log says
``reconcile pass ok generation=N`` for the new generation (the log line's
own timestamp, so reading the log adds nothing), then checks the driver
root has the expected number of GPU device nodes.

* **single**: one change at a time, the node idle before it;
* **back-to-back**: a second change saved the moment the daemon has taken
  the first (its ``desired state generation N`` line is logged), so it
  arrives while the first pass runs; timed from the second save until the
  second generation has converged.

Floors, measured in the same run: inotify delivery, a rename in a watched
directory until the event is read (mokka's own ``Inotify``); and the change
itself by bare syscalls (``fsfloor.apply_change``): the paths the node gains
or loses between 8 and 4 GPUs, removed and written in a copy of the tree
beside the daemon's root, after each single change.  The second says what
the disk costs for the change where the root is: on a busy or ageing
filesystem it is most of the figure (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import fsfloor
import nodes
import trio
from figures import percentile, report

from mokka.layout import MOKKA_STATE_DIR
from mokka.state.sources.inotify import Inotify

sys.path.insert(0, str(nodes.REPO))  # the 4-GPU cut is the reload tests' own helper

from tests.test_daemon_reload import four_gpu_profile

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--rounds", "4"]

BENCH = "profile_change"
DEV = "var/lib/nvml-mock/driver/dev"
SAMPLE_TIMEOUT = 120.0


def gpu_nodes(root: Path) -> int:
    return sum(1 for p in (root / DEV).glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name))


def profile_variants() -> list[tuple[str, int]]:
    """(profile text, GPUs) of the two profiles a change alternates between: the
    first four GPUs of the built-in h100 and their PCIe root, then all eight."""
    eight = (importlib.resources.files("mokka.state") / "profiles" / "h100.yaml").read_text()
    return [(four_gpu_profile(eight), 4), (eight, 8)]


def start_on_profile(work: Path, name: str, text: str) -> tuple[nodes.Daemon, Path]:
    """A daemon on ``work/node`` reading the profile file ``work/profile.yaml``,
    which holds ``text`` when it starts; the daemon and the profile's path."""
    profile = work / "profile.yaml"
    nodes.save_file(profile, text)
    return nodes.start(work / "node", name, "--profile", str(profile)), profile


def single_change(daemon: nodes.Daemon, profile: Path, text: str, generation: int) -> float:
    """Seconds from saving ``text`` over ``profile``, the node idle before, until
    the pass over ``generation`` (the one the save makes) completed."""
    time.sleep(0.2)  # the node idle before the change
    saved = nodes.save_file(profile, text)
    return nodes.wait_pass([daemon], generation, SAMPLE_TIMEOUT)[daemon.name] - saved


async def inotify_floor(rounds: int) -> list[float]:
    samples = []
    with tempfile.TemporaryDirectory() as tmp, Inotify.open() as watch:
        watch.add_watch(tmp)
        for i in range(rounds):
            part = Path(tmp) / ".f.swp"
            part.write_text(str(i))
            started = time.perf_counter()
            os.rename(part, Path(tmp) / "f")
            await watch.read_events()
            samples.append(time.perf_counter() - started)
    return samples


def node_tree(root: Path) -> list[fsfloor.Entry]:
    """The node's tree as ``fsfloor`` reads it, without the daemon's own bookkeeping."""
    private = MOKKA_STATE_DIR.strip("/")
    return [e for e in fsfloor.read_tree(root)
            if e[0] != private and not e[0].startswith(private + "/")]


def wait_log(daemon: nodes.Daemon, pattern: str, timeout: float = SAMPLE_TIMEOUT) -> None:
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while not regex.search(daemon.log_text()):
        daemon.check_alive()
        if time.monotonic() > deadline:
            raise SystemExit(f"{daemon.name} never logged {pattern!r}")
        time.sleep(0.001)


def summarize(figure: str, samples: list[float], floor: float) -> None:
    ms = [s * 1000 for s in samples]
    report(BENCH, f"{figure} p50", percentile(ms, 50), "ms",
           floor=floor, floor_name="inotify delivery")
    report(BENCH, f"{figure} p99", percentile(ms, 99), "ms",
           floor=floor, floor_name="inotify delivery", goal="<= 100 ms")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20,
                        help="single changes (and as many back-to-back pairs)")
    args = parser.parse_args(argv)
    nodes.warm_bytecode()
    variants = profile_variants()
    floor = statistics.median(trio.run(inotify_floor, max(args.rounds, 20))) * 1000
    with tempfile.TemporaryDirectory(prefix="mokka-bench-profile-") as tmp:
        work = Path(tmp)
        daemon, profile = start_on_profile(work, "bench-profile", variants[1][0])
        try:
            nodes.wait_ready([daemon], timeout=600)
            generation = 1
            single, change_floor = [], []
            trees = {8: node_tree(daemon.root)}
            floor_root = work / "floor"  # beside the root: same disk, same neighbourhood
            floor_root.mkdir()
            fsfloor.write_tree(floor_root, trees[8])
            for i in range(args.rounds):
                text, gpus = variants[i % 2]
                generation += 1
                single.append(single_change(daemon, profile, text, generation))
                if gpu_nodes(daemon.root) != gpus:
                    raise SystemExit(f"generation {generation}: {gpu_nodes(daemon.root)} GPU "
                                     f"device nodes, expected {gpus}")
                trees.setdefault(gpus, node_tree(daemon.root))
                writes, removes = fsfloor.tree_change(trees[12 - gpus], trees[gpus])
                change_floor.append(fsfloor.apply_change(floor_root, writes, removes))
            pair, both = [], []
            # Each pair leaves the node as it found it: the other variant, then straight back.
            (first, _), (second, gpus) = variants[args.rounds % 2], variants[(args.rounds + 1) % 2]
            for _ in range(args.rounds):
                time.sleep(0.2)
                first_saved = nodes.save_file(profile, first)
                wait_log(daemon, rf"desired state generation {generation + 1} ")
                saved = nodes.save_file(profile, second)
                generation += 2
                done = nodes.wait_pass([daemon], generation, SAMPLE_TIMEOUT)[daemon.name]
                pair.append(done - saved)
                both.append(done - first_saved)
                if gpu_nodes(daemon.root) != gpus:
                    raise SystemExit(f"generation {generation}: {gpu_nodes(daemon.root)} GPU "
                                     f"device nodes, expected {gpus}")
        finally:
            nodes.stop([daemon], timeout=120)
    report(BENCH, "inotify delivery (median)", floor, "ms")
    summarize("8<->4 GPUs, single change -> converged", single, floor)
    floor_ms = statistics.median(change_floor) * 1000
    report(BENCH, "the same change by bare syscalls (median)", floor_ms, "ms")
    report(BENCH, "8<->4 GPUs, single change -> converged p50, against that",
           percentile([s * 1000 for s in single], 50), "ms",
           floor=floor_ms, floor_name="the change by bare syscalls")
    summarize("back-to-back, second change -> converged", pair, floor)
    summarize("back-to-back, first change -> both converged", both, floor)


if __name__ == "__main__":
    main()
