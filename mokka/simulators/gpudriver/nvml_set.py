"""The NVML setters' changes: what a ``SET`` request over the NVML socket does.

``nvidia-smi -pm 1``, ``nvmlDeviceSetPowerManagementLimit`` and the other
setters change the board for every process on the node, and a real board
keeps the change until the driver reloads.  The mock library cannot write
that anywhere itself (a container's driver root is read-only, and the
engine config is the daemon's rendering of its inputs), so it sends the
change to the daemon over the socket it already reads through
(``nvml_socket``)::

    MOKKA-NVML 1 SET <gpu uuid> <key> <value>\\n
    MOKKA-NVML 1 OK\\n
    MOKKA-NVML 1 ERROR <nvml return code> <reason>\\n

and the daemon applies it as root's write to a real board is applied: into
the runtime overrides file, the node's runtime state (``nvml_setter``,
the locked, recorded write ``mokka ctl`` makes), as the GPU's ``devices
["<uuid>"]`` layer.  The next reconcile pass renders it into the engine
config, so every process on the node, on the host or in a container, reads
it; it survives the caller; the daemon's reset of the overrides file at
start and stop forgets it, as a driver reload does.  The answer comes once
the daemon's state holds the change (or a later change of the same field
replaced it: the last writer wins, as on a board), so the caller's next
query, from any process, sees it.  docs/nvml.md, "Setters", says why this
file and not one of its own.

This module is the pure half: which requests parse (``parse_set``) and
what each does to the GPU's fields (``plan``), given the state the daemon
serves.  The rules are the board's: a power limit within its constraints,
ECC mode pending until a reset, MIG mode as the MIG user guide says of the
board (``_mig_mode``), a reset refused while processes hold the GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from mokka.state import mig_layout, mig_profiles
from mokka.state.model import Gpu, State
from mokka.state.override_doc import device_key

#: NVML return codes the daemon answers with (``nvmlReturn_t`` in ``nvml.h``).
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
IN_USE = 19
UNKNOWN = 999

#: ``SET``, a GPU UUID as the daemon hands them out, a key of the library's
#: and a value of words, digits and commas: anything else is not a request.
_SET = re.compile(
    rb"MOKKA-NVML 1 SET (GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}) "
    rb"([a-z_]{1,32}) ([a-z0-9_,]{1,32})\n\Z"
)
_ENABLE = ("enabled", "disabled")
_COMPUTE_MODES = ("default", "exclusive_thread", "prohibited", "exclusive_process")
_PAIR = re.compile(r"([0-9]{1,9}),([0-9]{1,9})\Z")
_NUMBER = re.compile(r"[0-9]{1,10}\Z")


@attrs.frozen
class SetRequest:
    uuid: str
    key: str
    value: str


@attrs.frozen
class Refusal(Exception):
    """The board's answer to a change it does not take: an NVML code and why."""

    code: int
    reason: str


@attrs.frozen
class Change:
    """What one request does: ``patch`` merged into the GPU's ``devices["<uuid>"]`` layer."""

    patch: Mapping[str, Any]

    def applied(self, fields: Mapping[str, Any]) -> bool:
        """Whether the GPU's resolved fields hold the patch."""
        return _holds(fields, self.patch)


def parse_set(line: bytes) -> SetRequest | None:
    """The request a ``SET`` line makes, or ``None`` when it is malformed."""
    match = _SET.match(line)
    if match is None:
        return None
    uuid, key, value = (part.decode() for part in match.groups())
    return SetRequest(uuid=uuid, key=key, value=value)


def gpu_of(state: State, uuid: str) -> tuple[int, Gpu]:
    """The GPU with ``uuid`` and its position in the engine config."""
    for position, gpu in enumerate(state.gpus):
        if gpu.uuid.lower() == uuid.lower():
            return position, gpu
    raise Refusal(NOT_FOUND, f"no GPU {uuid} on this node")


def plan(gpu: Gpu, request: SetRequest, *, processes: int) -> Change:
    """The change ``request`` makes to ``gpu``; ``Refusal`` with the board's code.

    ``processes``: how many processes hold the GPU now (a reset is refused then).
    """
    fields = gpu.fields
    key, value = request.key, request.value
    if key in ("persistence_mode", "accounting_mode", "drain_state"):
        _choice(value, _ENABLE)
        if key == "accounting_mode":
            return Change({"accounting": {"mode": value}})
        return Change({key: value})
    if key == "accounting_pids":
        _choice(value, ("clear",))
        # No accounting records are kept: clearing them changes nothing
        # but is allowed as on a board with accounting on or off.
        return Change({})
    if key == "compute_mode":
        _choice(value, _COMPUTE_MODES)
        return Change({"compute_mode": value})
    if key == "power_limit_mw":
        limit = _number(value)
        power = _block(fields, "power")
        lo, hi = power.get("min_limit_mw"), power.get("max_limit_mw")
        if lo is None or hi is None:
            raise Refusal(NOT_SUPPORTED, "the board has no power limit constraints")
        if not int(lo) <= limit <= int(hi):
            raise Refusal(INVALID_ARGUMENT, f"power limit {limit} mW is outside {lo}..{hi} mW")
        return Change({"power": {"enforced_limit_mw": limit}})
    if key == "applications_clocks":
        return Change({"clocks": _applications_clocks(_block(fields, "clocks"), value)})
    if key in ("locked_gpu_clocks", "locked_memory_clocks"):
        kind = "graphics" if key == "locked_gpu_clocks" else "memory"
        return Change({"clocks": _locked_clocks(_block(fields, "clocks"), kind, value)})
    if key == "mig_mode":
        return _mig_mode(gpu, value, processes)
    if key in mig_layout.KEYS:
        try:
            layout = mig_layout.plan(gpu.name, _block(fields, "mig"), key, value)
        except mig_layout.LayoutRefusal as refusal:
            raise Refusal(refusal.code, refusal.reason) from None
        return Change({"mig": {"instances": layout}})
    ecc = _block(fields, "ecc")
    if key in ("ecc_mode", "ecc_counts") and ecc.get("mode_current") is None:
        raise Refusal(NOT_SUPPORTED, "the board has no ECC")
    if key == "ecc_mode":
        _choice(value, _ENABLE)
        # The mode changes at the next reset, as the driver applies it.
        return Change({"ecc": {"mode_pending": value}})
    if key == "ecc_counts":
        _choice(value, ("volatile", "aggregate"))
        return Change({"ecc": {"errors": {value: _zeros(_block(ecc, "errors").get(value))}}})
    if key == "reset":
        _choice(value, ("gpu",))
        if processes:
            raise Refusal(IN_USE, f"{processes} processes hold the GPU")
        patch: dict[str, Any] = {}
        if ecc.get("mode_current") is not None:
            pending = ecc.get("mode_pending") or ecc["mode_current"]
            volatile = _zeros(_block(ecc, "errors").get("volatile"))
            patch["ecc"] = {"mode_current": pending, "mode_pending": pending,
                            **({"errors": {"volatile": volatile}} if volatile else {})}
        mig = _block(fields, "mig")
        if mig.get("mode_current") is not None:
            pending = mig.get("mode_pending") or mig["mode_current"]
            patch["mig"] = {"mode_current": pending, "mode_pending": pending}
            # A reset destroys the GPU's GPU and compute instances (the MIG
            # user guide: they do not persist across a reset).
            if mig_layout.current(gpu.name, mig):
                patch["mig"]["instances"] = []
        return Change(patch)
    raise Refusal(NOT_SUPPORTED, f"no setter {key!r}")


def _mig_mode(gpu: Gpu, value: str, processes: int) -> Change:
    """MIG mode: at once on an idle board that resets itself, else pending.

    The A100 applies a MIG mode change at the next reset ("Deployment
    Considerations" in the MIG user guide); later boards reset themselves
    when no process holds the GPU, and keep the change pending while one
    does (nvidia-smi's "pending enable state ... In use by another client").
    """
    _choice(value, _ENABLE)
    table = mig_profiles.board(gpu.name)
    if _block(gpu.fields, "mig").get("mode_current") is None or table is None:
        raise Refusal(NOT_SUPPORTED, "the board is not MIG capable")
    if value == "disabled" and mig_layout.current(gpu.name, _block(gpu.fields, "mig")):
        raise Refusal(IN_USE, "GPU instances exist")
    if table.reset_for_mode or processes:
        return Change({"mig": {"mode_pending": value}})
    return Change({"mig": {"mode_current": value, "mode_pending": value}})


def _choice(value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise Refusal(INVALID_ARGUMENT, f"{value!r} is not one of {', '.join(allowed)}")


def _number(value: str) -> int:
    if not _NUMBER.match(value):
        raise Refusal(INVALID_ARGUMENT, f"{value!r} is not a number")
    return int(value)


def _block(fields: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    block = fields.get(key)
    return block if isinstance(block, Mapping) else {}


def _pair(value: str) -> tuple[int, int]:
    match = _PAIR.match(value)
    if match is None:
        raise Refusal(INVALID_ARGUMENT, f"{value!r} is not two clocks in MHz")
    return int(match[1]), int(match[2])


def _applications_clocks(clocks: Mapping[str, Any], value: str) -> dict[str, Any]:
    """``memory,graphics`` within the board's maxima, or ``default``: the board's defaults."""
    if clocks.get("graphics_app") is None or clocks.get("memory_app") is None:
        raise Refusal(NOT_SUPPORTED, "the board has no applications clocks")
    if value == "default":
        return {"memory_app": clocks.get("memory_app_default", clocks["memory_app"]),
                "graphics_app": clocks.get("graphics_app_default", clocks["graphics_app"])}
    memory, graphics = _pair(value)
    for name, mhz, most in (("memory", memory, clocks.get("memory_max")),
                            ("graphics", graphics, clocks.get("graphics_max"))):
        if mhz == 0 or (most is not None and mhz > int(most)):
            raise Refusal(INVALID_ARGUMENT, f"{name} clock {mhz} MHz is not a supported clock")
    return {"memory_app": memory, "graphics_app": graphics}


def _locked_clocks(clocks: Mapping[str, Any], kind: str, value: str) -> dict[str, Any]:
    """``min,max`` within the board's maximum, or ``default`` (unlocked: both 0)."""
    if value == "default":
        return {f"locked_{kind}_min": 0, f"locked_{kind}_max": 0}
    low, high = _pair(value)
    most = clocks.get(f"{kind}_max")
    if low > high or (most is not None and high > int(most)):
        raise Refusal(INVALID_ARGUMENT, f"{low}..{high} MHz is not a {kind} clock range "
                      f"of this board (at most {most} MHz)")
    return {f"locked_{kind}_min": low, f"locked_{kind}_max": high}


def _zeros(counts: Any) -> Any:
    """The same counters, every one 0."""
    if isinstance(counts, Mapping):
        return {k: _zeros(v) for k, v in counts.items()}
    return 0 if counts is not None else None


def _holds(fields: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    for key, want in patch.items():
        have = fields.get(key)
        if isinstance(want, Mapping):
            if not isinstance(have, Mapping) or not _holds(have, want):
                return False
        elif want is not None and have != want:
            return False
    return True


def apply_to(doc: dict[str, Any], uuid: str, patch: Mapping[str, Any]) -> None:
    """Merge ``patch`` into the ``devices["<uuid>"]`` layer of an overrides document."""
    devices = doc.setdefault("devices", {})
    layer = devices.setdefault(device_key(uuid) or uuid, {})
    _merge(layer, patch)


def _merge(into: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, Mapping):
            child = into.get(key)
            if not isinstance(child, dict):
                child = into[key] = {}
            _merge(child, value)
        elif value is not None:
            into[key] = value
