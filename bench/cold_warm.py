"""A whole node's pass against the filesystem: cold ``--once`` and the warm repair pass.

Run: ``.venv/bin/python bench/cold_warm.py [--scenario h100 gb200-imex] [--rounds 5]``.

For each scenario, every round on a fresh scratch root:

* **cold**: the ``mokka daemon --once`` process, from exec to exit, on an
  empty root (what a node's first start costs, interpreter start included);
  floor: ``tar -x`` of the very tree it wrote, into an empty directory (the
  archive is made once per scenario, so the floor extracts the same paths,
  bytes, links and device nodes); beside it, the **stack floor**: a
  ``python -c "import trio, attrs, yaml"`` process (this interpreter
  starting and importing the libraries every pass needs, no code of
  ours), which shows how much of the cold figure no change to the daemon
  can remove;
* **warm**: the in-process repair pass (``Reconciler.reconcile_once`` of the
  same state on the converged root: what the periodic resync does when
  nothing changed), the median of passes 2..N of a fresh simulator set (the
  first, a restarted daemon's pass, is shown apart); floor: ``tar -c`` of
  the tree into a pipe (every file read, every inode stat'ed);
* **drift check**: the CPU time (this process, every thread) of one repair
  pass once the node has settled (passes 3..N: the second makes a retract
  whose specs a later call published) with nothing changed on the node:
  what each ``--resync-interval`` costs an idle daemon; floor: the CPU
  time of the ``tar -c`` above (its child rusage), which stats and reads
  every file once.  Measured twice: with every record checked by
  ``lstat`` (``Host`` without a drift watch), then as the daemon runs it,
  with inotify vouching for the records (``Host.watch_for_drift``; two
  passes to put the watches in place, then the same number measured);
* teardown (revoke + discard) ends the round; then a **cold pass
  in-process**: a fresh host and simulator set make the first pass on the
  emptied root inside this process (the interpreter started, everything
  imported, the profile compiled), which is the cold figure without the
  process, against the same ``tar -x`` floor; torn down again, the root
  must end empty.

Scenarios: ``h100`` (the built-in profile, 8 GPUs) and ``gb200-imex``
(gb200, a topology document naming the node, 2,048 IMEX channels).
The floors are measured in the same run, on the same disk, so the ratios
hold on a busy machine where the absolute times do not.
"""

from __future__ import annotations

import argparse
import logging
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nodes
import trio
from figures import report

from mokka import cli
from mokka.daemon.command import build_simulators
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.teardown import teardown
from mokka.noderoot.host import Host
from mokka.state.compile import compile_profile
from mokka.state.model import State

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--rounds", "1", "--warm-passes", "3"]

NODE = "bench-node"
TOPOLOGY = f"""\
version: 1
domains:
  - name: bench
    uuid: 00000000-0000-0000-0000-0000000000be
    cliques:
      - id: 1
        nodes: [{NODE}]
"""
SCENARIOS = {
    "h100": ("h100", False),
    "gb200-imex": ("gb200", True),
}


def daemon_args(root: Path, profile: str, topology: Path | None) -> list[str]:
    args = ["--root", str(root), "--profile", profile, "--node-name", NODE,
            "--health-addr", "127.0.0.1:0"]
    if topology:
        args += ["--topology", str(topology), "--imex", "on", "--imex-channels", "2048"]
    return args


def cold_once(root: Path, args: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run([*nodes.mokka_command(), "daemon", "--once", *args],
                          capture_output=True, text=True, env=nodes.env(), timeout=600)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"--once failed ({done.returncode}):\n{done.stdout[-3000:]}"
                         f"{done.stderr[-3000:]}")
    return elapsed


def tar_x(archive: Path, scratch: Path) -> float:
    target = scratch / "untar"
    nodes.remove(target)
    target.mkdir()
    elapsed, _cpu = nodes.timed_process(
        ["tar", "-x", "--numeric-owner", "-f", str(archive), "-C", str(target)], timeout=600)
    nodes.remove(target)
    return elapsed


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tar_c(root: Path) -> tuple[float, float]:
    """Read the whole tree as tar does into a pipe (a file, not /dev/null, which tar skips).

    (wall seconds, CPU seconds of the tar process)."""
    cpu = children_cpu()
    started = time.perf_counter()
    with subprocess.Popen(["tar", "-c", "-f", "-", "-C", str(root), "."],
                          stdout=subprocess.PIPE) as tar:
        while tar.stdout.read(1 << 20):
            pass
    elapsed = time.perf_counter() - started
    if tar.returncode != 0:
        raise SystemExit(f"tar -c of {root} failed")
    return elapsed, children_cpu() - cpu


async def warm_passes(root: Path, args: list[str], profile: str, topology: Path | None,
                      passes: int) -> tuple[list[float], list[float], list[float], float, float]:
    """(seconds of each repair pass, CPU seconds of each, CPU seconds of each settled pass
    with the drift watch, teardown seconds, seconds of a cold pass in this process) with a
    fresh simulator set."""
    parsed = cli.build_parser().parse_args(["daemon", *args])
    simulators = build_simulators(parsed)
    host = Host(root)
    state = compile_profile(profile, node_name=NODE, topology=topology)
    reconciler = Reconciler(host, simulators, supervisor=None)
    samples, cpu = [], []
    for _ in range(passes):
        started, cpu_started = time.perf_counter(), time.process_time()
        result = await reconciler.reconcile_once(state)
        samples.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
        if not result.ok:
            raise SystemExit(result.summary())
    host.watch_for_drift()
    watched = []
    for n in range(passes + 2):
        cpu_started = time.process_time()
        await reconciler.reconcile_once(state)
        if n >= 2:
            watched.append(time.process_time() - cpu_started)
    host.stop_watching_for_drift()
    started = time.perf_counter()
    outcome = await teardown(host, simulators, timeout=120)
    if not outcome.clean:
        raise SystemExit(f"teardown failed: {outcome.failures}")
    down = time.perf_counter() - started
    return samples, cpu, watched, down, await cold_in_process(root, args, state)


async def cold_in_process(root: Path, args: list[str], state: State) -> float:
    """Seconds of a first pass on the emptied root by a fresh host and simulator set in
    this process (imports done, profile compiled): the pass itself, without the process."""
    simulators = build_simulators(cli.build_parser().parse_args(["daemon", *args]))
    host = Host(root)
    started = time.perf_counter()
    result = await Reconciler(host, simulators, supervisor=None).reconcile_once(state)
    elapsed = time.perf_counter() - started
    if not result.ok:
        raise SystemExit(result.summary())
    outcome = await teardown(host, simulators, timeout=120)
    if not outcome.clean:
        raise SystemExit(f"teardown failed: {outcome.failures}")
    return elapsed


def run_scenario(name: str, rounds: int, passes: int, scratch_dir: str | None) -> None:
    profile, with_topology = SCENARIOS[name]
    figures: dict[str, list[float]] = {k: [] for k in (
        "cold", "stack", "tar -x", "restart", "warm", "tar -c", "tar -c cpu", "drift check",
        "drift check, inotify", "teardown", "cold pass")}
    paths = 0
    with tempfile.TemporaryDirectory(prefix="mokka-bench-cold-", dir=scratch_dir) as tmp:
        scratch = Path(tmp)
        topology = None
        if with_topology:
            topology = scratch / "topology.yaml"
            topology.write_text(TOPOLOGY)
        archive = scratch / "tree.tar"
        for _ in range(rounds):
            root = scratch / "node"
            root.mkdir()
            args = daemon_args(root, profile, topology)
            figures["cold"].append(cold_once(root, args))
            figures["stack"].append(nodes.timed_process(
                [sys.executable, "-c", "import trio, attrs, yaml"], timeout=60,
                env=nodes.env())[0])
            if not archive.exists():
                subprocess.run(["tar", "-c", "--numeric-owner", "-f", str(archive),
                                "-C", str(root), "."], check=True, timeout=600)
                paths = sum(1 for _ in root.rglob("*"))
            figures["tar -x"].append(tar_x(archive, scratch))
            wall, cpu = tar_c(root)
            figures["tar -c"].append(wall)
            figures["tar -c cpu"].append(cpu)
            samples, cpu, watched, down, cold_pass = trio.run(
                warm_passes, root, args, profile, topology, passes)
            figures["cold pass"].append(cold_pass)
            figures["restart"].append(samples[0])
            figures["warm"].extend(samples[1:])
            figures["drift check"].extend(cpu[2:])
            figures["drift check, inotify"].extend(watched)
            figures["teardown"].append(down)
            left = nodes.files_left(root)
            if left:
                raise SystemExit(f"teardown left {left} path(s) under {root}")
            root.rmdir()
    ms = {k: statistics.median(v) * 1000 for k, v in figures.items() if v}
    bench = "cold_warm"
    print(f"{name}: {paths:,} paths, {rounds} round(s), {passes} in-process passes each")
    report(bench, f"{name} cold --once process", ms["cold"], "ms",
           floor=ms["tar -x"], floor_name="tar -x", goal="<= 3x floor")
    report(bench, f"{name} stack floor: python -c 'import trio, attrs, yaml'", ms["stack"],
           "ms", floor=ms["tar -x"], floor_name="tar -x")
    report(bench, f"{name} cold pass in-process (the pass without the process)",
           ms["cold pass"], "ms", floor=ms["tar -x"], floor_name="tar -x")
    report(bench, f"{name} first pass of a restarted daemon", ms["restart"], "ms",
           floor=ms["tar -c"], floor_name="tar -c")
    if "warm" in ms:
        report(bench, f"{name} warm repair pass", ms["warm"], "ms",
               floor=ms["tar -c"], floor_name="tar -c", goal="<= 2x floor")
    if "drift check" in ms:
        report(bench, f"{name} drift check (repair pass CPU), every record by lstat",
               ms["drift check"], "ms", floor=ms["tar -c cpu"], floor_name="tar -c CPU")
        report(bench, f"{name} drift check (repair pass CPU), the daemon's: inotify",
               ms["drift check, inotify"], "ms", floor=ms["tar -c cpu"],
               floor_name="tar -c CPU", goal="<= 5 ms")
    report(bench, f"{name} teardown (revoke + discard)", ms["teardown"], "ms",
           floor=ms["tar -x"], floor_name="tar -x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", nargs="+", choices=sorted(SCENARIOS),
                        default=list(SCENARIOS))
    parser.add_argument("--rounds", type=int, default=5, help="cold runs per scenario")
    parser.add_argument("--warm-passes", type=int, default=6,
                        help="in-process passes per round (the first is a restart's)")
    parser.add_argument("--scratch", metavar="DIR",
                        help="where the roots and the floors' trees go (default: the temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the figures, not the simulators' notes
    nodes.warm_bytecode()
    for name in args.scenario:
        run_scenario(name, args.rounds, max(args.warm_passes, 1), args.scratch)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
