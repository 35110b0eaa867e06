"""The ComputeDomain topology document: both spellings, placement, exact errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from mokka.errors import SpecError
from mokka.state.topology import (
    MAX_NODES,
    load_topology,
    parse_topology,
    topology_from_mapping,
)
from tests.support import DATA

PROFILES = DATA / "profiles"


def test_plain_document_places_nodes() -> None:
    topo = load_topology(PROFILES / "topology-plain.yaml")
    assert topo is not None
    assert topo.placement("worker-1") == ("00000000-0000-0000-0000-0000000000ab", 0)
    assert topo.placement("worker-2") == ("00000000-0000-0000-0000-0000000000ab", 1)
    assert topo.placement("worker-9") is None
    assert topo.domains[0].name == "rack-a"
    assert topo.text == (PROFILES / "topology-plain.yaml").read_text()


def test_upstream_wrapped_document_places_nodes() -> None:
    topo = load_topology(PROFILES / "topology-wrapped.yaml")
    assert topo is not None
    assert [d.name for d in topo.domains] == ["spine-1", "spine-2"]
    assert topo.placement("worker-1") == ("00000000-0000-0000-0000-0000000000ab", 1)
    assert topo.placement("worker-2") == ("00000000-0000-0000-0000-0000000000cd", 0)


def test_disabled_or_empty_or_missing_document_is_no_topology(tmp_path: Path) -> None:
    assert parse_topology("topology: {enabled: false, domains: []}\n", source="t.yaml") is None
    assert parse_topology("# nothing yet\n", source="t.yaml") is None
    assert load_topology(tmp_path / "absent.yaml") is None


def test_first_clique_listing_the_node_wins() -> None:
    topo = topology_from_mapping({"version": 1, "domains": [
        {"uuid": "00000000-0000-0000-0000-000000000001", "cliques": [{"id": 3, "nodes": ["n"]}]},
        {"uuid": "00000000-0000-0000-0000-000000000002", "cliques": [{"id": 4, "nodes": ["n"]}]},
    ]}, source="t.yaml")
    assert topo is not None
    assert topo.placement("n") == ("00000000-0000-0000-0000-000000000001", 3)


RULES = [
    ({"domains": []}, "t.yaml: version: missing, expected 1"),
    ({"version": 2, "domains": []}, "t.yaml: version: 2 is not supported, expected 1"),
    ({"version": 1}, "t.yaml: domains: missing, expected a list of domains with uuid and cliques"),
    ({"version": 1, "domains": [], "nodes": []},
     "t.yaml: nodes: unknown key, expected one of: domains, version"),
    ({"version": 1, "domains": [{"uuid": "ab", "cliques": []}]},
     "t.yaml: domains[0].uuid: 'ab' is not a UUID xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"),
    ({"version": 1, "domains": [{"cliques": []}]},
     "t.yaml: domains[0].uuid: missing, expected a UUID xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"),
    ({"version": 1, "domains": [{"uuid": "00000000-0000-0000-0000-000000000001", "cliques": [],
                                 "size": 2}]},
     "t.yaml: domains[0].size: unknown key, expected one of: cliques, name, uuid"),
    ({"version": 1, "domains": [{"uuid": "00000000-0000-0000-0000-000000000001"}]},
     "t.yaml: domains[0].cliques: missing, expected a list of cliques with id and nodes"),
    ({"version": 1, "domains": [{"uuid": "00000000-0000-0000-0000-000000000001", "cliques": []},
                                {"uuid": "00000000-0000-0000-0000-000000000001", "cliques": []}]},
     "t.yaml: domains[1].uuid: '00000000-0000-0000-0000-000000000001' repeats domains[0], "
     "expected a unique UUID per domain"),
    ({"version": 1, "domains": [{"uuid": "00000000-0000-0000-0000-000000000001",
                                 "cliques": [{"id": -1, "nodes": []}]}]},
     "t.yaml: domains[0].cliques[0].id: -1 is out of range, expected 0..4294967295"),
    ({"version": 1, "domains": [{"uuid": "00000000-0000-0000-0000-000000000001",
                                 "cliques": [{"id": 0, "nodes": "n1"}]}]},
     "t.yaml: domains[0].cliques[0].nodes: 'n1' is not a list"),
    ({"version": 1, "domains": [{"uuid": "00000000-0000-0000-0000-000000000001",
                                 "cliques": [{"id": 0, "nodes": [7]}]}]},
     "t.yaml: domains[0].cliques[0].nodes[0]: 7 is not a string"),
    ({"version": 1, "domains": [{"uuid": "00000000-0000-0000-0000-000000000001",
                                 "cliques": [{"id": 0, "nodes": []}, {"id": 0, "nodes": []}]}]},
     "t.yaml: domains[0].cliques[1].id: 0 repeats cliques[0], expected a unique id per clique "
     "in a domain"),
    ({"topology": {"enabled": "yes", "domains": []}},
     "t.yaml: topology.enabled: 'yes' is not true or false"),
    ({"topology": {"domains": [], "cliques": []}},
     "t.yaml: topology.cliques: unknown key, expected one of: domains, enabled, version"),
]


@pytest.mark.parametrize(("doc", "message"), RULES, ids=[r[1][8:50] for r in RULES])
def test_validation_rule_message(doc: dict, message: str) -> None:
    with pytest.raises(SpecError) as info:
        topology_from_mapping(doc, source="t.yaml")
    assert info.value.problems == (message,)


def test_a_document_listing_more_nodes_than_a_cluster_has_is_refused() -> None:
    """Refused where it is read (the last good document stays), not by a Stage wave."""
    nodes = [f"node-{i}" for i in range(MAX_NODES + 1)]
    doc = {"version": 1, "domains": [{"uuid": "00000000-0000-0000-0000-000000000001",
                                      "cliques": [{"id": 0, "nodes": nodes[:10]},
                                                  {"id": 1, "nodes": nodes[10:]}]}]}
    with pytest.raises(SpecError) as info:
        topology_from_mapping(doc, source="t.yaml")
    assert info.value.problems == (
        f"t.yaml: domains: {MAX_NODES + 1} distinct node names, expected at most {MAX_NODES} "
        "(the most nodes a Kubernetes cluster has)",
    )
    doc["domains"][0]["cliques"][1]["nodes"] = nodes[10:MAX_NODES] + nodes[:5]  # repeats count once
    assert topology_from_mapping(doc, source="t.yaml").placement("node-4") is not None
