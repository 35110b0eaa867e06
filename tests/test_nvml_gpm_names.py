"""Every GPM metric the mock NVML library answers carries its names and unit.

``nvmlGpmMetricsGet`` fills ``metricInfo.shortName``, ``longName`` and
``unit`` for each metric it answers; nvml.h allows NULL only for a metric
that is "not defined".  A C consumer printing the names of the metrics it
got dereferences them, so an answered metric (``nvmlReturn`` 0) with a NULL
name is a crash.  Every metric id nvml.h defines below
``NVML_GPM_METRIC_MAX`` (and ids past it) is asked on Hopper and Blackwell
boards: the ones the library knows answer with names that follow the
established pattern (the id's suffix in lower case without ``_PER_SEC``, a
per-engine or per-link long name, ``%`` for a utilization and ``MiB/sec``
for a bandwidth); every other id answers ``NVML_ERROR_NOT_SUPPORTED`` with
no names.  Each check runs in a child interpreter through nvidia-ml-py
(whose metrics array holds 98 entries, so the ids go in batches).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs
import pytest

from mokka.state.compile import compile_profile
from tests.nvml_support import load_target, run_script, write_config

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(120)]

SUCCESS, NOT_SUPPORTED = 0, 3

CHILD = r"""
import json, sys
import pynvml as nv

ids = json.loads(sys.argv[1])
nv.nvmlInit()
handle = nv.nvmlDeviceGetHandleByIndex(int(sys.argv[2]))
first, second = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
nv.nvmlGpmSampleGet(handle, first)
for _ in range(200):
    nv.nvmlDeviceGetUtilizationRates(handle)
nv.nvmlGpmSampleGet(handle, second)

def text(p):
    return None if p is None else p.decode()

out = {}
room = len(nv.c_nvmlGpmMetricsGet_t().metrics)
for start in range(0, len(ids), room):
    batch = ids[start:start + room]
    get = nv.c_nvmlGpmMetricsGet_t()
    get.version = nv.NVML_GPM_METRICS_GET_VERSION
    get.numMetrics = len(batch)
    get.sample1, get.sample2 = first, second
    for i, metric in enumerate(batch):
        get.metrics[i].metricId = metric
    nv.nvmlGpmMetricsGet(get)
    for m in get.metrics[:len(batch)]:
        info = m.metricInfo
        out[str(m.metricId)] = {"ret": m.nvmlReturn, "short": text(info.shortName),
                                "long": text(info.longName), "unit": text(info.unit)}
nv.nvmlGpmSampleFree(first)
nv.nvmlGpmSampleFree(second)
nv.nvmlShutdown()
print(json.dumps(out))
"""


def header_metrics() -> dict[str, int]:
    """nvml.h's GPM metric ids by name (``NVDEC_0_UTIL``: 30), the maximum excluded."""
    header = load_target("nvml")._exports().find_header().read_text()
    found = re.findall(r"^\s*NVML_GPM_METRIC_(\w+)\s*=\s*(\d+)", header, re.M)
    return {name: int(value) for name, value in found if name != "MAX"}


def metric_max() -> int:
    header = load_target("nvml")._exports().find_header().read_text()
    match = re.search(r"^\s*NVML_GPM_METRIC_MAX\s*=\s*(\d+)", header, re.M)
    assert match is not None
    return int(match[1])


def child(native: Path, config: Path, ids: list[int], index: int = 0) -> dict[int, Any]:
    got = run_script(native, config, CHILD, json.dumps(ids), str(index))
    return {int(k): v for k, v in got.items()}


#: The names of the first sixteen metrics, as the library has reported them
#: since GPM was added.
ESTABLISHED = {
    "GRAPHICS_UTIL": ("gr_util", "graphics utilization", "%"),
    "SM_UTIL": ("sm_util", "SM utilization", "%"),
    "SM_OCCUPANCY": ("sm_occupancy", "SM occupancy", "%"),
    "INTEGER_UTIL": ("integer_util", "integer utilization", "%"),
    "ANY_TENSOR_UTIL": ("any_tensor_util", "tensor utilization", "%"),
    "DFMA_TENSOR_UTIL": ("dfma_tensor_util", "DFMA tensor utilization", "%"),
    "HMMA_TENSOR_UTIL": ("hmma_tensor_util", "HMMA tensor utilization", "%"),
    "IMMA_TENSOR_UTIL": ("imma_tensor_util", "IMMA tensor utilization", "%"),
    "DRAM_BW_UTIL": ("dram_bw_util", "DRAM bandwidth utilization", "%"),
    "FP64_UTIL": ("fp64_util", "FP64 utilization", "%"),
    "FP32_UTIL": ("fp32_util", "FP32 utilization", "%"),
    "FP16_UTIL": ("fp16_util", "FP16 utilization", "%"),
    "PCIE_TX_PER_SEC": ("pcie_tx", "PCIe TX", "MiB/sec"),
    "PCIE_RX_PER_SEC": ("pcie_rx", "PCIe RX", "MiB/sec"),
    "NVLINK_TOTAL_RX_PER_SEC": ("nvlink_total_rx", "NVLink total RX", "MiB/sec"),
    "NVLINK_TOTAL_TX_PER_SEC": ("nvlink_total_tx", "NVLink total TX", "MiB/sec"),
}


def expected_names(name: str) -> tuple[str, str, str] | None:
    """The names the library reports for a metric of nvml.h; None for one it
    does not answer (C2C, a second OFA, caches, encoders, context switches)."""
    if name in ESTABLISHED:
        return ESTABLISHED[name]
    if match := re.fullmatch(r"(NVDEC|NVJPG)_([0-7])_UTIL|(NVOFA)_(0)_UTIL", name):
        engine, n = match[1] or match[3], match[2] or match[4]
        return (f"{engine.lower()}_{n}_util", f"{engine} {n} utilization", "%")
    if match := re.fullmatch(r"NVLINK_L(\d+)_(RX|TX)_PER_SEC", name):
        link, way = match[1], match[2]
        return (f"nvlink_l{link}_{way.lower()}", f"NVLink L{link} {way}", "MiB/sec")
    return None


@pytest.mark.parametrize("profile", ["h100", "gb200"])
def test_every_answered_metric_has_names_and_a_unit(native: Path, tmp_path: Path, profile: str):
    state = compile_profile(profile, node_name="worker-1")
    assert state.nvlink is not None
    assert state.nvlink.links_per_gpu == 18
    metrics = header_metrics()
    top = metric_max()
    # every id below the maximum (named or a gap), and ids past it
    ids = [*range(top), top, top + 1, 999, 2**32 - 1]
    got = child(native, write_config(tmp_path, state), ids)
    assert sorted(got) == sorted(ids)
    by_id = {value: name for name, value in metrics.items()}
    answered = set()
    for metric, entry in got.items():
        names = (entry["short"], entry["long"], entry["unit"])
        if entry["ret"] == SUCCESS:
            answered.add(metric)
            assert None not in names, (metric, entry)
        else:
            assert entry["ret"] == NOT_SUPPORTED, (metric, entry)
            assert names == (None, None, None), (metric, entry)
        expected = expected_names(by_id[metric]) if metric in by_id else None
        if expected is None:
            assert entry["ret"] == NOT_SUPPORTED, (metric, by_id.get(metric), entry)
        else:
            assert names == expected, (metric, entry)
    # what the library knows on a board with 18 links, NVDEC/NVJPG 0..7 and one OFA
    assert answered == {metrics[name] for name in metrics if expected_names(name) is not None}
    assert answered == {
        *range(1, 8),
        *range(9, 14),
        20,
        21,
        *range(30, 38),
        *range(40, 48),
        50,
        *range(60, 98),
    }


def test_short_names_are_unique(native: Path, tmp_path: Path):
    got = child(
        native,
        write_config(tmp_path, compile_profile("h100", node_name="worker-1")),
        sorted(header_metrics().values()),
    )
    named = [e["short"] for e in got.values() if e["ret"] == SUCCESS]
    assert len(named) == len(set(named)) == 69


def test_a_board_without_nvlink_answers_no_link_metric(native: Path, tmp_path: Path):
    """An L40S made to report GPM (`gpm.supported`) has no NVLink: its link
    metrics are no answer, and so carry no names; its media engines answer
    with theirs."""
    state = compile_profile("l40s", node_name="worker-1")
    gpu = state.gpus[0]
    gpu = attrs.evolve(gpu, fields={**gpu.fields, "gpm": {"supported": True}})
    state = attrs.evolve(state, gpus=(gpu, *state.gpus[1:]))
    got = child(native, write_config(tmp_path, state), [60, 61, 62, 97, 30, 50])
    for metric in (60, 61, 62, 97):
        assert got[metric] == {"ret": NOT_SUPPORTED, "short": None, "long": None, "unit": None}
    assert got[30] == {
        "ret": SUCCESS,
        "short": "nvdec_0_util",
        "long": "NVDEC 0 utilization",
        "unit": "%",
    }
    assert got[50] == {
        "ret": SUCCESS,
        "short": "nvofa_0_util",
        "long": "NVOFA 0 utilization",
        "unit": "%",
    }
