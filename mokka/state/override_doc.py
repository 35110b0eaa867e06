"""The runtime overrides document: its model, its validation and its text.

```yaml
version: 1
all: {thermal: {temperature_gpu_c: 70}}          # merged into every device
devices:
  "0": {failure: {mode: ecc_uncorrectable, after_calls: 1, xid: {code: 79}}}
  "GPU-0a1b…": {utilization: {gpu: 90}}          # by per-node UUID
```

Compilation merges ``profile device < all < devices[index] < devices[uuid]``
(``mokka.state.compile``).  Parsing is strict: every key must be one the
schema (``mokka.state.override_schema``) knows, and identity fields are
refused, so a typo is an error at write time rather than a silent no-op.

The file is YAML, and Mokka writes it as JSON, which is YAML too: the
standard library reads JSON back, so ``mokka ctl`` loads no YAML library
for a file it wrote (``render``, ``reader.load_json_or_yaml``).  A file
written by hand in any YAML style is read as before.  The file itself (the
lock, the writes, the reset) is ``mokka.state.overrides``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mokka.errors import SpecError
from mokka.state import checks
from mokka.state.checks import Problems, sub
from mokka.state.override_schema import check_patch
from mokka.state.reader import json_reading, load_json_or_yaml, shape_problem

TOP_LEVEL_KEYS = ("version", "all", "devices")
#: Digits a device index key may have: far more than any GPU count, far
#: fewer than ``int``'s limit on converting text.
_MAX_INDEX_DIGITS = 32

#: Tells whoever opens the file by hand that it is generated and short-lived.
HEADER = (
    "# Runtime overrides of the mock GPUs, written by `mokka ctl` (edits are validated there).\n"
    "# A restart of the node agent resets this file.\n"
)


class Overrides:
    """A validated overrides document (immutable).

    Device keys are normalized (``device_key``), so ``0``, ``"0"`` and
    ``"00"`` are one key and a UUID is one key in any case.  The patches
    themselves are stored as written: they are merged into the device config
    by the compiler, and the schema has already vouched for them.

    A plain class, not an attrs one like the other models: every ``mokka
    ctl`` call builds one, and attrs alone is about a fifth of what such a
    process would load.  Equality is on the content (``source`` left out,
    so the same content read from two places compares equal).
    """

    __slots__ = ("all", "devices", "source", "version")

    #: always 1: ``from_mapping`` refuses any other version
    version: int
    #: merged into every device
    all: Mapping[str, Any]
    #: per device: key ``"<index>"`` or a GPU UUID (``GPU-`` + lower-case hex)
    devices: Mapping[str, Mapping[str, Any]]
    #: the path it was read from, for messages
    source: str

    def __init__(self, *, version: int = 1, all: Mapping[str, Any] | None = None,
                 devices: Mapping[str, Mapping[str, Any]] | None = None,
                 source: str = "") -> None:
        for name, value in (("version", version), ("all", {} if all is None else all),
                            ("devices", {} if devices is None else devices),
                            ("source", source)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Overrides is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Overrides is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.version, self.all, self.devices) == (
            other.version, other.all, other.devices)  # type: ignore[attr-defined]

    # its mappings are not hashable, so neither is it (as with attrs' frozen classes of them)
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Overrides(version={self.version!r}, all={self.all!r}, "
                f"devices={self.devices!r}, source={self.source!r})")

    @classmethod
    def from_mapping(cls, doc: Any, *, source: str) -> Overrides:
        """Validate ``yaml.safe_load`` output; an empty document is an empty overrides.

        The document's shape is bounded first (``reader.shape_problem``: depth,
        size, no cycle), as the reader bounds a file's: ``mokka ctl`` hands in
        a document it edited in memory, and every check below recurses.
        """
        if doc is None:
            return cls(source=source)
        problem = shape_problem(doc)
        if problem is not None:
            raise SpecError(f"{source}: {problem}")
        p = Problems(source)
        top = checks.as_mapping(p, "(document)", doc)
        p.raise_if_any()
        assert top is not None
        top = checks.normalize_numbers(top)
        checks.check_keys(p, "", top, TOP_LEVEL_KEYS)
        version = checks.require(p, "", top, "version", "1")
        if version is not None and (isinstance(version, bool) or version != 1):
            p.add("version", f"{checks.found(version)} is not supported, expected 1")
        all_patch: dict[str, Any] = {}
        if top.get("all") is not None:
            all_patch = checks.as_mapping(p, "all", top["all"]) or {}
            check_patch(p, "all", all_patch)
        devices: dict[str, dict[str, Any]] = {}
        raw_devices = top.get("devices")
        if raw_devices is not None:
            for key, patch in (checks.as_mapping(p, "devices", raw_devices) or {}).items():
                norm = device_key(key)
                path = sub("devices", str(key))
                if norm is None:
                    p.add(path, f"{checks.found(key)} is not a GPU index or a GPU UUID "
                          "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
                    continue
                if norm in devices:
                    p.add(path, f"{key!r} names the same GPU as another key")
                    continue
                # ``"0":`` with nothing below it (left after an edit) is an empty patch
                patch_map = checks.as_mapping(p, path, patch) if patch is not None else {}
                if patch_map is None:
                    continue
                check_patch(p, path, patch_map)
                devices[norm] = patch_map
        p.raise_if_any()
        return cls(version=1, all=all_patch, devices=devices, source=source)

    @property
    def empty(self) -> bool:
        """No patch with any content: the same node as having no overrides file.

        ``compile.content_hash`` hashes an empty document like a missing one,
        so ``mokka ctl reset`` brings back the very hash (and generation) the
        node had before the first edit, and the source publishes nothing new.
        """
        return not self.all and not any(self.devices.values())

    def to_mapping(self) -> dict[str, Any]:
        """The canonical document (what ``render`` writes, what hashing reads).

        A deep copy: ``update_overrides`` hands it to the caller's ``change``,
        which edits it in place, and this frozen value must not change with it.
        """
        doc: dict[str, Any] = {"version": self.version}
        if self.all:
            doc["all"] = checks.deep_merge({}, self.all)
        if self.devices:
            doc["devices"] = {k: checks.deep_merge({}, v) for k, v in self.devices.items()}
        return doc

    def layers_for(self, index: int, uuid: str) -> list[tuple[str, Mapping[str, Any]]]:
        """The patches that apply to one GPU, weakest first, each with its label.

        A UUID key beats an index key: the UUID names one GPU on one node
        for good, while an index names whichever GPU sits in that slot.  The
        label (``devices.0``) places an Xid entry for its stable id.
        """
        layers: list[tuple[str, Mapping[str, Any]]] = []
        if self.all:
            layers.append(("all", self.all))
        for key in (str(index), device_key(uuid)):
            if self.devices.get(key):
                layers.append((f"devices.{key}", self.devices[key]))
        return layers


def device_key(key: Any) -> str | None:
    """Normalize a ``devices`` key: an index (``0``, ``"0"``) or a GPU UUID; ``None`` if neither.

    YAML gives an unquoted ``0:`` as an int and a quoted one as a string;
    both become ``"0"``.  UUIDs become lower-case hex after ``GPU-``, the
    spelling ``mokka.state.identity`` produces, so a pasted upper-case UUID
    still matches its GPU.
    """
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return str(key)
    if isinstance(key, str):
        # ASCII digits only: ``str.isdigit`` also says yes to ``"²"``, which
        # ``int`` refuses; and a key of thousands of digits is no index
        # either (``int`` refuses those too, beyond its 4300-digit limit).
        if key.isascii() and key.isdigit() and len(key) <= _MAX_INDEX_DIGITS:
            return str(int(key))
        if checks.GPU_UUID_RE.fullmatch(key):
            return "GPU-" + key[4:].lower()
    return None


def parse_overrides(text: str, *, source: str) -> Overrides:
    """Parse and validate an overrides file's text; ``SpecError`` lists every problem."""
    return Overrides.from_mapping(load_json_or_yaml(text, source), source=source)


def render(overrides: Overrides) -> str:
    """The file's text: the header, then the canonical document, as JSON where JSON holds it.

    JSON is YAML too (every YAML reader of the file reads the same values),
    and the standard library reads it back (``reader.load_json_or_yaml``):
    ``mokka ctl`` then never loads PyYAML for its own file.  A document
    JSON would not give back exactly (an open subtree's int keys or dates,
    a float YAML spells otherwise) is written as YAML instead.
    """
    doc = overrides.to_mapping()
    try:
        text = json.dumps(doc, indent=2, ensure_ascii=True) + "\n"
    except (TypeError, ValueError):  # a value JSON has no type for (a date), an int too long
        text = ""
    if text and json_reading(text) == doc:
        return HEADER + text
    # imported here, as in ``reader.load_yaml``: a JSON document never needs it
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's emitter when there
    return HEADER + yaml.dump(doc, Dumper=dumper, sort_keys=False, default_flow_style=False)
