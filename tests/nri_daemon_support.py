"""The nri simulator in a process of its own, for the real-containerd tests (no tests here).

``python -m tests.nri_daemon_support SOCKET ROOT [--ambient] [--sys-devices]``
stages and runs ``NriSimulator`` for the built-in h100 profile (``node-a``)
on the node root ``ROOT``, connected to ``SOCKET``, until SIGTERM, then
discards what it staged: the simulator as the daemon's supervisor runs it,
without the rest of the daemon (the node is staged beforehand by
``tests.containerd_support.stage_node``).

``NriDaemonProcess`` starts it from a test or a benchmark, as
``tests.nri_support.PluginProcess`` starts the bare plugin.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import attrs
import trio

from mokka.noderoot.host import Host
from mokka.simulators.nri import NriSettings, NriSimulator
from mokka.state.compile import compile_profile
from tests.nri_support import PluginProcess, serve_until_sigterm


@attrs.define(eq=False)
class NriDaemonProcess(PluginProcess):
    """``python -m tests.nri_daemon_support`` instead of the bare plugin (``args``: ROOT)."""

    def command(self) -> list[str]:
        return [sys.executable, "-u", "-m", "tests.nri_daemon_support",
                str(self.socket), *self.args]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("socket", type=Path)
    parser.add_argument("root", type=Path)
    parser.add_argument("--ambient", action="store_true")
    parser.add_argument("--sys-devices", action="store_true")
    args = parser.parse_args()
    state = compile_profile("h100", node_name="node-a", generation=1)
    host = Host(args.root)
    # The test's containerd sees the node's files at their node paths.
    sim = NriSimulator(settings=NriSettings(socket=args.socket, ambient=args.ambient,
                                            sys_devices=args.sys_devices))

    async def start(nursery: trio.Nursery) -> None:
        await sim.stage(host, state)
        await nursery.start(sim.run, host, state)

    serve_until_sigterm(start)
    trio.run(sim.discard, host)
    print("nri daemon: stopped", flush=True)


if __name__ == "__main__":
    main()
