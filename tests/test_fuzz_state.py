"""Random shapes into the desired-state parsers: a result or a ``SpecError``, nothing else.

A profile, topology document or overrides file reaches the daemon through
the file source, where any exception other than ``SpecError`` used to end
the source task, and the daemon with it (whose teardown takes every GPU off
the node).  So each parser gets documents derived from real ones by random
mutations (a value replaced by one of an unexpected type, a key removed, a
key of an odd type added, huge and non-finite numbers, non-ASCII digits,
trailing newlines) and must either return its value or raise ``SpecError``
with messages naming the input.  What parses must also compile, and hash the
same way twice.

The documents are mutated twice over: as parsed values (``mutate``), and as
YAML text (``mutate_text``: lines dropped, doubled, cut or re-indented,
characters flipped, anchors and aliases spliced in, nested alias "bombs"
of random depth and breadth, odd scalars).  The text kind goes through the
bounded reader (``mokka.state.reader``), partly from real files, and must
also never hang: each batch runs under a deadline in a thread the test
abandons if it passes.  Messages must stay short and few, whatever the input.

The generator is the standard library's ``random`` with fixed seeds: every
run tries the same documents, and a failure names the seed and the
mutations that produced it.  ``bench/fuzz_state.py`` runs the same
generator over as many inputs as asked.
"""

from __future__ import annotations

import copy
import datetime
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import yaml

from mokka.errors import SpecError
from mokka.state import checks
from mokka.state.compile import NodeMeta, compile_state, load_inputs
from mokka.state.override_doc import Overrides, parse_overrides, render
from mokka.state.profile import BUILTIN_PROFILES, Profile, parse_profile, read_profile_text
from mokka.state.reader import json_reading, load_yaml
from mokka.state.topology import parse_topology, topology_from_mapping
from tests.support import typed

#: Documents tried per seed; the seeds below multiply it.  Small enough for
#: the suite (a few seconds), large enough that every mutation kind meets
#: every block of every built-in profile many times.
SAMPLES = 400
SEEDS = (1, 2, 3)

ODD_VALUES: tuple[Any, ...] = (
    None, True, False, 0, -1, 255, 2**63, 2**64 + 1, -(10**30), 10**400,
    0.5, -0.0, 1e308, float("nan"), float("inf"), float("-inf"),
    "", " ", "\n", "x" * 300, "\u00b2", "\u0663", "\u0665\u0668\u0660.\u0661\u0660\u0665",
    "0000:01:00.0\n", "GPU-", "GPU-abcdef01-0000-0000-0000-000000000000\n", "pci0000:00\n",
    "9" * 5000, "completed", "lost", "13.0", "1.0", "580.105.08",
    [], [None], [1, "a", {}], {}, {0: 1, "a": 2}, {None: "n"}, {True: 1, "1": 2},
    {datetime.date(2024, 1, 31): "day"}, datetime.date(2024, 1, 31), b"\x00bytes",
    {"nested": {"deeper": [{"deepest": None}]}}, frozenset({1, 2}),
)
ODD_KEYS: tuple[Any, ...] = (
    0, -1, 2**64, None, True, 1.5, datetime.date(2024, 1, 31), "", "\u00b2", "03", "x" * 200,
    "GPU-ABCDEF01-0000-0000-0000-000000000000", "name", "index", "minor_number", "state",
)

PROFILE_DOCS = {name: load_yaml(read_profile_text(name)[1], name) for name in BUILTIN_PROFILES}
TOPOLOGY_DOC: dict[str, Any] = {
    "version": 1,
    "domains": [
        {"name": "rack-a", "uuid": "00000000-0000-0000-0000-0000000000ab",
         "cliques": [{"id": 0, "nodes": ["worker-0", "worker-1"]}, {"id": 1, "nodes": ["w2"]}]},
        {"uuid": "00000000-0000-0000-0000-0000000000cd", "cliques": []},
    ],
}
OVERRIDES_DOC: dict[str, Any] = {
    "version": 1,
    "all": {"thermal": {"temperature_gpu_c": 70}, "utilization": {"gpu": 50},
            "fan": {"speed_pct": 40}, "nvlink_errors": {"3": 5}},
    "devices": {
        "0": {"failure": {"mode": "lost", "after_calls": 3, "probability": 0.5, "seed": 1,
                          "xid": {"code": 79, "id": "abc"}},
              "xids": [{"code": 48}], "fabric": {"state": "completed", "clique_id": 2}},
        "GPU-abcdef01-0000-0000-0000-000000000000": {"power": {"current_draw_mw": 300000}},
    },
}


def containers(doc: Any) -> list[Any]:
    """Every mapping and list in ``doc``, the document itself first."""
    found, stack = [], [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            found.append(node)
            stack.extend(node)
    return found


def mutate(doc: Any, rng: random.Random) -> tuple[Any, list[str]]:
    """A mutated deep copy of ``doc`` and a description of each mutation."""
    doc = copy.deepcopy(doc)
    notes: list[str] = []
    for _ in range(rng.randint(1, 4)):
        node = rng.choice(containers(doc))
        kind = rng.randrange(5)
        if isinstance(node, dict) and node and kind == 0:
            key = rng.choice(list(node))
            del node[key]
            notes.append(f"del {key!r}")
        elif isinstance(node, dict) and kind == 1:
            key, value = rng.choice(ODD_KEYS), rng.choice(ODD_VALUES)
            node[key] = copy.deepcopy(value)
            notes.append(f"add {key!r}: {value!r:.40}")
        elif isinstance(node, list) and node and kind == 2:
            node.append(copy.deepcopy(rng.choice(node)))
            notes.append("repeat a list item")
        elif node:
            key = rng.choice(list(node) if isinstance(node, dict) else range(len(node)))
            value = rng.choice(ODD_VALUES)
            node[key] = copy.deepcopy(value)
            notes.append(f"set {key!r} = {value!r:.40}")
    return doc, notes


def outcome(parse: Callable[[], Any], what: str) -> Any:
    """The parse result, or ``None`` after a well-formed ``SpecError``; anything else fails."""
    try:
        return parse()
    except SpecError as exc:
        problems = exc.problems
    assert problems, what
    assert all(isinstance(p, str) and p.startswith("fuzz.yaml") for p in problems), (
        what, problems)
    return None


def compiled(profile: Profile, **inputs: Any) -> None:
    """Compiling what parsed: a ``State`` (or a ``SpecError``), hashed the same way twice."""
    node = NodeMeta(node_name="worker-0")
    try:
        first = compile_state(profile, node=node, **inputs)
    except SpecError:
        return
    assert first.content_hash == compile_state(profile, node=node, **inputs).content_hash


@pytest.mark.parametrize("seed", SEEDS)
def test_profile_shapes_give_a_profile_or_a_spec_error(seed: int) -> None:
    rng = random.Random(seed)
    parsed = 0
    for i in range(SAMPLES):
        name = rng.choice(BUILTIN_PROFILES)
        doc, notes = mutate(PROFILE_DOCS[name], rng)
        what = f"seed {seed} sample {i}: {name} with {notes}"
        try:
            profile = outcome(lambda d=doc: Profile.from_mapping(d, source="fuzz.yaml"), what)
            if profile is not None:
                parsed += 1
                compiled(profile)
        except AssertionError:
            raise
        except Exception as exc:
            raise AssertionError(f"{what}: {type(exc).__name__}: {exc}") from exc
    # Some mutations leave a valid profile (a pass-through field changed):
    # those must compile too, so the run has to have met some.
    assert parsed > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_topology_shapes_give_a_topology_or_a_spec_error(seed: int) -> None:
    rng = random.Random(seed)
    profile = Profile.from_mapping(PROFILE_DOCS["gb200"], source="gb200.yaml")
    for i in range(SAMPLES):
        doc, notes = mutate({"topology": {"enabled": True, **TOPOLOGY_DOC}}
                            if i % 3 == 0 else TOPOLOGY_DOC, rng)
        what = f"seed {seed} sample {i}: {notes}"
        try:
            topology = outcome(lambda d=doc: topology_from_mapping(d, source="fuzz.yaml"), what)
            if topology is not None:
                topology.placement("worker-0")
                compiled(profile, topology=topology)
        except AssertionError:
            raise
        except Exception as exc:
            raise AssertionError(f"{what}: {type(exc).__name__}: {exc}") from exc


@pytest.mark.parametrize("seed", SEEDS)
def test_overrides_shapes_give_overrides_or_a_spec_error(seed: int) -> None:
    rng = random.Random(seed)
    profile = Profile.from_mapping(PROFILE_DOCS["h100"], source="h100.yaml")
    for i in range(SAMPLES):
        doc, notes = mutate(OVERRIDES_DOC, rng)
        what = f"seed {seed} sample {i}: {notes}"
        try:
            overrides = outcome(lambda d=doc: Overrides.from_mapping(d, source="fuzz.yaml"), what)
            if overrides is not None:
                overrides.to_mapping()
                compiled(profile, overrides=overrides)
        except AssertionError:
            raise
        except Exception as exc:
            raise AssertionError(f"{what}: {type(exc).__name__}: {exc}") from exc


#: Scalars and structures PyYAML builds with plain ``ValueError``s, recursion
#: or not at all: each spliced into an otherwise valid document.
ODD_YAML = (
    "2024-13-45", "!!int abc", "!!float x", "!!timestamp foo", "!!binary xyz", "9" * 5000,
    "&a [*a]", "&b {k: *b}", "[" * 200 + "]" * 200, "[" * 600 + "]" * 600,
    "[" * 2000 + "]" * 2000, "!!set {a, b}",
    "0x" + "f" * 40, "1:20", ".nan", "-.inf", "~", "'\u00b2'", "\"\\x00\"", "{? [a]: 1}",
    # found by bench/fuzz_state.py: PyYAML's IndexError / KeyError on empty typed scalars
    "!!float _", "!!int ''", "!!bool ''", "!!timestamp ''",
    # numbers and strings JSON reads otherwise than YAML 1.1 (``reader.json_reading``)
    "1e5", "1.5e3", "1.5E+3", "-0", "NaN", "Infinity", '"\\ud83d\\ude00"', '"\\u00e9"',
)


@pytest.mark.parametrize("odd", ODD_YAML)
def test_odd_yaml_text_gives_a_value_or_a_spec_error(odd: str) -> None:
    texts = {
        parse_profile: read_profile_text("t4")[1].replace("name: ", f"name: {odd}\n  x_name: ", 1),
        parse_topology: f"version: 1\ndomains: {odd}\n",
        parse_overrides: f"version: 1\nall: {{fan: {odd}}}\n",
    }
    for parse, text in texts.items():
        try:
            outcome(lambda p=parse, t=text: p(t, source="fuzz.yaml"), f"{parse.__name__}: {odd}")
        except AssertionError:
            raise
        except Exception as exc:
            raise AssertionError(f"{parse.__name__} with {odd[:40]!r}: "
                                 f"{type(exc).__name__}: {exc}") from exc


def test_the_fuzz_documents_themselves_are_valid() -> None:
    """The starting points parse, so the mutations are what the tests measure."""
    assert topology_from_mapping(TOPOLOGY_DOC, source="t.yaml") is not None
    assert Overrides.from_mapping(OVERRIDES_DOC, source="o.yaml").devices
    assert parse_overrides(yaml.safe_dump(OVERRIDES_DOC), source="o.yaml") == Overrides(
        **{"all": OVERRIDES_DOC["all"], "devices": OVERRIDES_DOC["devices"]})
    for name, doc in PROFILE_DOCS.items():
        assert Profile.from_mapping(doc, source=f"{name}.yaml").devices


def test_gpu_targets_and_device_keys_never_raise_anything_else(tmp_path) -> None:
    """``mokka ctl --gpu`` and the overrides file's device keys: any text is
    either a key (the same one for both) or a clear refusal."""
    from mokka.ctl.targets import parse_target
    from mokka.errors import CtlError
    from mokka.state.override_doc import device_key

    rng = random.Random(7)
    alphabet = "0123456789abcdefABCDEF-GPU \t\n\u00b2\u0663\u00bd\u2167\uff11x"
    path = tmp_path / "overrides.yaml"  # no engine config beside it: nothing to check against
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
             for _ in range(2000)]
    texts += ["GPU-" + "".join(rng.choice("0123456789abcdef-\u0663") for _ in range(36))
              for _ in range(200)]
    texts += ["9" * n for n in (1, 32, 33, 4301, 5000)]
    accepted = 0
    for text in texts:
        try:
            key = parse_target(text, path)
        except CtlError:
            continue
        accepted += 1
        assert key == "all" or device_key(key) == key, text
    assert accepted > 0


# ---- YAML text -------------------------------------------------------------

#: Text mutations per seed (each input is one of the three kinds); with the
#: value-level runs above the suite tries over 10,000 generated inputs.
TEXT_SAMPLES = 1800
#: Every this many inputs is read from a real file (the reader's path), the
#: rest is parsed from text.
FILE_EVERY = 10
#: The whole batch of one seed must end by then; a hang fails the test
#: instead of stopping the suite.
BATCH_DEADLINE = 240
#: Longest single problem a message may carry: a field path, what was found
#: (cut to a short excerpt) and what was expected (a list of allowed keys).
MAX_PROBLEM_CHARS = 600
FLIP_CHARS = ":-[]{}&*!|>'\"#%@`,? \t\n\x00\u00b2\ufeff\u2028"
TEXT_KINDS = ("profile", "topology", "overrides")


def base_texts() -> dict[str, list[str]]:
    """The starting texts of each kind: every built-in profile, the two other documents."""
    return {
        "profile": [read_profile_text(name)[1] for name in BUILTIN_PROFILES],
        "topology": [yaml.safe_dump(TOPOLOGY_DOC, sort_keys=False),
                     yaml.safe_dump({"topology": {"enabled": True, **TOPOLOGY_DOC}})],
        "overrides": [yaml.safe_dump(OVERRIDES_DOC, sort_keys=False),
                      # as ``mokka ctl`` writes it: JSON, read without YAML where it can be
                      render(Overrides.from_mapping(OVERRIDES_DOC, source="o.yaml"))],
    }


def alias_bomb(rng: random.Random) -> tuple[str, str]:
    """Anchor lines of a nested alias "bomb" of random depth and breadth, and its top alias."""
    levels, fan = rng.randint(1, 14), rng.randint(1, 10)
    lines = [f"x_b0: &b0 [{', '.join(['lol'] * fan)}]"]
    lines += [f"x_b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * fan)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n", f"*b{levels}"


def mutate_text(text: str, rng: random.Random) -> tuple[str, list[str]]:
    """``text`` with one to three random edits, and a description of each."""
    notes: list[str] = []
    for _ in range(rng.randint(1, 3)):
        lines = text.split("\n")
        at = rng.randrange(len(lines))
        kind = rng.randrange(9)
        if kind == 0:
            del lines[at]
            notes.append(f"drop line {at}")
        elif kind == 1:
            lines.insert(at, lines[at])
            notes.append(f"double line {at}")
        elif kind == 2 and ": " in lines[at]:
            # an anchor on one value, an alias of it in place of another value
            key, _, value = lines[at].partition(": ")
            lines[at] = f"{key}: &m{at} {value}"
            other = rng.randrange(len(lines))
            if ": " in lines[other] and other != at:
                key2, _, _ = lines[other].partition(": ")
                lines[other] = f"{key2}: *m{at}"
            notes.append(f"anchor line {at}, alias line {other}")
        elif kind == 3 and ": " in lines[at]:
            bomb, alias = alias_bomb(rng)
            key, _, _ = lines[at].partition(": ")
            lines[at] = f"{key}: {alias}"
            lines.insert(0, bomb)
            notes.append(f"alias bomb {alias} at line {at}")
        elif kind == 4 and ": " in lines[at]:
            key, _, value = lines[at].partition(": ")
            odd = rng.choice(ODD_YAML)
            # a JSON line keeps the comma that ends it, so the text stays JSON
            lines[at] = f"{key}: {odd}{',' if value.endswith(',') else ''}"
            notes.append(f"line {at} = {odd[:30]!r}")
        elif kind == 5:
            joined = "\n".join(lines)
            cut = rng.randrange(len(joined) + 1)
            notes.append(f"cut at {cut}")
            text = joined[:cut]
            continue
        elif kind == 6:
            spaces = rng.choice((0, 1, 3, 8))
            lines[at] = " " * spaces + lines[at].lstrip(" ")
            notes.append(f"indent line {at} by {spaces}")
        elif kind == 7 and lines[at]:
            pos = rng.randrange(len(lines[at]))
            char = rng.choice(FLIP_CHARS)
            lines[at] = lines[at][:pos] + char + lines[at][pos + 1:]
            notes.append(f"line {at} col {pos} = {char!r}")
        else:
            lines.insert(at, f"{rng.choice(ODD_KEYS)!s}: {rng.choice(ODD_YAML)}")
            notes.append(f"insert at line {at}")
        text = "\n".join(lines)
    return text, notes


def text_outcome(kind: str, text: str, directory: Path | None) -> str:
    """One text input parsed (from a file in ``directory`` when given): ``ok`` or ``refused``.

    Anything but a value or a well-formed ``SpecError`` raises
    ``AssertionError``: each problem names the input, is short, and there
    are at most ``MAX_PROBLEMS`` of them (plus the count of the rest).
    """
    source = "fuzz.yaml"
    if kind == "overrides":
        json_reads_as_yaml(text)
    try:
        if directory is not None:
            path = directory / source
            path.write_text(text, encoding="utf-8", errors="surrogatepass")
            source = str(path)
            args = {"profile": (path, None, None), "topology": ("t4", path, None),
                    "overrides": ("h100", None, path)}[kind]
            profile, topology, overrides = load_inputs(*args)
        else:
            parse = {"profile": parse_profile, "topology": parse_topology,
                     "overrides": parse_overrides}[kind]
            value = parse(text, source=source)
            profile = value if kind == "profile" else Profile.from_mapping(
                PROFILE_DOCS["gb200" if kind == "topology" else "h100"], source="base.yaml")
            topology = value if kind == "topology" else None
            overrides = value if kind == "overrides" else None
    except SpecError as exc:
        problems = exc.problems
        assert problems
        assert len(problems) <= checks.MAX_PROBLEMS + 1, problems[-1]
        for problem in problems:
            assert problem.startswith(source), problem[:200]
            assert len(problem) <= MAX_PROBLEM_CHARS, problem[:200]
        return "refused"
    compiled(profile, topology=topology, overrides=overrides)
    return "ok"


def json_reads_as_yaml(text: str) -> None:
    """A text the JSON reading takes must read the same to YAML, where YAML reads it at all."""
    doc = json_reading(text)
    if doc is None:
        return
    try:
        other = load_yaml(text, "fuzz.yaml")
    except SpecError:
        return  # JSON is laxer about line breaks inside a mapping; the meaning is not at stake
    assert typed(doc) == typed(other), "the JSON and the YAML reading of this text differ"


@attrs.define
class FuzzRun:
    """What one run of ``run_text_fuzz`` met (the bench prints it; tests check the counts)."""

    ok: int = 0
    refused: int = 0
    #: the slowest single input: seconds, and which one it was
    slowest: float = 0.0
    slowest_what: str = ""


def run_text_fuzz(seed: int, samples: int) -> FuzzRun:
    """``samples`` text inputs from ``seed``; ``AssertionError`` names the first bad outcome."""
    rng = random.Random(seed)
    bases = base_texts()
    run = FuzzRun()
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(samples):
            kind = rng.choice(TEXT_KINDS)
            text, notes = mutate_text(rng.choice(bases[kind]), rng)
            what = f"seed {seed} sample {i}: {kind} with {notes}"
            directory = Path(scratch) if i % FILE_EVERY == 0 else None
            started = time.perf_counter()
            try:
                result = text_outcome(kind, text, directory)
            except AssertionError as exc:
                raise AssertionError(f"{what}: {exc}") from exc
            except Exception as exc:
                raise AssertionError(f"{what}: {type(exc).__name__}: {exc}") from exc
            took = time.perf_counter() - started
            setattr(run, result, getattr(run, result) + 1)
            if took > run.slowest:
                run.slowest, run.slowest_what = took, what
    return run


@pytest.mark.parametrize("seed", SEEDS)
async def test_yaml_text_gives_a_value_or_a_short_spec_error_and_never_hangs(seed: int) -> None:
    with trio.fail_after(BATCH_DEADLINE):
        run = await trio.to_thread.run_sync(
            run_text_fuzz, seed, TEXT_SAMPLES, abandon_on_cancel=True)
    assert run.ok + run.refused == TEXT_SAMPLES
    # both outcomes are met: the mutations neither all break nor all miss
    assert run.ok > 0
    assert run.refused > 0
