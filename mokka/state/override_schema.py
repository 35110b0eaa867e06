"""Which device fields an overrides file may set, and their types.

Overrides change a running node: the mock library re-reads the engine
config on every call, so a value set here shows on the next query.  That
only makes sense for runtime values (temperatures, power draw, clocks,
utilization, ECC counters, failure injection).  Identity fields are fixed
when a GPU appears (consumers cache them: the device plugin advertises the
UUID, the kubelet records the bus id), so they are refused with a message
saying to change the profile instead.

The schema is a nested mapping: a key maps to a leaf checker, to a nested
schema (a ``dict``), or to ``ANY`` (an open subtree passed through: lists
of processes, metric generator settings).  ``check_patch`` records every
unknown key and every wrongly typed value.  An open subtree's shape is the
mock library's business, but every line it makes in the engine config
must be one the library's reader takes (``check_engine_lines``): else the
stage would refuse the whole node, and ``mokka ctl`` must refuse the change
first, in the same words (``mokka.state.engine_values``).

The schema is strict where the profile is open (``mokka.state.profile``
lets unknown device fields through) because the two are written
differently: a profile is reviewed once and may carry fields only the
mock library knows, while an overrides file is edited live, key by key,
and a misspelt key there would be a silent no-op at the worst moment
(during a failure drill).  ``known_paths`` turns the same table into the
list ``mokka ctl set --help`` prints, so help and check cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mokka.state import checks
from mokka.state.checks import Problems, found, sub
from mokka.state.device_checks import (
    FABRIC_HEALTH_WORDS,
    FABRIC_STATES,
    PCIE_LINK_VALUES,
    check_failure,
    check_xid_list,
    fabric_health_problem,
    pcie_link_problem,
)
from mokka.state.engine_values import (
    KEY_SEGMENT,
    LONGEST_DEVICE_PREFIX,
    key_problem,
    value_problem,
)

#: A leaf checker: records problems about ``value`` at ``path``.  The result
#: is ignored (the patch is stored as written), so any checker from
#: ``mokka.state.checks`` fits unchanged.
Leaf = Callable[[Problems, str, Any], object]


#: Degrees Celsius a temperature reading or threshold may be pinned to.  The
#: floor is 0 because NVML answers these in an ``unsigned int``
#: (``nvmlDeviceGetTemperature``, ``nvmlDeviceGetTemperatureThreshold``): a
#: negative value has no answer, so the library says NOT_SUPPORTED and
#: nvidia-smi prints N/A, which is not the drill that was asked for.  The
#: ceiling, 200, is about twice the highest shutdown threshold of any board
#: Mokka models (96 C), room for every overheat drill, while a slip of the
#: keyboard (``100000``) is refused instead of read as a reading.
TEMPERATURE_RANGE_C = (0, 200)
#: ``tlimit_c`` is headroom (the distance to the slowdown threshold), signed
#: in NVML (``nvmlDeviceGetTemperatureV``): any difference of two
#: temperatures in ``TEMPERATURE_RANGE_C``.
TLIMIT_RANGE_C = (-TEMPERATURE_RANGE_C[1], TEMPERATURE_RANGE_C[1])
#: NVML's performance states ``NVML_PSTATE_0``..``NVML_PSTATE_15``, spelt as
#: nvidia-smi prints them and as ``mokka ctl pstate`` takes them.
PSTATES = tuple(f"P{i}" for i in range(16))


def _temperature(p: Problems, path: str, v: Any) -> object:
    return checks.as_int(p, path, v, lo=TEMPERATURE_RANGE_C[0], hi=TEMPERATURE_RANGE_C[1])


def _tlimit(p: Problems, path: str, v: Any) -> object:
    return checks.as_int(p, path, v, lo=TLIMIT_RANGE_C[0], hi=TLIMIT_RANGE_C[1])


def _count(p: Problems, path: str, v: Any) -> object:
    """An integer 0..2^64-1: counters, bytes, milliwatts, MHz."""
    return checks.as_int(p, path, v, lo=0, hi=checks.U64_MAX)


def _u32(p: Problems, path: str, v: Any) -> object:
    return checks.as_int(p, path, v, lo=0, hi=checks.U32_MAX)


def _as_profile(problem_of: Callable[[str, Any], str | None]) -> Callable[..., object]:
    """A leaf rule from a profile check that names what is wrong with a key's value
    (``device_checks``): the same words refused in both files."""

    def rule(p: Problems, path: str, v: Any) -> object:
        problem = problem_of(path.rpartition(".")[2], v)
        if problem is not None:
            p.add(path, problem)
            return None
        return v

    return rule


#: A ``fabric.health`` word; a link generation or width.
_fabric_health_word = _as_profile(fabric_health_problem)
_pcie_link = _as_profile(pcie_link_problem)


def _pct(p: Problems, path: str, v: Any) -> object:
    return checks.as_int(p, path, v, lo=0, hi=100)


def _bool(p: Problems, path: str, v: Any) -> object:
    return checks.as_bool(p, path, v)


def _str(p: Problems, path: str, v: Any) -> object:
    """Text the engine config carries: one line that its reader takes."""
    return checks.as_text(p, path, v, max_bytes=checks.TEXT_VALUE_MAX_BYTES)


def _pstate(p: Problems, path: str, v: Any) -> object:
    """``P0``..``P15`` in any case; the message spells them as nvidia-smi does."""
    if isinstance(v, str) and v.upper() in PSTATES:
        return v.upper()
    p.add(path, f"{checks.found(v)} is not a performance state, expected {pstate_range()}")
    return None


def pstate_range() -> str:
    """``P0..P15``: the valid performance states, as a person types them."""
    return f"{PSTATES[0]}..{PSTATES[-1]}"


def _fabric_state(p: Problems, path: str, v: Any) -> object:
    return checks.as_choice(p, path, v, FABRIC_STATES)


def _uuid(p: Problems, path: str, v: Any) -> object:
    return checks.as_match(p, path, v, checks.UUID_RE,
                           "a UUID xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")


def _link_counts(p: Problems, path: str, v: Any) -> object:
    """``nvlink_errors``: ``{"<link>": <error count>}``, link 0..17 (NVML's link limit)."""
    links = checks.as_mapping(p, path, v)
    for key, count in (links or {}).items():
        # ASCII digits only: ``"²".isdigit()`` holds, but ``int("²")`` raises
        text = str(key)
        if not (text.isascii() and text.isdigit() and len(text) <= 32
                and int(text) < NVLINK_MAX_LINKS):
            p.add(sub(path, str(key)), f"{key!r} is not a link number 0..{NVLINK_MAX_LINKS - 1}")
            continue
        # a 64-bit counter in NVML (``nvmlDeviceGetNvLinkErrorCounter``)
        checks.as_int(p, sub(path, str(key)), count, lo=0, hi=checks.U64_MAX)
    return links


def _any(p: Problems, path: str, v: Any) -> object:
    """Any shape: the subtree is passed to the library (``check_patch`` checks its lines)."""
    return v


#: An open subtree (lists of processes, generator settings): its shape is the
#: mock library's business, and it carries no identity field to protect;
#: ``check_patch`` still checks every line it makes (``check_engine_lines``).
ANY: Leaf = _any
#: ``NVML_NVLINK_MAX_LINKS`` in ``nvml.h``: 18 links per GPU, as on Hopper and
#: Blackwell.
NVLINK_MAX_LINKS = 18

#: nvidia-smi's clocks event reasons (``nvmlClocksEventReason*``, formerly
#: "throttle reasons"), as the profile names them.  ``mokka ctl throttle``
#: writes every one of them, true or false, so the set is always complete.
THROTTLE_REASONS = (
    "gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown",
    "hw_thermal_slowdown", "hw_power_brake_slowdown", "sync_boost", "sw_thermal_slowdown",
    "display_clocks_setting",
)
#: ``fabric.health`` states ``mokka ctl fabric-health`` knows; the block each
#: writes is built by ``mokka.ctl.edits.fabric_health``.
FABRIC_HEALTH = ("healthy", "degraded_bandwidth", "route_recovery", "route_unhealthy",
                 "access_timeout_recovery", "incorrect_configuration")

# ECC error counters by memory location: NVML's ``nvmlMemoryLocation_t``
# names plus the SRAM/DRAM split that Hopper and later report (nvidia-smi
# picks the layout by architecture).  ``single_bit``/``double_bit`` are the
# profile's names for corrected/uncorrected; ``volatile`` counts since the
# driver loaded, ``aggregate`` over the board's life.
_ECC_COUNTS = {k: _count for k in (
    "device_memory", "l1_cache", "l2_cache", "register_file", "texture_memory", "total",
    "sram_correctable", "sram_uncorrectable", "dram_correctable", "dram_uncorrectable",
)}
# Hopper and later also count per kind directly (``volatile.sram_correctable``),
# as their profiles and the library's reader lay them out.
_ECC_KIND = {"single_bit": _ECC_COUNTS, "double_bit": _ECC_COUNTS, **{k: _count for k in (
    "sram_correctable", "sram_uncorrectable", "dram_correctable", "dram_uncorrectable")}}

#: Every key an overrides patch (``all`` or one device) may set.  A ``dict``
#: nests, a callable checks a leaf.  Units follow the profile: temperatures in
#: degrees Celsius, power in mW, energy in mJ, clocks in MHz, sizes in bytes.
SCHEMA: dict[str, Any] = {
    "thermal": {
        **{k: _temperature for k in (
            "temperature_gpu_c", "temperature_memory_c", "shutdown_threshold_c",
            "slowdown_threshold_c", "max_operating_c", "max_memory_operating_c",
            "target_temperature_c",
        )},
        "tlimit_c": _tlimit,
    },
    "power": {
        **{k: _count for k in (
            "current_draw_mw", "default_limit_mw", "enforced_limit_mw", "min_limit_mw",
            "max_limit_mw", "total_energy_consumption_mj",
        )},
        "power_state": _pstate, "management_mode": _str, "management_supported": _bool,
    },
    # ``locked_*``: the range ``nvmlDeviceSetGpuLockedClocks`` /
    # ``SetMemoryLockedClocks`` set (0, 0: not locked).
    "clocks": {k: _count for k in (
        "graphics_current", "graphics_max", "graphics_app", "graphics_app_default",
        "sm_current", "sm_max", "memory_current", "memory_max", "memory_app",
        "memory_app_default", "video_current", "video_max", "locked_graphics_min",
        "locked_graphics_max", "locked_memory_min", "locked_memory_max",
    )},
    "clocks_throttle_reasons": {k: _bool for k in THROTTLE_REASONS},
    "utilization": {k: _pct for k in ("gpu", "memory", "encoder", "decoder", "jpeg", "ofa")},
    "performance_state": _pstate,
    "memory": {k: _count for k in ("used_bytes", "free_bytes", "reserved_bytes", "total_bytes")},
    "ecc": {
        "mode_current": _str, "mode_pending": _str, "default_mode": _str,
        "errors": {"volatile": _ECC_KIND, "aggregate": _ECC_KIND},
    },
    "retired_pages": ANY,
    "remapped_rows": {
        "correctable": _count, "uncorrectable": _count, "pending": _bool,
        "failure_occurred": _bool, "availability_histogram": ANY,
    },
    "pcie": {
        **{k: _count for k in ("replay_counter", "tx_throughput_kbps", "rx_throughput_kbps")},
        **{k: _pcie_link for k in PCIE_LINK_VALUES},
    },
    "fan": ANY,
    # The fabric identity may change at runtime (a node joining a clique);
    # ``health`` is what ``nvmlDeviceGetGpuFabricInfoV`` reports beside it.
    "fabric": {
        "state": _fabric_state, "clique_id": _u32, "cluster_uuid": _uuid,
        "health": {k: _fabric_health_word for k in FABRIC_HEALTH_WORDS},
    },
    "failure": check_failure,
    "xids": check_xid_list,
    "nvlink_errors": _link_counts,
    "processes": ANY,
    "persistence_mode": _str,
    "drain_state": _str,
    "compute_mode": _str,
    "accounting": {"mode": _str},
    "dynamic_metrics": ANY,
    "encoder_stats": ANY,
    "fbc_stats": ANY,
    "mig": {"mode_current": _str, "mode_pending": _str, "instances": ANY},
}

#: Fixed when the GPU appears; an override may not change them.  GFD and the
#: DRA driver publish name, architecture, brand and compute capability as
#: labels and device attributes; the device plugin advertises the UUID and
#: the kubelet checkpoints it with each allocation; the minor number names
#: the ``/dev/nvidia<minor>`` a container was given; the bus id feeds the
#: NUMA lookup.  Changing any of these under a running consumer would leave
#: it with stale facts, so they change only with the profile.
NOT_HOT_RELOADABLE = (
    "name", "architecture", "brand", "compute_capability", "uuid", "pci", "bar1_memory",
    "index", "minor_number", "serial",
)


def check_patch(p: Problems, path: str, patch: Mapping[str, Any], schema: Any = None) -> None:
    """Record every unknown key, refused identity field and wrongly typed value in ``patch``.

    ``schema`` is the sub-table for a nested call (``None``: the whole
    ``SCHEMA``).  Identity fields are looked for at the top level only, where
    they live in a device config, and before the unknown-key test, so the
    user hears "change the profile instead" rather than "unknown key".

    A whole patch whose every field passed its rule is then checked line by
    line as the engine config will hold it (``check_engine_lines``): the
    open subtrees, and any typed field a rule bounds less tightly than the
    library's reader (a 4000-digit ``failure.after_calls``).  Only then:
    a field its rule refused would only be reported twice.
    """
    schema = SCHEMA if schema is None else schema
    top = schema is SCHEMA
    before = len(p.items)
    for key, value in patch.items():
        kpath = sub(path, str(key))
        if top and key in NOT_HOT_RELOADABLE:
            p.add(kpath, "not hot-reloadable (consumers cache it when the GPU appears), "
                  "change the profile instead")
            continue
        if key not in schema:
            p.add(kpath, f"unknown key, expected one of: {', '.join(sorted(schema))}")
            continue
        rule = schema[key]
        if isinstance(rule, dict):
            nested = checks.as_mapping(p, kpath, value)
            if nested is not None:
                check_patch(p, kpath, nested, rule)
        else:
            rule(p, kpath, value)
    if top and len(p.items) == before:
        check_engine_lines(p, path, "", patch)


def check_engine_lines(p: Problems, path: str, key: str, value: Any) -> None:
    """Record every line of ``value`` that the engine config's reader would refuse.

    ``value`` sits at ``key`` in a device config (``""``: it is a whole
    patch), and becomes the lines the writer makes of it
    (``config_lines.flatten``: a mapping's keys joined with dots, a list's
    items numbered, with a ``.count``; ``None`` left out), each prefixed
    with the GPU's ``device.<position>.`` (the longest, as the patch may
    apply to any GPU).  A key segment the writer would
    leave out is refused rather than dropped without a word, as any unknown
    key here is.  Walked without recursion: the reader has bounded the
    depth, but a document built in memory (``mokka ctl``) is not read.
    """
    stack: list[tuple[str, str, Any]] = [(path, key, value)]
    while stack:
        where, line_key, item = stack.pop()
        if item is None:
            continue
        if isinstance(item, Mapping):
            for child_key, child in reversed(item.items()):
                segment = str(child_key)
                if not KEY_SEGMENT.fullmatch(segment):
                    p.add(sub(where, segment), f"key {found(child_key)} cannot be written to the "
                          f"engine config, expected a key of {KEY_SEGMENT.pattern}")
                    continue
                stack.append((sub(where, segment), _join(line_key, segment), child))
            continue
        if isinstance(item, list):
            _check_line(p, where, _join(line_key, "count"), len(item))
            stack.extend((sub(where, i), _join(line_key, str(i)), child)
                         for i, child in reversed(list(enumerate(item))))
            continue
        _check_line(p, where, line_key, item)


def _join(key: str, segment: str) -> str:
    return f"{key}.{segment}" if key else segment


def _check_line(p: Problems, where: str, line_key: str, value: Any) -> None:
    """Record why the reader would refuse the line ``<device prefix><line_key>: value``."""
    problem = key_problem(LONGEST_DEVICE_PREFIX + line_key)
    if problem is not None:
        p.add(where, f"engine config {problem} (with its prefix {LONGEST_DEVICE_PREFIX})")
        return
    problem = value_problem(value)
    if problem is not None:
        p.add(where, problem)


def known_paths(schema: Mapping[str, Any] | None = None, prefix: str = "") -> list[str]:
    """Every settable dotted path (for ``mokka ctl set`` help and error hints).

    An open (``ANY``) subtree appears as one path, e.g. ``processes``: what
    sits below it is not the schema's to list.
    """
    schema = SCHEMA if schema is None else schema
    paths: list[str] = []
    for key, rule in schema.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(rule, dict):
            paths.extend(known_paths(rule, path))
        else:
            paths.append(path)
    return paths
