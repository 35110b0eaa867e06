"""The drain state: ``nvidia-smi drain`` and ``nvmlDeviceModifyDrainState`` /
``QueryDrainState``, a node-wide setter like the others (``test_nvml_setters``).

One daemon (h100, the real nvidia-smi 535 staged): root drains a GPU by its
PCI address, every other process sees it, a caller that is not root is
refused with ``NVML_ERROR_NO_PERMISSION``, and teardown forgets it, leaving
the root empty.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mokka import layout
from tests.test_nvml_mig import _with_daemon
from tests.test_nvml_setters import SMI_TIMEOUT, Node, field, ok, open_dir

__all__ = ["open_dir"]  # the fixture, shared with the setters' test

NVML_SCRIPT = """
import json, sys, pynvml
pynvml.nvmlInit()
pci = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(2))
out = {"state": pynvml.nvmlDeviceQueryDrainState(pci)}
try:
    pynvml.nvmlDeviceModifyDrainState(pci, int(sys.argv[1]))
    out["modify"] = 0
except pynvml.NVMLError as exc:
    out["modify"] = exc.value
missing = pynvml.nvmlPciInfo_t()
missing.busId = b"00000000:99:00.0"
try:
    pynvml.nvmlDeviceQueryDrainState(missing)
except pynvml.NVMLError as exc:
    out["missing"] = exc.value
print(json.dumps(out))
"""


@pytest.mark.timeout(220)
async def test_drain_state_is_node_state(tmp_path: Path, open_dir: Path) -> None:
    await _with_daemon(open_dir, tmp_path, "h100", [_check_drain])


def _drained(node: Node, bus_id: str) -> str:
    return ok(node.smi("drain", "-p", bus_id, "-q")).strip()


def _bus_id(node: Node, gpu: int) -> str:
    """The GPU's address as ``nvidia-smi drain -p`` takes it: a 4-digit domain."""
    return field(ok(node.smi("-q", "-i", str(gpu))), "Bus Id").removeprefix("0000")


def _check_drain(node: Node, _cwd: Path) -> None:
    bus_id = _bus_id(node, 2)
    assert _drained(node, bus_id).endswith("is: not draining.")
    # a caller that is not root: refused by the library, nothing changes
    refused = node.smi("drain", "-p", bus_id, "-m", "1", user="nobody")
    assert refused.returncode != 0
    assert "Failed to modify the GPU drain state" in refused.stdout + refused.stderr
    assert _drained(node, bus_id).endswith("is: not draining.")
    out = ok(node.smi("drain", "-p", bus_id, "-m", "1"))
    assert "drain state to: draining" in out, out
    # another process sees it, and only on that GPU
    assert _drained(node, bus_id).endswith("is: draining.")
    other = _bus_id(node, 3)
    assert _drained(node, other).endswith("is: not draining.")
    doc = yaml.safe_load((node.root / layout.OVERRIDES.lstrip("/")).read_text())
    uuid = field(ok(node.smi("-q", "-i", "2")), "GPU UUID")
    assert doc["devices"][uuid]["drain_state"] == "enabled"
    # nvidia-ml-py: reads it, undrains it; an address with no GPU is NOT_FOUND
    probe = node.python(NVML_SCRIPT, "0")
    answers, err = probe.communicate(timeout=SMI_TIMEOUT)
    assert probe.returncode == 0, err
    assert json.loads(answers) == {"state": 1, "modify": 0, "missing": 6}
    assert _drained(node, bus_id).endswith("is: not draining.")
