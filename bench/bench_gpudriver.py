"""How long the gpudriver simulator's Stage takes: cold, warm (nothing changed),
and its teardown, on a scratch node root.

Run: ``.venv/bin/python bench/bench_gpudriver.py [--profile h100] [--rounds 20]``.
Prints median and worst wall time per phase, and each phase's ratio to the
filesystem floor (the staged tree written again with bare syscalls in the
same run, ``fsfloor.write_floor``).  The library stand-in is 4 MiB of random
bytes, about the size of the built mock library with symbols, so the digest
comparison a warm stage does on it is part of the figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import trio
from fsfloor import read_tree, write_floor

from mokka.noderoot.host import Host
from mokka.simulators.gpudriver import GpuDriverSettings, GpuDriverSimulator
from mokka.state.compile import compile_profile

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--rounds", "3"]


async def one_round(state, settings: GpuDriverSettings) -> dict[str, float]:
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        host = Host(Path(tmp) / "node")
        host.root.mkdir()
        sim = GpuDriverSimulator(settings=settings)
        for phase, action in (
            ("cold stage", lambda: sim.stage(host, state)),
            ("warm stage", lambda: sim.stage(host, state)),
            ("apply (symlink)", lambda: sim.apply(host, state)),
            ("revoke", lambda: sim.revoke(host)),
            ("discard", lambda: sim.discard(host)),
        ):
            start = time.perf_counter()
            await action()
            figures[phase] = time.perf_counter() - start
            if phase == "warm stage":
                figures["floor"] = write_floor(read_tree(host.root))
    return figures


async def main(profile: str, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as native:
        (Path(native) / "libnvidia-ml.so.1").write_bytes(os.urandom(4 << 20))
        (Path(native) / "nvidia-smi").write_bytes(os.urandom(1 << 20))
        os.environ["MOKKA_NATIVE_DIR"] = native
        state = compile_profile(profile, node_name="bench-node")
        settings = GpuDriverSettings(nvidia_smi_binary=Path(native) / "absent", publish="symlink")
        results = [await one_round(state, settings) for _ in range(rounds)]
    print(f"gpudriver stage, profile {profile} ({len(state.gpus)} GPUs), {rounds} rounds")
    floor = statistics.median(r["floor"] * 1000 for r in results)
    print(f"  {'filesystem floor':16s} median {floor:7.2f} ms   (baseline)")
    for phase in results[0]:
        if phase == "floor":
            continue
        values = [r[phase] * 1000 for r in results]
        median = statistics.median(values)
        print(f"  {phase:16s} median {median:7.2f} ms   max {max(values):7.2f} ms"
              f"   {median / floor:5.1f}x floor")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h100")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    trio.run(main, args.profile, args.rounds)
