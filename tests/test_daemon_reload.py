"""A running daemon follows its profile file: bad input keeps the last good
state serving, a fix converges the node (downward too), all without a restart.

A real ``python -m mokka`` on a temporary root with a profile file, real
inotify, real probes.  Waits are on the daemon's own log lines (no sleeps);
the time from the fixing write to the converged pass is printed for the
record (measured, never asserted).
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import httpx
import trio
import yaml

from mokka.state.profile import read_profile_text
from tests.daemon_support import PROCESS_TIMEOUT, running_daemon, stop_daemon
from tests.support import snapshot

DEV = "var/lib/nvml-mock/driver/dev"


def gpus(root: Path) -> list[str]:
    return sorted(p.name for p in (root / DEV).glob("nvidia[0-9]*"))


def four_gpu_profile(eight: str) -> str:
    """The built-in h100 cut to its first four GPUs (and their PCIe root)."""
    doc = yaml.safe_load(eight)
    doc["devices"] = doc["devices"][:4]
    keep = {d["pci"]["bus_id"] for d in doc["devices"]}
    for rc in doc.get("pcie_topology", {}).get("root_complexes", []):
        rc["devices"] = [b for b in rc["devices"] if b in keep]
    doc["pcie_topology"]["root_complexes"] = [
        rc for rc in doc["pcie_topology"]["root_complexes"] if rc["devices"]
    ]
    if "system" in doc and "num_devices" in doc["system"]:
        doc["system"]["num_devices"] = 4
    return yaml.safe_dump(doc, sort_keys=False)


def replace(path: Path, text: str) -> None:
    """An editor's save: write a sibling, rename over (a new inode)."""
    tmp = path.with_name(path.name + ".swp")
    tmp.write_text(text)
    tmp.rename(path)


async def test_bad_input_keeps_serving_and_a_fix_converges_without_restart(
    node_root: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    profile = config / "config.yaml"
    eight = read_profile_text("h100")[1]
    profile.write_text(eight)
    before = snapshot(node_root)

    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon(
            "--root", str(node_root), "--profile", str(profile),
            "--health-addr", "127.0.0.1:0", cwd=tmp_path,
        ) as daemon:
            port = int((await daemon.wait_for_line(r"health probes on .* port=(\d+)"))[1])
            await daemon.wait_for_line(r"reconcile pass ok generation=1")
            assert gpus(node_root) == [f"nvidia{i}" for i in range(8)]
            staged = snapshot(node_root)

            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                # 1. A broken save: the error is reported, the node keeps serving.
                broken = re.sub(
                    r"(?m)^  driver_version: .*$", "  driver_version: [5]", eight, count=1
                )
                assert broken != eight
                replace(profile, broken)
                await daemon.wait_for_line(r"driver_version")
                health = await client.get("/healthz")
                ready = await client.get("/readyz")
                metrics = (await client.get("/metrics")).text
                assert health.status_code == 200, health.text
                assert ready.status_code == 200, ready.text
                assert "config.yaml: system.driver_version" in (
                    health.json()["source_error"]["error"]
                )
                assert "mokka_source_errors_total 1" in metrics
                assert snapshot(node_root) == staged  # nothing staged was lost

                # 2. The fix, with four GPUs: converges downward, no restart.
                fixed_at = time.monotonic()
                replace(profile, four_gpu_profile(eight))
                await daemon.wait_for_line(r"reconcile pass ok generation=2")
                print(f"profile change to converged node: {time.monotonic() - fixed_at:.3f} s")
                assert gpus(node_root) == [f"nvidia{i}" for i in range(4)]
                assert (await client.get("/readyz")).status_code == 200
                assert (await client.get("/healthz")).json()["source_error"] is None
            code = await stop_daemon(daemon, signal.SIGTERM)
    assert code == 0, "\n".join(daemon.lines)
    assert snapshot(node_root) == before
