"""Wake-ups of an idle mock-ib daemon: alone, and in a fabric with a peer.

Run: ``.venv/bin/python bench/ib_idle.py [--seconds 10] [--nodes 2]``.

Each measured node is a child process that stages the ib simulator on a
scratch root and runs its daemon (``IbSimulator.run``: the umad socket and,
in a fabric, the relay on loopback), then idles.  A baseline child runs an
empty trio loop.  Over the window the parent reads every thread's context
switches (``/proc/<pid>/task/*/status``) and CPU time, and prints them per
second.  An idle daemon should match the baseline: it waits in ``accept``,
``recv`` and on its reload event, with no timer of its own.  A last row
measures the same fabric while a tool sends MADs (``perfquery`` on the
peer's LID in a loop), for scale: wake-ups there come from the traffic.

Needs the package's native build (``libmockfs.so``, ``libumadshim.so``) and,
for the traffic row, the machine's ``perfquery`` (infiniband-diags).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
import yaml

from mokka import layout
from mokka.noderoot.host import Host
from mokka.simulators.ib import IbSettings, IbSimulator, lids
from mokka.simulators.pcibus import PcibusSimulator
from mokka.state.compile import compile_profile

#: The fabric's shared relay key, written beside the nodes' roots.
RELAY_KEY = "relay.key"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def serve(root: Path, node: str, topology: Path | None, ports: dict[str, int]) -> None:
    """Child: stage one node and run its daemon until killed."""
    state = compile_profile("gb200", node_name=node, topology=topology)
    host = Host(root)
    await PcibusSimulator().stage(host, state)
    peers = [f"{name}=127.0.0.1:{port}" for name, port in ports.items()]
    # every node of the fabric holds the key the parent wrote beside the roots
    # (the relay refuses to run without one)
    sim = IbSimulator(IbSettings(relay_address="127.0.0.1", relay_port=ports.get(node, 0),
                                 peers=peers, relay_key_file=root.parent / RELAY_KEY))
    await sim.stage(host, state)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        print("ready", flush=True)
        await trio.sleep_forever()


async def baseline() -> None:
    print("ready", flush=True)
    await trio.sleep_forever()


def switches(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(args: list[str]) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "ready":
        process.kill()
        raise SystemExit(f"child {args} did not start")
    return process


def measure(pids: list[int], seconds: float) -> tuple[float, float]:
    """(context switches per second, CPU ms per second) summed over ``pids``."""
    s0, c0 = sum(map(switches, pids)), sum(map(cpu_seconds, pids))
    time.sleep(seconds)
    s1, c1 = sum(map(switches, pids)), sum(map(cpu_seconds, pids))
    return (s1 - s0) / seconds, (c1 - c0) * 1000 / seconds


def main(seconds: float, nodes: int) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = start(["--baseline"])
        try:
            rows.append(("baseline (empty trio loop)", *measure([base.pid], seconds)))
        finally:
            base.kill()
            base.wait()

        alone_root = Path(tmp) / "alone"
        alone_root.mkdir()
        alone = start(["--serve", str(alone_root), "solo"])
        try:
            time.sleep(1)  # let start-up's thread workers settle
            rows.append(("one node, no fabric", *measure([alone.pid], seconds)))
        finally:
            alone.terminate()
            alone.wait()

        names = [f"bench-{i}" for i in range(nodes)]
        topology = Path(tmp) / "topology.yaml"
        topology.write_text(yaml.safe_dump({"version": 1, "domains": [{
            "name": "bench", "uuid": "00000000-0000-0000-0000-0000000000be",
            "cliques": [{"id": 0, "nodes": names}]}]}))
        ports = {name: free_port() for name in names}
        (Path(tmp) / RELAY_KEY).write_text(secrets.token_hex(32) + "\n")
        port_args = [f"{n}={p}" for n, p in ports.items()]
        children = []
        try:
            for name in names:
                root = Path(tmp) / name
                root.mkdir()
                children.append(start(["--serve", str(root), name, "--topology", str(topology),
                                       "--ports", *port_args]))
            time.sleep(2)  # the relays dial each other
            pids = [c.pid for c in children]
            rows.append((f"{nodes}-node fabric, idle (all daemons)", *measure(pids, seconds)))
            perfquery = shutil.which("perfquery")
            wrapper = Path(tmp) / names[0] / layout.DRIVER_BIN.lstrip("/") / "perfquery"
            if perfquery and wrapper.exists():
                stop = time.monotonic() + seconds
                count = 0
                s0 = sum(map(switches, pids))
                c0 = sum(map(cpu_seconds, pids))
                start_time = time.monotonic()
                while time.monotonic() < stop:
                    subprocess.run([str(wrapper), "-t", "500", str(lids.hca_lid(1, 0)), "1"],
                                   capture_output=True, check=False, timeout=30)
                    count += 1
                spent = time.monotonic() - start_time
                s1, c1 = sum(map(switches, pids)), sum(map(cpu_seconds, pids))
                rows.append((f"same, perfquery of a peer LID ({count / spent:.0f}/s)",
                             (s1 - s0) / spent, (c1 - c0) * 1000 / spent))
        finally:
            for child in children:
                child.terminate()
            for child in children:
                child.wait()
    width = max(len(r[0]) for r in rows)
    print(f"{'':{width}}  wake-ups/s  CPU ms/s")
    for name, wakeups, cpu in rows:
        print(f"{name:{width}}  {wakeups:10.1f}  {cpu:8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve", nargs=2, metavar=("ROOT", "NODE"), help=argparse.SUPPRESS)
    parser.add_argument("--topology", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ports", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline:
        trio.run(baseline)
    elif args.serve:
        ports = {k: int(v) for k, v in (item.split("=") for item in args.ports)}
        trio.run(serve, Path(args.serve[0]), args.serve[1], args.topology, ports)
    else:
        main(args.seconds, args.nodes)
