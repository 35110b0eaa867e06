"""A GPU's MIG layout: which GPU and compute instances a ``SET`` creates or destroys.

The layout is node state like the other setters' changes (``nvml_set``):
the GPU's ``mig.instances`` in its ``devices["<uuid>"]`` overrides layer,
a list of GPU instances, each with its compute instances::

    mig:
      instances:
        - {id: 7, profile: 19, start: 0, compute: [{id: 0, slices: 1, start: 0}]}

This module is the pure half: whether a request fits the board's table
(``mokka.state.mig_profiles``) and the layout it leaves.  The ids are
NVML's: a GPU instance's follows from its size and placement (the whole
GPU is 0, a 4-slice placement 1 or 2, a 2-slice one 3 to 6, a 1-slice one
7 to 13), so ids never collide and a layout re-created the same way gets
the same ids, and with them the same ``MIG-`` UUIDs.  A compute instance's
id is its start within its GPU instance.

Requests (the ``SET`` value, numbers joined by commas):

* ``mig_gi_create`` ``<profile>,<start>``: a GPU instance of the profile
  (nvidia-smi's id) at that placement;
* ``mig_gi_destroy`` ``<gi>``: refused with ``IN_USE`` while it has
  compute instances;
* ``mig_ci_create`` ``<gi>,<slices>,<start>``: a compute instance;
* ``mig_ci_destroy`` ``<gi>,<ci>``.

A layout the board cannot hold (a taken or unknown placement, more
instances of a profile than it has, more compute slices than seven) is
``NVML_ERROR_INSUFFICIENT_RESOURCES``, as NVML answers it; nothing changes.

A profile may declare the layout a GPU boots with, as a MIG manager would
leave it: ``mig.layout``, a list of GPU-instance profile names, each
optionally ``<count>x`` (``[7x1g.10gb]``, ``[3g.40gb, 2x2g.20gb]``), with
``mig.mode_current: enabled``.  Each GPU instance takes its first free
placement in the order given and one compute instance over all its slices,
as ``nvidia-smi mig -cgi ... -C`` makes them (``declared``).  The runtime's
``instances`` win once anything changed the layout (``current``), and
teardown forgets them, so the node boots with the declared layout again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mokka.state import mig_profiles
from mokka.state.checks import found
from mokka.state.mig_profiles import GpuInstanceProfile, MigBoard

INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
#: Compute slices of every board here.
COMPUTE_SLICES = 7

KEYS = ("mig_gi_create", "mig_gi_destroy", "mig_ci_create", "mig_ci_destroy")
#: A declared layout's ``<count>x<profile>`` item.
_COUNTED = re.compile(r"([0-9]{1,3})x(.+)\Z")
#: The first GPU instance id of each placement size (in memory slices).
_FIRST_ID = {8: 0, 4: 1, 2: 3, 1: 7}


class LayoutRefusal(Exception):
    """The board's answer to a layout it does not take: an NVML code and why."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def gi_id(size: int, start: int) -> int:
    """NVML's id of the GPU instance with this placement."""
    return _FIRST_ID[size] + start // size


def instances(mig: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The layout's GPU instances, as plain dicts (a copy to change)."""
    listed = mig.get("instances")
    if not isinstance(listed, list):
        return []
    # a hand-edited layout may hold anything: what is no mapping is no instance
    return [{**gi, "compute": [dict(ci) for ci in _list(gi.get("compute")) if _is_map(ci)]}
            for gi in listed if _is_map(gi)]


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _is_map(value: Any) -> bool:
    return isinstance(value, Mapping)


def current(name: str, mig: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The GPU's layout in force: the runtime's ``instances`` once anything
    changed it, else the profile's declared ``layout`` (nothing for a layout
    the board cannot hold: the engine config refuses that one, ``declared``)."""
    if "instances" in mig:
        return instances(mig)
    board = mig_profiles.board(name)
    if board is None or "layout" not in mig:
        return []
    try:
        return declared(board, mig["layout"])
    except LayoutRefusal:
        return []


def declared(board: MigBoard, spec: Any) -> list[dict[str, Any]]:
    """The instances a profile's ``mig.layout`` declares; ``LayoutRefusal``
    saying what the board can hold when it cannot hold them."""
    names = _declared_names(board, spec)
    layout = _place(board, [], names)
    if layout is None:
        raise LayoutRefusal(INSUFFICIENT_RESOURCES, (
            f"{', '.join(names)} does not fit the board: it holds seven compute "
            f"slices and eight memory slices, at most {_capacities(board)}"))
    for gi in layout:
        profile = board.profile(gi["profile"])
        assert profile is not None
        _create_ci(board, gi, profile.slices, 0)
    return layout


def _place(board: MigBoard, layout: list[dict[str, Any]],
           names: list[str]) -> list[dict[str, Any]] | None:
    """``names`` placed after ``layout``: each at its first placement that
    leaves room for the rest (a 3g instance at 4 when two 2g ones follow),
    or ``None`` when no placement does."""
    if not names:
        return layout
    profile = board.by_label(names[0])
    assert profile is not None  # _declared_names checked it
    for start in profile.starts:
        try:
            placed = _create_gi(board, layout, profile.smi_id, start)
        except LayoutRefusal:
            continue
        rest = _place(board, placed, names[1:])
        if rest is not None:
            return rest
    return None


def _declared_names(board: MigBoard, spec: Any) -> list[str]:
    if not isinstance(spec, list) or not all(isinstance(item, str) for item in spec):
        raise LayoutRefusal(INVALID_ARGUMENT, (
            f"got {found(spec)}, expected a list of GPU instance profiles such as "
            "[7x1g.10gb] or [3g.40gb, 2x2g.20gb]"))
    names: list[str] = []
    for item in spec:
        counted = _COUNTED.match(item)
        count, label = (int(counted[1]), counted[2]) if counted else (1, item)
        if not 1 <= count <= COMPUTE_SLICES:
            raise LayoutRefusal(INSUFFICIENT_RESOURCES, (
                f"{found(item)}: {count} GPU instances, the board holds 1 to {COMPUTE_SLICES}"))
        if board.by_label(label) is None:
            raise LayoutRefusal(INVALID_ARGUMENT, (
                f"{found(label)} is not a GPU instance profile of this board, expected one of "
                f"{', '.join(p.label for p in board.profiles)}"))
        names += [label] * count
    if len(names) > COMPUTE_SLICES:
        raise LayoutRefusal(INSUFFICIENT_RESOURCES, (
            f"{len(names)} GPU instances, the board holds at most {COMPUTE_SLICES}"))
    return names


def _capacities(board: MigBoard) -> str:
    return ", ".join(f"{p.instances}x{p.label}" for p in board.profiles)


def plan(name: str, mig: Mapping[str, Any], key: str, value: str) -> list[dict[str, Any]]:
    """The layout after ``key``/``value`` on the board NVML names ``name``.

    ``mig``: the GPU's ``mig`` fields now.  Raises ``LayoutRefusal``.
    """
    board = mig_profiles.board(name)
    if board is None or mig.get("mode_current") is None:
        raise LayoutRefusal(NOT_SUPPORTED, "the board is not MIG capable")
    if mig.get("mode_current") != "enabled":
        raise LayoutRefusal(NOT_SUPPORTED, "MIG mode is not enabled")
    numbers = _numbers(value)
    layout = current(name, mig)
    if key == "mig_gi_create" and len(numbers) == 2:
        return _create_gi(board, layout, *numbers)
    if key == "mig_gi_destroy" and len(numbers) == 1:
        gi = _gi(layout, numbers[0])
        if gi["compute"]:
            raise LayoutRefusal(IN_USE, f"GPU instance {numbers[0]} has compute instances")
        return [g for g in layout if g is not gi]
    if key == "mig_ci_create" and len(numbers) == 3:
        gi_number, slices, start = numbers
        gi = _gi(layout, gi_number)
        _create_ci(board, gi, slices, start)
        return layout
    if key == "mig_ci_destroy" and len(numbers) == 2:
        gi = _gi(layout, numbers[0])
        kept = [ci for ci in gi["compute"] if ci["id"] != numbers[1]]
        if len(kept) == len(gi["compute"]):
            raise LayoutRefusal(NOT_FOUND, f"no compute instance {numbers[1]}")
        gi["compute"] = kept
        return layout
    raise LayoutRefusal(INVALID_ARGUMENT, f"{key} {value!r} is not a MIG request")


def _numbers(value: str) -> list[int]:
    try:
        return [int(part) for part in value.split(",")]
    except ValueError:
        raise LayoutRefusal(INVALID_ARGUMENT, f"{value!r} is not a list of numbers") from None


def _gi(layout: list[dict[str, Any]], number: int) -> dict[str, Any]:
    for gi in layout:
        if gi["id"] == number:
            return gi
    raise LayoutRefusal(NOT_FOUND, f"no GPU instance {number}")


def _create_gi(board: MigBoard, layout: list[dict[str, Any]], smi_id: int,
               start: int) -> list[dict[str, Any]]:
    profile = board.profile(smi_id)
    if profile is None:
        raise LayoutRefusal(INVALID_ARGUMENT, f"no GPU instance profile {smi_id}")
    if start not in profile.starts:
        raise LayoutRefusal(INSUFFICIENT_RESOURCES, f"{start} is not a placement of {smi_id}")
    taken = [(gi, board.profile(gi["profile"])) for gi in layout]
    same = sum(1 for _, p in taken if p is not None and p.smi_id == smi_id)
    if same >= profile.instances:
        raise LayoutRefusal(INSUFFICIENT_RESOURCES,
                            f"the board holds {profile.instances} of profile {smi_id}")
    if profile.media and any(p is not None and p.media for _, p in taken):
        raise LayoutRefusal(INSUFFICIENT_RESOURCES, "the media engines are taken")
    for gi, p in taken:
        if p is not None and _overlap(gi["start"], p.size, start, profile.size):
            raise LayoutRefusal(INSUFFICIENT_RESOURCES,
                                f"placement {start} overlaps GPU instance {gi['id']}")
    if sum(p.slices for _, p in taken if p is not None) + profile.slices > COMPUTE_SLICES:
        raise LayoutRefusal(INSUFFICIENT_RESOURCES, "no compute slices left")
    gi = {"id": gi_id(profile.size, start), "profile": smi_id, "start": start, "compute": []}
    return sorted([*layout, gi], key=lambda g: g["id"])


def _create_ci(board: MigBoard, gi: dict[str, Any], slices: int, start: int) -> None:
    profile: GpuInstanceProfile | None = board.profile(gi["profile"])
    if profile is None or slices not in profile.compute_instances:
        raise LayoutRefusal(INVALID_ARGUMENT, f"no {slices}-slice compute instance here")
    if start % slices or start + slices > profile.slices:
        raise LayoutRefusal(INSUFFICIENT_RESOURCES, f"{start} is not a placement of {slices}")
    for ci in gi["compute"]:
        if _overlap(ci["start"], ci["slices"], start, slices):
            raise LayoutRefusal(INSUFFICIENT_RESOURCES,
                                f"placement {start} overlaps compute instance {ci['id']}")
    gi["compute"] = sorted([*gi["compute"], {"id": start, "slices": slices, "start": start}],
                           key=lambda c: c["id"])


def _overlap(a: int, a_size: int, b: int, b_size: int) -> bool:
    return a < b + b_size and b < a + a_size
