"""Checks of the device blocks both the profile and the overrides carry.

``fabric`` (the GPU's NVLink fabric identity), ``failure`` (an injected
failure mode, its triggers and the Xid it raises) and ``xids`` (Xids to
announce) mean the same in a profile's device entry and in an overrides
patch, so one set of checks serves both.
"""

from __future__ import annotations

from typing import Any

from mokka.state import checks
from mokka.state.checks import Problems, sub

FAILURE_KEYS = ("mode", "after_calls", "probability", "seed", "xid")
XID_KEYS = ("code", "id")
#: ``lost`` and ``fallen_off_bus`` make guarded NVML calls return GPU_IS_LOST;
#: ``ecc_uncorrectable`` makes the ECC counters climb.
FAILURE_MODES = ("healthy", "lost", "fallen_off_bus", "ecc_uncorrectable")
#: ``auto``: in progress until the fabric manager's readiness marker exists.
FABRIC_STATES = ("completed", "in_progress", "not_started", "not_supported", "auto")


def check_fabric(p: Problems, path: str, value: Any, *, partial: bool = False) -> None:
    """``fabric``: the GPU's NVLink fabric identity (``cluster_uuid``, ``clique_id``, ``state``)."""
    fabric = checks.as_mapping(p, path, value)
    if fabric is None:
        return
    if fabric.get("cluster_uuid") is not None:
        checks.as_match(p, sub(path, "cluster_uuid"), fabric["cluster_uuid"], checks.UUID_RE,
                        "a UUID xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
    if fabric.get("clique_id") is not None:
        checks.as_int(p, sub(path, "clique_id"), fabric["clique_id"], lo=0)
    if fabric.get("state") is not None:
        checks.as_choice(p, sub(path, "state"), fabric["state"], FABRIC_STATES)
    elif not partial:
        p.add(sub(path, "state"), f"missing, expected one of: {', '.join(FABRIC_STATES)}")


def check_failure(p: Problems, path: str, value: Any) -> None:
    """``failure``: injected failure mode, its triggers, and the Xid it raises."""
    failure = checks.as_mapping(p, path, value)
    if failure is None:
        return
    checks.check_keys(p, path, failure, FAILURE_KEYS)
    if failure.get("mode") is not None:
        checks.as_choice(p, sub(path, "mode"), failure["mode"], FAILURE_MODES)
    if failure.get("after_calls") is not None:
        checks.as_int(p, sub(path, "after_calls"), failure["after_calls"], lo=0)
    if failure.get("probability") is not None:
        checks.as_float(p, sub(path, "probability"), failure["probability"], lo=0.0, hi=1.0)
    if failure.get("seed") is not None:
        checks.as_int(p, sub(path, "seed"), failure["seed"])
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
        checks.as_int(p, sub(path, "code"), code, lo=1, hi=0xFFFF)
    if xid.get("id") is not None:
        checks.as_str(p, sub(path, "id"), xid["id"])


def check_xid_list(p: Problems, path: str, value: Any) -> None:
    items = checks.as_list(p, path, value)
    for pos, item in enumerate(items or ()):
        check_xid(p, sub(path, pos), item)
