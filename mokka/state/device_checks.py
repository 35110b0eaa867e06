"""Checks of the device blocks both the profile and the overrides carry.

``dynamics`` (readings that follow a pattern, see docs/workloads.md) is a
profile block only; its checks live here beside the other device blocks
whose words are a contract with the mock NVML library.

``fabric`` (the GPU's NVLink fabric identity), ``failure`` (an injected
failure mode, its triggers and the Xid it raises) and ``xids`` (Xids to
announce) mean the same in a profile's device entry and in an overrides
patch, so one set of checks serves both.  The lists of allowed words are
the contract with the mock NVML library: ``engine_config`` refuses any
other failure mode or fabric state, and the C side maps exactly these.
"""

from __future__ import annotations

from typing import Any

from mokka.state import checks
from mokka.state.checks import Problems, sub

FAILURE_KEYS = ("mode", "after_calls", "probability", "seed", "xid")
#: ``id`` is what makes two injections of the same code two Xids (see
#: ``mokka.state.compile``); ``mokka ctl`` writes a random one each time.
XID_KEYS = ("code", "id")
#: ``lost`` and ``fallen_off_bus`` make guarded NVML calls return GPU_IS_LOST;
#: ``ecc_uncorrectable`` is one uncorrectable ECC error every process sees.
FAILURE_MODES = ("healthy", "lost", "fallen_off_bus", "ecc_uncorrectable")
#: ``auto``: in progress until the fabric manager's readiness marker exists.
FABRIC_STATES = ("completed", "in_progress", "not_started", "not_supported", "auto")

#: Link speeds ``lspci`` can name: Gen 1 (2.5 GT/s) .. Gen 6 (64 GT/s).
MAX_LINK_GEN = 6
#: Widths the PCIe specification defines (x12 and x32 included) and the
#: Link Capabilities register can encode.
LINK_WIDTHS = (1, 2, 4, 8, 12, 16, 32)
#: A GPU's ``pcie`` link fields, and what each may hold.
PCIE_LINK_VALUES = {
    "max_link_gen": range(1, MAX_LINK_GEN + 1),
    "current_link_gen": range(1, MAX_LINK_GEN + 1),
    "max_link_width": LINK_WIDTHS,
    "current_link_width": LINK_WIDTHS,
}


def pcie_link_problem(key: str, value: Any) -> str | None:
    """What is wrong with a ``pcie`` link field's value, or ``None`` (also for other keys)."""
    allowed = PCIE_LINK_VALUES.get(key)
    if allowed is None:
        return None
    if not isinstance(value, bool) and isinstance(value, int) and value in allowed:
        return None
    expected = (f"an integer 1..{MAX_LINK_GEN}" if "gen" in key
                else "one of " + ", ".join(map(str, LINK_WIDTHS)))
    return f"found {value!r}, expected {expected}"


def check_pcie_link(p: Problems, path: str, value: Any) -> None:
    """``pcie``'s link generation and width fields, where present (the rest passes)."""
    pcie = checks.as_mapping(p, path, value)
    for key, item in (pcie or {}).items():
        if item is not None and (problem := pcie_link_problem(key, item)) is not None:
            p.add(sub(path, key), problem)


#: ``fabric.health``'s words, as the mock NVML library maps them into
#: ``nvmlDeviceGetGpuFabricInfoV`` (``native/nvml/fabric.c``), any case; ``n/a``
#: is a field's NOT_SUPPORTED.  A word outside these would be ignored there.
_FLAG = (True, False, "n/a")
FABRIC_HEALTH_WORDS: dict[str, tuple[str | bool, ...]] = {
    "summary": ("healthy", "unhealthy", "limited_capacity", "n/a"),
    "bandwidth": ("full", "degraded", "n/a"),
    "route_recovery_in_progress": _FLAG,
    "route_unhealthy": _FLAG,
    "access_timeout_recovery": _FLAG,
    "incorrect_configuration": (*_FLAG, "incorrect_sysguid", "incorrect_chassis_sn",
                                "no_partition", "insufficient_nvlinks"),
}


def fabric_health_problem(key: str, value: Any) -> str | None:
    """What is wrong with one ``fabric.health`` word, or ``None`` (also for other keys)."""
    words = FABRIC_HEALTH_WORDS.get(key)
    if words is None:
        return None
    word = value.lower() if isinstance(value, str) else value
    # ``is`` for the booleans: ``1 == True`` to Python, not to the library
    if any(word is w if isinstance(w, bool) else word == w for w in words):
        return None
    spelled = ", ".join(str(w).lower() for w in words)
    return f"{checks.found(value)} is not one of: {spelled}"


def check_fabric_health(p: Problems, path: str, value: Any) -> None:
    """``fabric.health``: the words ``nvmlDeviceGetGpuFabricInfoV`` reports."""
    health = checks.as_mapping(p, path, value)
    if health is None:
        return
    checks.check_keys(p, path, health, FABRIC_HEALTH_WORDS)
    for key, item in health.items():
        if item is not None and (problem := fabric_health_problem(key, item)) is not None:
            p.add(sub(path, key), problem)


def check_fabric(p: Problems, path: str, value: Any, *, partial: bool = False) -> None:
    """``fabric``: the GPU's NVLink fabric identity (``cluster_uuid``, ``clique_id``, ``state``).

    ``partial``: the block may lack ``state``.  A profile's ``device_defaults``
    and device entries are checked one layer at a time, and the state may sit
    in the other layer; the profile parser checks the merged result for it.
    Unknown keys pass: upstream profiles carry more fabric fields that reach
    the engine config untouched; ``health`` is the library's words.
    """
    fabric = checks.as_mapping(p, path, value)
    if fabric is None:
        return
    if fabric.get("cluster_uuid") is not None:
        checks.as_match(p, sub(path, "cluster_uuid"), fabric["cluster_uuid"], checks.UUID_RE,
                        "a UUID xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
    if fabric.get("clique_id") is not None:
        # ``nvmlGpuFabricInfo_t.cliqueId`` is an unsigned int
        checks.as_int(p, sub(path, "clique_id"), fabric["clique_id"], lo=0, hi=checks.U32_MAX)
    if fabric.get("health") is not None:
        check_fabric_health(p, sub(path, "health"), fabric["health"])
    if fabric.get("state") is not None:
        checks.as_choice(p, sub(path, "state"), fabric["state"], FABRIC_STATES)
    elif not partial:
        p.add(sub(path, "state"), f"missing, expected one of: {', '.join(FABRIC_STATES)}")


def check_failure(p: Problems, path: str, value: Any) -> None:
    """``failure``: injected failure mode, its triggers, and the Xid it raises.

    Triggers (``after_calls``, ``probability`` with its ``seed``) are the
    mock library's to count, per process; here they are only type-checked.
    Every field is optional because an overrides patch may change just one.
    """
    failure = checks.as_mapping(p, path, value)
    if failure is None:
        return
    checks.check_keys(p, path, failure, FAILURE_KEYS)
    if failure.get("mode") is not None:
        checks.as_choice(p, sub(path, "mode"), failure["mode"], FAILURE_MODES)
    if failure.get("after_calls") is not None:
        checks.as_int(p, sub(path, "after_calls"), failure["after_calls"], lo=0, hi=checks.U64_MAX)
    if failure.get("probability") is not None:
        checks.as_float(p, sub(path, "probability"), failure["probability"], lo=0.0, hi=1.0)
    if failure.get("seed") is not None:
        # the library reads it as a u64: anything wider would be dropped silently
        checks.as_int(p, sub(path, "seed"), failure["seed"], lo=0, hi=checks.U64_MAX)
    if failure.get("xid") is not None:
        check_xid(p, sub(path, "xid"), failure["xid"])


def check_xid(p: Problems, path: str, value: Any) -> None:
    """One Xid: ``{code: N}`` with an optional ``id`` that makes it distinct from earlier ones."""
    xid = checks.as_mapping(p, path, value)
    if xid is None:
        return
    checks.check_keys(p, path, xid, XID_KEYS)
    code = checks.require(p, path, xid, "code", "the Xid number, e.g. 79")
    if code is not None:
        # Xid 0 does not exist and real codes are small numbers (79: fallen off
        # the bus); 16 bits leaves ample room and still catches a typo.
        checks.as_int(p, sub(path, "code"), code, lo=1, hi=0xFFFF)
    if xid.get("id") is not None:
        checks.as_str(p, sub(path, "id"), xid["id"])


def check_xid_list(p: Problems, path: str, value: Any) -> None:
    """``xids``: a list of Xids, each checked with ``check_xid`` under ``xids[i]``."""
    items = checks.as_list(p, path, value)
    for pos, item in enumerate(items or ()):
        check_xid(p, sub(path, pos), item)


#: The readings a ``dynamics`` block may move, with each value's range
#: (percent, fraction of the memory, watts, degrees Celsius, MHz).
DYNAMICS_METRICS: dict[str, tuple[float, float]] = {
    "utilization": (0.0, 100.0),
    "memory": (0.0, 1.0),
    "power": (0.0, 10_000.0),
    "temperature": (0.0, 150.0),
    "clocks": (0.0, 10_000.0),
}
#: Each pattern's parameters: (name, required, what it is).
DYNAMICS_PATTERNS: dict[str, tuple[tuple[str, bool], ...]] = {
    "steady": (("value", True),),
    "ramp": (("from", True), ("to", True), ("period_s", True)),
    "burst": (("low", True), ("high", True), ("period_s", True), ("duty", False)),
    "noise": (("mean", True), ("amplitude", True), ("seed", False)),
}
#: Parameters in the metric's own unit (checked against its range).
_VALUE_PARAMS = ("value", "from", "to", "low", "high", "mean", "amplitude")
#: Periods and steps in seconds: a millisecond is finer than any reader
#: polls; a day is longer than any pattern means (a longer one is a typo).
MIN_PERIOD_S = 0.001
MAX_PERIOD_S = 86_400.0


def check_dynamics(p: Problems, path: str, value: Any) -> None:
    """``dynamics``: ``step_s`` and one pattern per reading, e.g.
    ``utilization: {pattern: burst, low: 5, high: 95, period_s: 60, duty: 0.25}``.

    Values are in the reading's unit and range (``DYNAMICS_METRICS``), so a
    pattern can never ask the library for a reading the board cannot show.
    """
    block = checks.as_mapping(p, path, value)
    if block is None:
        return
    checks.check_keys(p, path, block, ("step_s", *DYNAMICS_METRICS))
    if block.get("step_s") is not None:
        checks.as_float(p, sub(path, "step_s"), block["step_s"], lo=MIN_PERIOD_S, hi=MAX_PERIOD_S)
    for metric, (lo, hi) in DYNAMICS_METRICS.items():
        if block.get(metric) is not None:
            _check_pattern(p, sub(path, metric), block[metric], lo, hi)


def _check_pattern(p: Problems, path: str, value: Any, lo: float, hi: float) -> None:
    spec = checks.as_mapping(p, path, value)
    if spec is None:
        return
    name = checks.require(p, path, spec, "pattern", f"one of: {', '.join(DYNAMICS_PATTERNS)}")
    if name is None:
        return
    name = checks.as_choice(p, sub(path, "pattern"), name, DYNAMICS_PATTERNS)
    if name is None:
        return
    params = DYNAMICS_PATTERNS[name]
    checks.check_keys(p, path, spec, ("pattern", *(key for key, _ in params)))
    for key, required in params:
        if spec.get(key) is None:
            if required:
                p.add(sub(path, key), f"missing, expected a number (pattern {name} needs it)")
            continue
        where = sub(path, key)
        if key in _VALUE_PARAMS:
            checks.as_float(p, where, spec[key], lo=0.0 if key == "amplitude" else lo, hi=hi)
        elif key == "period_s":
            checks.as_float(p, where, spec[key], lo=MIN_PERIOD_S, hi=MAX_PERIOD_S)
        elif key == "duty":
            checks.as_float(p, where, spec[key], lo=0.0, hi=1.0)
        elif key == "seed":
            checks.as_int(p, where, spec[key], lo=0, hi=2**63 - 1)
