"""Where a profile's values come from: the ``sources:`` note and the field groups it covers.

A built-in profile stands for a real board, and a user comparing the mock
with the boards they run needs to know which values are the board's and
which are a choice or an estimate.  So every value a profile states belongs
to a *group* (identity, memory, PCIe, power, ...), and the profile's
top-level ``sources:`` note says, per group, where that group's values come
from::

    sources:
      memory:
      - what: FB total and reserved, BAR1, row-remapper banks
        source: tests/data/nvidia-smi/qx-t4.xml (nvidia-smi -q -x, AWS g4dn.xlarge)
      readings:
      - what: idle temperature, power draw and clocks
        source: estimate, because the board publishes no idle figure

A source that is not a document says so: ``estimate, because <why>``.

``FIELD_GROUPS`` maps field paths to groups; a field belongs to the group of
the longest path that is it or lies above it.  Device fields are named as
``device.<path>`` whether ``device_defaults`` or a ``devices[]`` entry
states them.  ``unsourced_fields`` lists what a profile states without a
named source (``tests/test_profile_sources.py`` holds every built-in profile
to none); ``parse_sources`` checks the note's shape where the profile is
read.  The note describes the profile: it is not part of the compiled state
(``Profile.document`` leaves it out), so editing it publishes nothing new.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from mokka.state import checks
from mokka.state.checks import Problems

#: The groups a ``sources:`` note may name, and what each one covers.
GROUPS: dict[str, str] = {
    "schema": "the profile schema version",
    "driver": "driver, CUDA and NVML versions, GSP firmware, driver model",
    "identity": "name, brand, architecture, compute capability, cores, PCI device and "
                "subsystem ids, video encoders",
    "part_numbers": "board and GPU part numbers",
    "firmware": "VBIOS and InfoROM versions, the black box flush",
    "memory": "FB size and reserve, bus width, BAR1, row-remapper banks",
    "pcie": "PCIe generations, widths and atomics",
    "power": "power limits, management, the module's budget",
    "clocks": "max, application and supported clocks",
    "thermals": "temperature thresholds, fans",
    "modes": "ECC, MIG, virtualization, persistence, compute, display, accounting, "
             "addressing and sparse modes",
    "error_history": "ECC error counts, retired pages, remapped rows",
    "readings": "idle temperatures, power draw, clocks, utilization, PCIe traffic, "
                "processes",
    "nvlink": "NVLink generation, links, bandwidth, C2C, NVSwitches, fabric state",
    "infiniband": "the HCAs",
    "host": "the host system's DMI identity: vendor, product, family, board",
    "layout": "this node's arrangement: indices, minors, bus and board ids, UUID and serial "
              "templates, module and slot ids, PCIe roots and NUMA nodes, Grace pairs, the "
              "fabric clique",
}

#: Field path (device fields as ``device.<path>``) → group.  The most specific
#: path decides: ``device.clocks`` is ``clocks`` but ``device.clocks.graphics_current``
#: a reading.
FIELD_GROUPS: dict[str, str] = {
    "version": "schema",
    "system": "driver",
    "device.gsp_firmware": "driver",
    "device.driver_model": "driver",
    "device.gpu_operation_mode": "driver",
    "device.name": "identity",
    "device.brand": "identity",
    "device.architecture": "identity",
    "device.compute_capability": "identity",
    "device.num_gpu_cores": "identity",
    "device.pci.device_id": "identity",
    "device.pci.subsystem_id": "identity",
    "device.encoder": "identity",
    "device.board_part_number": "part_numbers",
    "device.gpu_part_number": "part_numbers",
    "device.vbios_version": "firmware",
    "device.inforom": "firmware",
    "device.memory": "memory",
    "device.memory.used_bytes": "readings",
    "device.memory.free_bytes": "readings",
    "device.bar1_memory": "memory",
    "device.bar1_memory.used_bytes": "readings",
    "device.bar1_memory.free_bytes": "readings",
    "device.remapped_rows": "error_history",
    "device.remapped_rows.availability_histogram.max": "memory",
    "device.pcie": "pcie",
    "device.pcie.replay_counter": "readings",
    "device.pcie.tx_throughput_kbps": "readings",
    "device.pcie.rx_throughput_kbps": "readings",
    "device.power": "power",
    "device.power.current_draw_mw": "readings",
    "device.power.power_state": "readings",
    "device.power.total_energy_consumption_mj": "readings",
    "device.module_power": "power",
    "device.module_power.current_draw_mw": "readings",
    "device.clocks": "clocks",
    "device.clocks.graphics_current": "readings",
    "device.clocks.sm_current": "readings",
    "device.clocks.memory_current": "readings",
    "device.clocks.video_current": "readings",
    "device.supported_clocks": "clocks",
    "device.thermal": "thermals",
    "device.thermal.temperature_gpu_c": "readings",
    "device.thermal.temperature_memory_c": "readings",
    "device.thermal.tlimit_c": "readings",
    "device.fan": "thermals",
    "device.fan.speed_percent": "readings",
    "device.fan.target_speed_percent": "readings",
    "device.ecc": "modes",
    "device.ecc.errors": "error_history",
    "device.retired_pages": "error_history",
    "device.mig": "modes",
    "device.virtualization": "modes",
    "device.persistence_mode": "modes",
    "device.compute_mode": "modes",
    "device.display": "modes",
    "device.accounting": "modes",
    "device.addressing_mode": "modes",
    "device.sparse_operation_mode": "modes",
    "device.performance_state": "readings",
    "device.clocks_throttle_reasons": "readings",
    "device.utilization": "readings",
    "device.encoder_stats": "readings",
    "device.fbc_stats": "readings",
    "device.processes": "readings",
    "dynamic_metrics_defaults": "readings",
    "nvlink": "nvlink",
    "device.fabric": "nvlink",
    "device.fabric.cluster_uuid": "layout",
    "device.fabric.clique_id": "layout",
    "infiniband": "infiniband",
    "system.dmi": "host",
    "device.index": "layout",
    "device.minor_number": "layout",
    "device.uuid": "layout",
    "device.serial": "layout",
    "device.board_id": "layout",
    "device.pci.bus_id": "layout",
    "device.platform": "layout",
    "device.grace_cpu_pair": "layout",
    "pcie_topology": "layout",
}

SOURCE_KEYS = ("what", "source")
#: What a source's text may be: one line, short enough to read in a message.
SOURCE_MAX_BYTES = 400
#: ``estimate, because <reason>``: a value no document gives says why it is what it is.
ESTIMATE_RE = re.compile(r"^estimate\b(?P<rest>.*)$", re.IGNORECASE)
ESTIMATE_BECAUSE_RE = re.compile(r"^, because \S")


@attrs.frozen
class Source:
    """One entry of a group's note: which of its values, and where they come from."""

    what: str
    source: str

    @property
    def is_estimate(self) -> bool:
        return ESTIMATE_RE.match(self.source) is not None


def parse_sources(p: Problems, raw: Any) -> dict[str, tuple[Source, ...]]:
    """``sources``: group name → its non-empty list of ``{what, source}``.

    Every problem is recorded in ``p``; what parsed is returned (``{}`` when
    the profile has no note).  Group names are checked, since a misspelt one
    would leave the group it meant without a source.
    """
    if raw is None:
        return {}
    note = checks.as_mapping(p, "sources", raw)
    if note is None:
        return {}
    out: dict[str, tuple[Source, ...]] = {}
    for group, entries in note.items():
        path = checks.sub("sources", str(group))
        if group not in GROUPS:
            p.add(path, f"unknown group, expected one of: {', '.join(GROUPS)}")
            continue
        items = checks.as_list(p, path, entries)
        if items is None:
            continue
        if not items:
            p.add(path, "empty list, expected at least one {what, source}")
            continue
        parsed = [_source(p, checks.sub(path, pos), item) for pos, item in enumerate(items)]
        if None not in parsed:
            out[group] = tuple(s for s in parsed if s is not None)
    return out


def _source(p: Problems, path: str, raw: Any) -> Source | None:
    item = checks.as_mapping(p, path, raw)
    if item is None:
        return None
    checks.check_keys(p, path, item, SOURCE_KEYS)
    before = len(p.items)
    texts = {}
    for key in SOURCE_KEYS:
        value = checks.require(p, path, item, key, "one line of text")
        if value is not None:
            texts[key] = checks.as_text(p, checks.sub(path, key), value,
                                        max_bytes=SOURCE_MAX_BYTES)
    estimate = ESTIMATE_RE.match(texts.get("source") or "")
    if estimate and not ESTIMATE_BECAUSE_RE.match(estimate["rest"]):
        p.add(checks.sub(path, "source"), f"{checks.found(texts['source'])} gives no reason, "
              "expected 'estimate, because <why no document gives the value>'")
    if len(p.items) != before or None in texts.values():
        return None
    return Source(what=texts["what"], source=texts["source"])


def group_of(path: str) -> str | None:
    """The group of a field path (``device.clocks.video_max``), or ``None`` when none claims it."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        group = FIELD_GROUPS.get(".".join(parts[:end]))
        if group is not None:
            return group
    return None


def stated_fields(document: Mapping[str, Any]) -> Iterator[str]:
    """Every value's field path in a profile document, device fields as ``device.<path>``.

    Lists of values are one field (``pcie_topology.root_complexes.devices``);
    lists of mappings are walked, without their indices.  Each path is given
    once.
    """
    seen: set[str] = set()
    for key, value in document.items():
        if key == "sources":
            continue
        if key == "device_defaults":
            paths = _leaves(value, "device")
        elif key == "devices" and isinstance(value, list):
            paths = (leaf for entry in value for leaf in _leaves(entry, "device"))
        else:
            paths = _leaves(value, str(key))
        for path in paths:
            if path not in seen:
                seen.add(path)
                yield path


def _leaves(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, Mapping) and value:
        for key, child in value.items():
            yield from _leaves(child, f"{path}.{key}")
    elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        for child in value:
            yield from _leaves(child, path)
    else:
        yield path


def unsourced_fields(document: Mapping[str, Any],
                     sources: Mapping[str, tuple[Source, ...]]) -> list[str]:
    """What a profile states without a named source, one line per field.

    ``<path>: no group claims it`` when ``FIELD_GROUPS`` has no entry for the
    field (a new field needs one), ``<path>: group <g> names no source`` when
    the profile's note leaves its group out.
    """
    out = []
    for path in stated_fields(document):
        group = group_of(path)
        if group is None:
            out.append(f"{path}: no group claims it, expected an entry in "
                       "mokka.state.profile_sources.FIELD_GROUPS")
        elif not sources.get(group):
            out.append(f"{path}: group {group} names no source, expected "
                       f"sources.{group} in the profile")
    return out
