"""How long from a profile file change to a new published state.

Runs the real ``FileSource`` (real inotify, a worker thread for the re-read)
on a temp copy of the built-in h100 profile, saves a change N times and
prints the latency from the save to the published state:

* the way an editor does (a temp file renamed over the profile), which is
  read at once whatever the debounce: the read + compile is all it costs;
* in place (truncate and write), which waits for the debounce's quiet
  period: the default (``--reload-debounce``, 0.01 s), and none.

    .venv/bin/python bench/profile_reload.py [--rounds N]
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import statistics
import tempfile
import time
from pathlib import Path

import trio
import trio_util

from mokka.state.sources.file import FileSource

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--rounds", "5"]


async def measure(directory: Path, debounce: float, rounds: int, *, rename: bool) -> list[float]:
    text = (importlib.resources.files("mokka.state") / "profiles" / "h100.yaml").read_text()
    profile = directory / "profile.yaml"
    profile.write_text(text)
    source = FileSource(profile=profile, node_name="bench-node", debounce=debounce,
                        resync_interval=0, overrides=directory / "overrides.yaml")
    out: trio_util.AsyncValue = trio_util.AsyncValue(None)
    samples: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(source.run, out)
        for n in range(rounds):
            changed = text.replace("temperature_gpu_c: 29", f"temperature_gpu_c: {30 + n}")
            if rename:
                tmp = directory / ".profile.yaml.tmp"
                tmp.write_text(changed)
                started = time.perf_counter()
                os.rename(tmp, profile)
            else:
                started = time.perf_counter()
                profile.write_text(changed)
            await out.wait_value(lambda u, n=n: u.state.generation == n + 2)
            samples.append(time.perf_counter() - started)
        nursery.cancel_scope.cancel()
    return samples


def report(label: str, samples: list[float]) -> None:
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
    print(f"{label:<24} n={len(ms):<3} median {statistics.median(ms):7.1f} ms   "
          f"p95 {p95:7.1f} ms   max {ms[-1]:7.1f} ms")


async def main(rounds: int) -> None:
    for label, debounce, rename in (("rename", 0.01, True),
                                    ("in place, debounce 0.01", 0.01, False),
                                    ("in place, debounce 0", 0.0, False)):
        with tempfile.TemporaryDirectory() as tmp:
            samples = await measure(Path(tmp), debounce, rounds, rename=rename)
        report(label, samples)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    trio.run(main, parser.parse_args().rounds)
