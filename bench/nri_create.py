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
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' containerd harness

from figures import report

from tests.containerd_support import IMAGE, SERIES, Containerd, cleanup_node, staged_node
from tests.nri_daemon_support import NriDaemonProcess

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
    parser.add_argument("--containerd", default=SERIES[0], choices=SERIES)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mokka-nri-bench-") as scratch:
        base = Path(scratch)
        staged = staged_node(args.containerd, base)
        containerd = staged.containerd
        link = base / "nri.sock"
        plugin = NriDaemonProcess(link, base / "plugin", (str(staged.root),))
        try:
            containerd.start()
            containerd.link_nri_socket(link)
            containerd.import_image(staged.image)
            pod = containerd.run_pod("bench")
            create_times(containerd, pod, 2, "warm")  # first-use costs out of the way
            without = create_times(containerd, pod, args.rounds, "without")
            plugin.start()
            plugin.wait_for("configured by containerd", timeout=60)
            create_times(containerd, pod, 2, "warm2")
            with_plugin = create_times(containerd, pod, args.rounds, "with")
        finally:
            plugin.kill()
            containerd.stop()
            cleanup_node(staged.root)
    floor = statistics.median(without) * 1e3
    print(f"containerd {args.containerd}, {args.rounds} rounds, crictl create with a CDI GPU")
    report(BENCH, "crictl create, median, with the NRI plugin",
           statistics.median(with_plugin) * 1e3, "ms", floor=floor, floor_name="without",
           goal="<= 1.2x")


if __name__ == "__main__":
    main()
