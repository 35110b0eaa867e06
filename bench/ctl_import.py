"""``mokka ctl``: what starting one costs, and which imports it goes to.

Run: ``.venv/bin/python bench/ctl_import.py [--runs 21] [--importtime]``.

A fault drill calls ``mokka ctl`` once per change, so the process itself
(interpreter start, imports, argument parsing, reading the engine config to
check ``--gpu``) is the cost a person or a script waits for.  Measured, on a
scratch node root holding an h100 engine config (eight GPUs, as the daemon
stages it):

* ``python -c pass``: the floor (starting this interpreter at all);
* ``python -c 'import argparse, json'``: the libraries floor, what any
  verb must load before it runs a line of its own (the command line is
  argparse's, the overrides file JSON); each verb's CPU time is also given
  against it, the share that is Mokka's own;
* ``mokka ctl status``, ``temp --gpu 0``, ``temp --gpu <UUID>``, ``xid``
  and ``--help``, each as ``python -m mokka ctl ...`` (what the ``mokka``
  console script runs), on a node whose overrides file an earlier call
  recorded (``mokka.ctl.records``: every call but the first after the
  agent's start);
* ``temp --gpu 0`` as the first call after the agent's start: the file and
  its lock not yet recorded (the agent's reset, ``Host.discard`` of both
  owners, runs unmeasured before each), so the call records them through
  ``Host`` and loads its bookkeeping;
* ``mokka fabricmanager-ctl -q``, the other command a script or probe
  calls per question (the same goal: it reads one file).

Each figure is the median over ``--runs`` processes of the wall time and of
the CPU time (user + system, from the child's resource usage): on a busy
machine the CPU time is the steadier figure, and the ratio to the floor's
the one to read.  The goal is 80 ms of wall time on an idle machine.

Bytecode is cached as an installed package's would be: the processes get a
private ``PYTHONPYCACHEPREFIX`` (warmed by one unmeasured run of each) and
``PYTHONDONTWRITEBYTECODE`` unset, so a development environment that turns
bytecode off does not bill compiling every module to every call.

``--importtime``: also prints the modules ``python -X importtime`` shows
taking longest (cumulative) in ``mokka ctl status``, the first place to
look when the figure grows.  Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import nodes
from figures import report

from mokka.layout import CONFIG_DIR, ENGINE_CONFIG, FABRIC_READY_MARKER
from mokka.noderoot.host import Host
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state.compile import compile_profile
from mokka.state.overrides import MANIFEST_OWNERS

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--runs", "5"]
GOAL = "<= 80 ms"
#: The libraries floor's name (see the module docstring).
LIBRARIES = "python + argparse, json"
#: The first writing call after the agent's start (see the module docstring).
FIRST = "mokka ctl temp --gpu 0, first call"
#: Wall time of one process beyond which something is wrong, not slow.
PROCESS_TIMEOUT = 60.0


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of one process (``nodes.timed_process``)."""
    return nodes.timed_process(cmd, env=env, timeout=PROCESS_TIMEOUT)


def scratch_node(root: Path) -> str:
    """A node root as a staged daemon leaves it (engine config, fabric manager
    marker: ``fabricmanager-ctl -q`` answers READY, exit 0); a GPU's UUID."""
    state = compile_profile("h100", node_name="bench-node")
    (root / CONFIG_DIR.lstrip("/")).mkdir(parents=True)
    (root / ENGINE_CONFIG.lstrip("/")).write_text(render_engine_config(state))
    marker = root / FABRIC_READY_MARKER.lstrip("/")
    marker.parent.mkdir(parents=True)
    marker.touch()
    return state.gpus[3].uuid


def unrecord(root: Path) -> None:
    """What the agent does at start: the overrides file, its lock and their records go."""
    host = Host(root)
    for owner in MANIFEST_OWNERS:
        host.discard(owner)


def importtime(env: dict[str, str], ctl: list[str], top: int) -> None:
    done = subprocess.run([sys.executable, "-X", "importtime", *ctl], env=env,
                          capture_output=True, text=True, check=True, timeout=PROCESS_TIMEOUT)
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        # "import time:  self [us] | cumulative | name", the name indented by depth
        self_us, cumulative_us, name = line[len("import time:"):].split("|", 2)
        rows.append((int(cumulative_us), int(self_us), name.strip()))
    print(f"\n  python -X importtime {' '.join(ctl)}: the {top} largest (cumulative, us)")
    for cumulative, own, name in sorted(rows, reverse=True)[:top]:
        print(f"    {cumulative:>8}  {own:>8}  {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="processes per figure (median)")
    parser.add_argument("--importtime", action="store_true",
                        help="also list the slowest imports of `mokka ctl status`")
    parser.add_argument("--top", type=int, default=20, help="imports listed with --importtime")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mokka-ctl-import-") as tmp:
        root = Path(tmp) / "node"
        uuid = scratch_node(root)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        # no daemon holds the scratch root: a write says so and would exit 3
        env["MOKKA_CTL_NO_DAEMON_OK"] = "1"
        ctl = ["-m", "mokka", "ctl"]
        where = ["--root", str(root)]
        cases = {
            "python -c pass": ["-c", "pass"],
            LIBRARIES: ["-c", "import argparse, json"],
            "mokka ctl status": [*ctl, "status", *where],
            "mokka ctl temp --gpu 0": [*ctl, "temp", *where, "--gpu", "0", "--celsius", "70"],
            FIRST: [*ctl, "temp", *where, "--gpu", "0", "--celsius", "72"],
            "mokka ctl temp --gpu UUID": [*ctl, "temp", *where, "--gpu", uuid, "--celsius", "71"],
            "mokka ctl xid": [*ctl, "xid", *where, "--gpu", "1", "--code", "79"],
            "mokka ctl --help": [*ctl, "--help"],
            "mokka fabricmanager-ctl -q": ["-m", "mokka", "fabricmanager-ctl", "-q", *where],
        }
        for name, case in cases.items():  # compile and cache the bytecode, unmeasured
            if name == FIRST:
                unrecord(root)
            timed([sys.executable, *case], env)
        print(f"mokka ctl process cost: median of {args.runs} runs each "
              f"({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        # interleaved, so a burst of load elsewhere hits every case alike
        for _ in range(args.runs):
            for name, case in cases.items():
                if name == FIRST:
                    unrecord(root)
                samples[name].append(timed([sys.executable, *case], env))
        floor_wall = statistics.median(w for w, _ in samples["python -c pass"]) * 1000
        floor_cpu = statistics.median(c for _, c in samples["python -c pass"]) * 1000
        report("ctl_import", "python -c pass (wall)", floor_wall, "ms")
        report("ctl_import", "python -c pass (CPU)", floor_cpu, "ms")
        libraries_cpu = statistics.median(c for _, c in samples[LIBRARIES]) * 1000
        report("ctl_import", f"{LIBRARIES} (CPU)", libraries_cpu, "ms", floor=floor_cpu,
               floor_name="python -c pass")
        for name in list(cases)[2:]:
            wall = statistics.median(w for w, _ in samples[name]) * 1000
            cpu = statistics.median(c for _, c in samples[name]) * 1000
            report("ctl_import", f"{name} (wall)", wall, "ms", floor=floor_wall,
                   floor_name="python -c pass", goal=GOAL)
            report("ctl_import", f"{name} (CPU)", cpu, "ms", floor=floor_cpu,
                   floor_name="python -c pass")
            report("ctl_import", f"{name} (CPU, vs libraries)", cpu, "ms", floor=libraries_cpu,
                   floor_name="the libraries")
        if args.importtime:
            importtime(env, cases["mokka ctl status"], args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
