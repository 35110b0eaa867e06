"""Every value of a built-in profile has a named source (``mokka.state.profile_sources``).

Each built-in profile's ``sources:`` note names, per group of fields, where
the values come from; a field no group claims, or a group the note leaves
out, is reported by name.  The note's shape is checked where the profile is
read, and the note is not part of the compiled state.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mokka.errors import SpecError
from mokka.state.compile import NodeMeta, compile_state
from mokka.state.profile import BUILTIN_PROFILES, load_profile, parse_profile
from mokka.state.profile_files import read_profile_text
from mokka.state.profile_sources import (
    FIELD_GROUPS,
    GROUPS,
    group_of,
    stated_fields,
    unsourced_fields,
)

ROOT = Path(__file__).resolve().parent.parent


def _with_note(note: str) -> str:
    """The t4 profile with its ``sources:`` note replaced by ``note`` (YAML text)."""
    _, text = read_profile_text("t4")
    head = text.split("\nsources:\n", 1)[0]
    return f"{head}\n{note}"


def _problems(text: str) -> tuple[str, ...]:
    with pytest.raises(SpecError) as info:
        parse_profile(text, source="t4.yaml")
    return info.value.problems


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_every_value_of_a_built_in_profile_has_a_named_source(profile: str) -> None:
    loaded = load_profile(profile)
    fields = list(stated_fields(loaded.document))
    assert len(fields) > 100, fields  # the whole profile was walked, not a part of it
    assert unsourced_fields(loaded.document, loaded.sources) == []
    for group, entries in loaded.sources.items():
        assert entries, group
        assert all(e.what.strip() and e.source.strip() for e in entries), group


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_a_source_in_the_tree_exists(profile: str) -> None:
    """A source that names a file of this repository names one that is there."""
    named = {e.source.split(":")[0].split()[0] for entries in load_profile(profile).sources
             .values() for e in entries if e.source.startswith(("tests/", "docs/"))}
    assert f"tests/data/nvidia-smi/qx-{profile}.xml" in named
    for path in named:
        assert (ROOT / path).is_file(), path


def test_a_field_without_a_group_is_named() -> None:
    _, text = read_profile_text("t4")
    text = text.replace("device_defaults:\n", "device_defaults:\n  coolant_flow_lpm: 3\n", 1)
    loaded = parse_profile(text, source="t4.yaml")
    assert unsourced_fields(loaded.document, loaded.sources) == [
        "device.coolant_flow_lpm: no group claims it, expected an entry in "
        "mokka.state.profile_sources.FIELD_GROUPS"
    ]


def test_a_group_the_note_leaves_out_names_each_of_its_fields() -> None:
    loaded = load_profile("t4")
    without = {g: e for g, e in loaded.sources.items() if g != "power"}
    missing = unsourced_fields(loaded.document, without)
    assert missing
    assert all(line.endswith("group power names no source, expected sources.power in the "
                             "profile") for line in missing)
    assert "device.power.max_limit_mw: group power names no source, expected sources.power " \
           "in the profile" in missing


def test_the_most_specific_path_decides_the_group() -> None:
    assert group_of("device.clocks.graphics_max") == "clocks"
    assert group_of("device.clocks.graphics_current") == "readings"
    assert group_of("device.supported_clocks.memory_clocks.graphics_clocks") == "clocks"
    assert group_of("pcie_topology.root_complexes.cpulist") == "layout"
    assert group_of("device.no_such_field") is None
    assert set(FIELD_GROUPS.values()) == set(GROUPS)


def test_device_entries_and_lists_of_mappings_are_walked_without_indices() -> None:
    doc = {"device_defaults": {"pci": {"device_id": 1}},
           "devices": [{"index": 0, "pci": {"bus_id": "0000:01:00.0"}}, {"index": 1}],
           "pcie_topology": {"root_complexes": [{"id": "pci0000:00", "devices": ["a", "b"]}]}}
    assert list(stated_fields(doc)) == [
        "device.pci.device_id", "device.index", "device.pci.bus_id",
        "pcie_topology.root_complexes.id", "pcie_topology.root_complexes.devices",
    ]


@pytest.mark.parametrize(
    ("note", "problem"),
    [
        ("sources:\n  coolant:\n  - {what: a, source: b}\n",
         "t4.yaml: sources.coolant: unknown group, expected one of: " + ", ".join(GROUPS)),
        ("sources:\n  power: []\n",
         "t4.yaml: sources.power: empty list, expected at least one {what, source}"),
        ("sources:\n  power:\n  - {what: limits}\n",
         "t4.yaml: sources.power[0].source: missing, expected one line of text"),
        ("sources:\n  power:\n  - {what: limits, source: datasheet, url: x}\n",
         "t4.yaml: sources.power[0].url: unknown key, expected one of: source, what"),
        ("sources:\n  power:\n  - {what: limits, source: estimate}\n",
         "t4.yaml: sources.power[0].source: 'estimate' gives no reason, expected "
         "'estimate, because <why no document gives the value>'"),
        ("sources:\n  power:\n  - {what: limits, source: 70}\n",
         "t4.yaml: sources.power[0].source: 70 is not a string"),
        ("sources:\n  power: datasheet\n", "t4.yaml: sources.power: "),
        ("sources: [power]\n", "t4.yaml: sources: "),
    ],
)
def test_a_malformed_note_is_refused_naming_file_field_and_expectation(
    note: str, problem: str
) -> None:
    problems = _problems(_with_note(note))
    assert len(problems) == 1, problems
    assert problems[0].startswith(problem), problems


def test_a_note_is_accepted_with_an_estimate_that_says_why() -> None:
    text = _with_note("sources:\n  power:\n  - what: limits\n"
                      "    source: estimate, because no datasheet gives them\n")
    loaded = parse_profile(text, source="t4.yaml")
    (entry,) = loaded.sources["power"]
    assert entry.is_estimate
    assert "sources" not in loaded.document


def test_the_note_is_not_part_of_the_compiled_state() -> None:
    """Editing the note publishes nothing new: the content hash and the fields the
    state keeps are those of the profile without it."""
    _, text = read_profile_text("t4")
    doc = yaml.safe_load(text)
    edited = _with_note("sources:\n  power:\n  - {what: limits, source: a datasheet}\n")
    node = NodeMeta(node_name="worker-1")
    states = [compile_state(parse_profile(t, source="t4.yaml"), node=node)
              for t in (text, edited)]
    assert states[0].content_hash == states[1].content_hash
    assert "sources" in doc
    assert "sources" not in states[0].profile_fields
    changed = text.replace("current_draw_mw: 33510", "current_draw_mw: 33511", 1)
    assert compile_state(parse_profile(changed, source="t4.yaml"), node=node).content_hash \
        != states[0].content_hash
