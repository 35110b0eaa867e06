"""Container creation with and without Mokka's NRI plugin (``crictl create``).

Run: ``.venv/bin/python bench/nri_create.py [--rounds 20] [--containerd 2.1]``.

A Mokka h100 node staged in a scratch root, the tests' own containerd on it
(``tests/containerd_support.py``: private mount namespace, real runc), one
pod.  Each round times one ``crictl create`` of a container asking for GPU 1
through CDI (then removes it): first with no NRI plugin registered (the
floor), then with the nri simulator running (``tests.nri_daemon_support``),
which decides and answers sysfs, config and socket mounts for every one.
The time includes crictl's own start, the same in both.  Goal: at most 1.2x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' containerd harness

from figures import report

from tests.containerd_support import (
    IMAGE,
    Containerd,
    build_image,
    cleanup_node,
    real_components,
    seed_node,
    stage_node,
)

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--rounds", "5"]
BENCH = "nri_create"


def create_times(containerd: Containerd, pod: str, rounds: int, tag: str) -> list[float]:
    config = containerd.base / f"bench-{tag}.json"
    config.write_text(json.dumps({
        "metadata": {"name": f"bench-{tag}"}, "image": {"image": IMAGE},
        "command": ["/bin/true"], "log_path": f"bench-{tag}.log",
        "CDI_devices": [{"name": "nvidia.com/gpu=1"}],
    }))
    pod_config = containerd.base / "pod-bench.json"
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        cid = containerd.crictl("create", pod, str(config), str(pod_config)).stdout.strip()
        times.append(time.perf_counter() - started)
        containerd.crictl("rm", cid)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--containerd", default="2.1", choices=("2.1", "1.7"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mokka-nri-bench-") as scratch:
        base = Path(scratch)
        components = real_components(args.containerd, base)
        root = base / "node"
        seed_node(root, components)
        stage_node(root, components)
        build_image(base / "image.tar", components)
        containerd = Containerd(components, base / "containerd", root)
        link = base / "nri.sock"
        plugin: subprocess.Popen | None = None
        try:
            containerd.start()
            link.symlink_to(containerd.in_namespace("/run/nri/nri.sock"))
            containerd.ctr("images", "import", str(base / "image.tar"))
            deadline = time.monotonic() + 30
            while containerd.crictl("inspecti", IMAGE, check=False).returncode != 0:
                assert time.monotonic() < deadline, containerd.tail()
                time.sleep(0.05)
            pod = containerd.run_pod("bench")
            create_times(containerd, pod, 2, "warm")  # first-use costs out of the way
            without = create_times(containerd, pod, args.rounds, "without")
            log = base / "plugin.log"
            with log.open("wb") as out:
                plugin = subprocess.Popen(
                    [sys.executable, "-u", "-m", "tests.nri_daemon_support", str(link),
                     str(root)], stdout=out, stderr=subprocess.STDOUT,
                )
            deadline = time.monotonic() + 60
            while "configured by containerd" not in log.read_text(errors="replace"):
                assert time.monotonic() < deadline, log.read_text()
                assert plugin.poll() is None, log.read_text()
                time.sleep(0.05)
            create_times(containerd, pod, 2, "warm2")
            with_plugin = create_times(containerd, pod, args.rounds, "with")
        finally:
            if plugin is not None:
                plugin.kill()
                plugin.wait(timeout=30)
            containerd.stop()
            cleanup_node(root)
    floor = statistics.median(without) * 1e3
    print(f"containerd {args.containerd}, {args.rounds} rounds, crictl create with a CDI GPU")
    report(BENCH, "crictl create, median, with the NRI plugin",
           statistics.median(with_plugin) * 1e3, "ms", floor=floor, floor_name="without",
           goal="<= 1.2x")


if __name__ == "__main__":
    main()
