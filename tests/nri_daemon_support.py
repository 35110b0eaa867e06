"""The nri simulator in a process of its own, for the real-containerd tests (no tests here).

``python -m tests.nri_daemon_support SOCKET ROOT [--ambient]`` stages and
runs ``NriSimulator`` for the built-in h100 profile (``node-a``) on the node
root ``ROOT``, connected to ``SOCKET``, until SIGTERM: the simulator as the
daemon's supervisor runs it, without the rest of the daemon (the node is
staged beforehand by ``tests.containerd_support.stage_node``).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

import trio

from mokka.host import Host
from mokka.simulators.nri import NriSettings, NriSimulator
from mokka.state.compile import compile_profile


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("socket", type=Path)
    parser.add_argument("root", type=Path)
    parser.add_argument("--ambient", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stdout, force=True)
    state = compile_profile("h100", node_name="node-a", generation=1)
    host = Host(args.root)
    # The test's containerd sees the node's files at their node paths.
    sim = NriSimulator(settings=NriSettings(socket=args.socket, ambient=args.ambient))

    async def serve() -> None:
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                await sim.stage(host, state)
                await nursery.start(sim.run, host, state)
                async for _ in signals:
                    nursery.cancel_scope.cancel(reason="SIGTERM")
                    break

    trio.run(serve)
    print("nri daemon: stopped", flush=True)


if __name__ == "__main__":
    main()
