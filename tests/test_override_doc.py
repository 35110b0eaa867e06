"""The overrides file's text: JSON where JSON holds the document, read back the same.

Mokka writes the file as JSON (YAML too) so that ``mokka ctl`` reads it
back with the standard library (``reader.json_reading``); a document JSON
would change (an open subtree's int keys, a date, a float YAML spells
otherwise) is written as YAML.  Either way, every reader must get the very
document back, and Mokka's YAML reading of a JSON text must agree with the
JSON reading wherever the latter answers.
"""

from __future__ import annotations

import pytest
import yaml

from mokka.errors import SpecError
from mokka.state.override_doc import HEADER, Overrides, parse_overrides, render
from mokka.state.reader import MAX_DEPTH, json_reading, load_json_or_yaml, load_yaml
from tests.support import typed

#: JSON texts Mokka's YAML reading reads to the same values.
ALIKE = [
    "{}",
    HEADER + '{\n  "version": 1,\n  "all": {"thermal": {"temperature_gpu_c": 70}}\n}\n',
    '\n# a comment\n   \n{"a": 1}',
    '{"a": -0, "b": 12345678901234567890123, "c": -7}',
    '{"a": 1.5, "b": -0.25, "c": 1.5E+3, "d": 2.0e-2, "e": 0.0}',
    '{"a": true, "b": false, "c": null}',
    r'{"a": "x\/y\b\f\n\r\t\u0001\u00e9\"\\", "b": "", "c": "GPU-0a1b"}',
    '{"a": [], "b": {}, "c": [1, "two", [3.5, {"d": null}]]}',
    '{"a": 1, "a": 2}',
    '{"0": {"thermal": {"temperature_gpu_c": 91}}, "10": 1}',
    '{"a":\t1 ,"b" :2}',
    '{"deep": ' + '{"x": ' * (MAX_DEPTH - 2) + "1" + "}" * (MAX_DEPTH - 1),
]
#: JSON texts YAML reads to other values (or refuses), and so left to YAML.
OTHERWISE = [
    '{"a": 1e5}',  # a string to YAML 1.1: no dot
    '{"a": 1.5e3}',  # a string to YAML 1.1: the exponent has no sign
    '{"a": NaN}',
    '{"a": -Infinity}',
    r'{"a": "\ud83d\ude00"}',  # one character to JSON, two to YAML
    '{"a": "caf\u00e9"}',  # non-ASCII text
    '{"a": "\x7f"}',
    "[1, 2]",
    '--- {"a": 1}',
    '{"a": 1} # a comment after',
    '{"a": 1,}',
    "{a: 1}",
]


@pytest.mark.parametrize("text", ALIKE)
def test_json_reads_what_yaml_reads(text: str) -> None:
    doc = json_reading(text)
    assert doc is not None
    assert typed(doc) == typed(load_yaml(text, "t.yaml"))
    assert typed(load_json_or_yaml(text, "t.yaml")) == typed(doc)


@pytest.mark.parametrize("text", OTHERWISE)
def test_what_yaml_reads_otherwise_is_left_to_yaml(text: str) -> None:
    assert json_reading(text) is None
    try:
        expected = ("value", typed(load_yaml(text, "t.yaml")))
    except SpecError as exc:
        expected = ("error", str(exc))
    try:
        found = ("value", typed(load_json_or_yaml(text, "t.yaml")))
    except SpecError as exc:
        found = ("error", str(exc))
    assert found == expected


def test_json_nested_too_deep_is_refused_as_yaml_would_be() -> None:
    deep = '{"a": ' * (MAX_DEPTH + 5) + "1" + "}" * (MAX_DEPTH + 5)
    with pytest.raises(SpecError, match=r"^t\.yaml: .*deep"):
        load_json_or_yaml(deep, "t.yaml")
    # deeper than the JSON parser itself goes: YAML's reading reports it
    abyss = '{"a": ' * 100_000 + "1" + "}" * 100_000
    assert json_reading(abyss) is None
    with pytest.raises(SpecError, match=r"^t\.yaml: "):
        load_json_or_yaml(abyss, "t.yaml")


#: Documents as ``mokka ctl`` verbs leave them.
PLAIN = [
    {"version": 1},
    {"version": 1, "all": {"thermal": {"temperature_gpu_c": 70}}},
    {"version": 1, "devices": {
        "0": {"failure": {"mode": "ecc_uncorrectable", "after_calls": 1, "xid": {"code": 79}}},
        "3": {"xids": [{"code": 79, "id": "35993c6c949c2203"}, {"code": 48, "id": "a1"}]},
        "GPU-0a1b0000-0000-0000-0000-000000000000": {
            "failure": {"mode": "fallen_off_bus", "probability": 0.25}},
    }},
]


@pytest.mark.parametrize("doc", PLAIN)
def test_a_plain_document_is_written_as_json_every_reader_reads_back(doc) -> None:
    overrides = Overrides.from_mapping(doc, source="o.yaml")
    text = render(overrides)
    assert text.startswith(HEADER)
    assert text[len(HEADER):].startswith("{")
    assert json_reading(text) == overrides.to_mapping()
    assert parse_overrides(text, source="o.yaml") == overrides
    # the file is YAML to every YAML reader, with the same values
    assert typed(yaml.safe_load(text)) == typed(overrides.to_mapping())
    assert typed(load_yaml(text, "o.yaml")) == typed(overrides.to_mapping())


@pytest.mark.parametrize("patch", [
    {"fan": {0: 40, "speed_pct": 50}},  # an int key: JSON would make it "0"
    {"dynamic_metrics": {"rate": 1e-05}},  # JSON spells it 1e-05, a string to YAML 1.1
    {"dynamic_metrics": {"name": "caf\u00e9 \U0001f600"}},  # non-ASCII: escaped in JSON
])
def test_a_document_json_would_change_is_written_as_yaml(patch) -> None:
    overrides = Overrides.from_mapping({"version": 1, "all": patch}, source="o.yaml")
    text = render(overrides)
    assert text.startswith(HEADER)
    assert not text[len(HEADER):].startswith("{")
    again = parse_overrides(text, source="o.yaml")
    assert again == overrides
    assert typed(again.to_mapping()) == typed(overrides.to_mapping())


def test_the_model_is_immutable_and_compares_by_content() -> None:
    one = Overrides.from_mapping({"version": 1, "all": {"fan": 1}}, source="a.yaml")
    two = Overrides.from_mapping({"version": 1, "all": {"fan": 1}}, source="b.yaml")
    assert one == two  # the source is not content
    assert one != Overrides.from_mapping({"version": 1}, source="a.yaml")
    assert one != {"version": 1, "all": {"fan": 1}}
    with pytest.raises(AttributeError, match="immutable"):
        one.all = {}  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del one.source
    with pytest.raises(TypeError):
        hash(one)
    assert repr(one) == ("Overrides(version=1, all={'fan': 1}, devices={}, source='a.yaml')")
    assert Overrides() == Overrides(version=1, all={}, devices={}, source="x")
