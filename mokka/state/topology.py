"""The ComputeDomain topology document: which nodes share an NVLink clique.

Two spellings are accepted, because both exist in the wild:

* the plain document, ``version: 1`` and ``domains:`` at the top;
* the upstream chart's example, wrapped as ``topology: {enabled, domains}``
  (``enabled: false`` means no topology at all).

Each domain has a ``uuid`` (the fabric cluster UUID its GPUs report), an
optional ``name`` and ``cliques``, each with an ``id`` (the fabric clique
id) and the ``nodes`` in it.  The first clique listing a node gives it its
fabric identity (``Topology.placement``).  The parsed value is
``mokka.state.model.Topology``; it keeps the text as read, which the nvlink
simulator stages verbatim.

Only the fabric identity comes from here: the compiler folds this node's
placement into every GPU that has a ``fabric`` block (state ``completed``),
and a node the document does not list keeps its profile's values.  Node
names are matched exactly as the kubelet registers them (no case folding),
the same names ``--node-name`` and the identity hash use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mokka.state import checks
from mokka.state.checks import Problems, sub
from mokka.state.model import Clique, Domain, Topology
from mokka.state.reader import load_yaml, read_input

DOCUMENT_KEYS = ("version", "domains")
#: Inside the chart's ``topology:`` wrapper; its ``version`` is optional there
#: and falls back to the top level's, then to 1.
WRAPPED_KEYS = ("enabled", "domains", "version")
DOMAIN_KEYS = ("name", "uuid", "cliques")
CLIQUE_KEYS = ("id", "nodes")
#: Most distinct node names a document may list: the largest cluster
#: Kubernetes supports (its documented limit is 5,000 nodes).  A document
#: listing more is generated wrong, and every node's daemon would carry it
#: into each pass (the nvlink simulator stages it, the ib simulator derives
#: its fabric from it), so it is refused here, where the last good document
#: stays in force, rather than failing a stage.
MAX_NODES = 5000


def topology_from_mapping(doc: Any, *, source: str, text: str = "") -> Topology | None:
    """Validate ``yaml.safe_load`` output; ``None`` for an empty or disabled document.

    ``text`` is the document as read; it is kept on the result because the
    nvlink simulator stages it byte for byte and the content hash covers it
    (a comment edit there is a real change for the containers that read
    the file).  Raises ``SpecError`` listing every problem.  The parse
    stops early only where the shape is too wrong to go on: the document or
    the wrapper is not a mapping, or ``enabled: false`` (nothing to check).
    """
    if doc is None:
        return None
    p = Problems(source)
    top = checks.as_mapping(p, "(document)", doc)
    p.raise_if_any()
    assert top is not None
    top = checks.normalize_numbers(top)
    prefix = ""
    if "topology" in top:
        # the upstream chart's spelling: topology: {enabled, domains}
        checks.check_keys(p, "", top, ("topology", "version"))
        inner = checks.as_mapping(p, "topology", top["topology"])
        p.raise_if_any()
        assert inner is not None
        checks.check_keys(p, "topology", inner, WRAPPED_KEYS)
        # A wrapper without ``enabled`` is on: writing the block means using it.
        enabled = checks.as_bool(p, "topology.enabled", inner.get("enabled", True))
        if enabled is False:
            p.raise_if_any()
            return None
        body, prefix = inner, "topology"
        version = inner.get("version", top.get("version", 1))
    else:
        checks.check_keys(p, "", top, DOCUMENT_KEYS)
        body = top
        version = checks.require(p, "", top, "version", "1")
    # 1, 1.0 and "1" all mean version 1; ``True`` is refused although
    # Python's ``True == 1`` (``version: yes`` is a mistake, not a version).
    if version is not None and (isinstance(version, bool) or str(version).split(".")[0] != "1"):
        p.add(sub(prefix, "version"), f"{checks.found(version)} is not supported, expected 1")
    domains = _domains(p, prefix, body)
    names = {node for domain in domains for clique in domain.cliques for node in clique.nodes}
    if len(names) > MAX_NODES:
        p.add(sub(prefix, "domains"), f"{len(names)} distinct node names, expected at most "
              f"{MAX_NODES} (the most nodes a Kubernetes cluster has)")
    p.raise_if_any()
    return Topology(domains=tuple(domains), text=text, source=source)


def _domains(p: Problems, prefix: str, body: dict[str, Any]) -> list[Domain]:
    """``domains[]``: each with a unique ``uuid``, an optional ``name`` and its cliques.

    ``prefix`` is ``"topology"`` for the wrapped spelling, so messages point
    at the field as the user wrote it.  A domain whose UUID is bad is left
    out but its cliques are still checked, so one pass reports everything.
    """
    path = sub(prefix, "domains")
    raw = checks.require(p, prefix, body, "domains", "a list of domains with uuid and cliques")
    items = checks.as_list(p, path, raw) if raw is not None else None
    domains: list[Domain] = []
    seen: dict[str, int] = {}
    for pos, item in enumerate(items or ()):
        dpath = sub(path, pos)
        dom = checks.as_mapping(p, dpath, item)
        if dom is None:
            continue
        checks.check_keys(p, dpath, dom, DOMAIN_KEYS)
        name = dom.get("name")
        if name is not None:
            name = checks.as_str(p, sub(dpath, "name"), name)
        uuid = checks.require(p, dpath, dom, "uuid", "a UUID xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
        if uuid is not None:
            uuid = checks.as_match(p, sub(dpath, "uuid"), uuid, checks.UUID_RE,
                                   "a UUID xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
        if uuid is not None:
            # lower case, as nvidia-smi prints cluster UUIDs; a repeat would put
            # two separate domains' GPUs into one fabric
            uuid = uuid.lower()
            if uuid in seen:
                p.add(sub(dpath, "uuid"), f"{uuid!r} repeats domains[{seen[uuid]}], expected "
                      "a unique UUID per domain")
            seen.setdefault(uuid, pos)
        cliques = _cliques(p, dpath, dom)
        if uuid is not None:
            domains.append(Domain(uuid=uuid, cliques=tuple(cliques), name=name))
    return domains


def _cliques(p: Problems, dpath: str, dom: dict[str, Any]) -> list[Clique]:
    """``cliques[]`` of one domain: a unique integer ``id`` and the ``nodes`` in it.

    Clique ids need only be unique within their domain (the fabric identity
    is the pair of cluster UUID and clique id).  A node listed in two
    cliques is not refused: ``Topology.placement`` takes the first one in
    document order, domains first, then cliques.
    """
    path = sub(dpath, "cliques")
    raw = checks.require(p, dpath, dom, "cliques", "a list of cliques with id and nodes")
    items = checks.as_list(p, path, raw) if raw is not None else None
    cliques: list[Clique] = []
    ids: dict[int, int] = {}
    for pos, item in enumerate(items or ()):
        cpath = sub(path, pos)
        clique = checks.as_mapping(p, cpath, item)
        if clique is None:
            continue
        checks.check_keys(p, cpath, clique, CLIQUE_KEYS)
        cid = checks.require(p, cpath, clique, "id", "the clique id (an integer >= 0)")
        if cid is not None:
            # the fabric's clique id is NVML's unsigned int cliqueId
            cid = checks.as_int(p, sub(cpath, "id"), cid, lo=0, hi=checks.U32_MAX)
        if cid is not None:
            if cid in ids:
                p.add(sub(cpath, "id"), f"{cid} repeats cliques[{ids[cid]}], expected a unique "
                      "id per clique in a domain")
            ids.setdefault(cid, pos)
        nodes_raw = checks.require(p, cpath, clique, "nodes", "a list of node names")
        nodes = checks.as_list(p, sub(cpath, "nodes"), nodes_raw) if nodes_raw is not None else None
        names: list[str] = []
        for npos, node in enumerate(nodes or ()):
            name = checks.as_str(p, sub(sub(cpath, "nodes"), npos), node)
            if name is not None:
                names.append(name)
        if cid is not None and nodes is not None:
            cliques.append(Clique(id=cid, nodes=tuple(names)))
    return cliques


def parse_topology(text: str, *, source: str) -> Topology | None:
    """Parse and validate a document's text; ``source`` names it in every message."""
    return topology_from_mapping(load_yaml(text, source), source=source, text=text)


def load_topology(path: Path) -> Topology | None:
    """The topology document at ``path``; ``None`` when absent, empty or disabled.

    Absent is normal: a node outside any ComputeDomain has no document, and
    the file source notices when one appears.
    """
    text = read_input(path, "the topology document", optional=True)
    return None if text is None else parse_topology(text, source=str(path))
