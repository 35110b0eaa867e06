"""How closely the built-in profiles reproduce real boards, measured through nvidia-smi.

The real Debian ``nvidia-smi`` 535 runs ``-q -x`` against the mock library
staged for a built-in profile; its report is compared, element by element,
with ``nvidia-smi -q -x`` captured on a real node of that board
(``tests/data/nvidia-smi/qx-<profile>.xml``).  The figure is the share of
compared elements whose text is equal.

What is compared, and why:

* Only elements both reports have.  The captures come from drivers 570/580,
  which write the v13 vocabulary; 535 writes v12.  An element only one side
  writes says something about the client, not the board.
* Leaves, by path under the GPU (``pci/pci_gpu_link_info/pcie_gen/max_link_gen``);
  the n-th repeated sibling is ``tag[n]`` (the first keeps the bare tag).
  ``supported_clocks`` is one element (its whole table as text): a table of
  250 entries would otherwise outweigh everything else on the board.
* GPUs in order: the captures list them by bus id, as the profiles do.
* Not compared: readings that change while a board runs (``DYNAMIC``) and
  values that identify one board or one node (``IDENTITY``).  Both sets are
  written down here and in ``docs/fidelity.md``.

Each remaining difference is listed in ``KNOWN_DIFFERENCES`` with its reason:
``tests/test_fidelity.py`` fails when a difference appears that is not
listed, or when a listed one has gone (so the list stays true).

Run ``python -m tests.fidelity_support`` for the table of ``docs/fidelity.md``.
"""

from __future__ import annotations

import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import attrs

from mokka import layout
from mokka.state.compile import compile_profile
from mokka.state.profile import load_profile
from tests.nvml_support import compiler, load_target, node_path, run_smi, write_config
from tests.support import DATA, real_nvidia_smi

#: Profiles with a real capture, each ``tests/data/nvidia-smi/qx-<name>.xml``: every built-in.
CAPTURED_PROFILES = ("a100", "b200", "gb200", "gb300", "h100", "l40s", "t4")

#: Node name the comparison compiles the profiles for (it only seeds identities).
NODE_NAME = "worker-1"

#: Elements under a GPU that are readings: they change from one second to the next on a
#: real board (load, temperature, idle clocks and link down-training, counters, running
#: processes), so a capture shows one moment and no fixed profile value can "agree" with it.
DYNAMIC = frozenset(
    {
        "fan_speed",
        "performance_state",
        "clocks_event_reasons",
        "clocks_throttle_reasons",
        "clocks_event_reasons_counters",
        "fb_memory_usage/used",
        "fb_memory_usage/free",
        "bar1_memory_usage/used",
        "bar1_memory_usage/free",
        "cc_protected_memory_usage/used",
        "cc_protected_memory_usage/free",
        "utilization",
        "encoder_stats",
        "fbc_stats",
        "pci/replay_counter",
        "pci/replay_rollover_counter",
        "pci/tx_util",
        "pci/rx_util",
        "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
        "pci/pci_gpu_link_info/pcie_gen/device_current_link_gen",
        "pci/pci_gpu_link_info/link_widths/current_link_width",
        "ecc_errors",
        "retired_pages",
        "remapped_rows/remapped_row_corr",
        "remapped_rows/remapped_row_unc",
        "remapped_rows/remapped_row_pending",
        "remapped_rows/remapped_row_failure",
        "remapped_rows/row_remapper_histogram/row_remapper_histogram_high",
        "remapped_rows/row_remapper_histogram/row_remapper_histogram_partial",
        "remapped_rows/row_remapper_histogram/row_remapper_histogram_low",
        "remapped_rows/row_remapper_histogram/row_remapper_histogram_none",
        "temperature/gpu_temp",
        "temperature/gpu_temp_tlimit",
        "temperature/memory_temp",
        "gpu_power_readings/power_draw",
        "gpu_power_readings/average_power_draw",
        "gpu_power_readings/instant_power_draw",
        "gpu_power_readings/power_state",
        "module_power_readings/power_draw",
        "module_power_readings/average_power_draw",
        "module_power_readings/instant_power_draw",
        "module_power_readings/power_state",
        "gpu_memory_power_readings",
        "clocks",
        "voltage",
        "processes",
        "accounted_processes",
        "inforom_bbx_flush",
    }
)

#: Elements that identify one board or one node: they differ between any two real
#: boards of the same model.  The PCI address is where the host's firmware put the
#: board (the same B200 sits at 1B:00.0 in one server and at 8F:00.0 in another), and
#: the board id is derived from it (``bus << 8``, with the domain on multi-domain
#: hosts).  The mock derives UUIDs and serials from the node name
#: (``mokka.state.identity``); the capture's are scrubbed placeholders anyway.
IDENTITY = frozenset(
    {
        "board_id",
        "pci/pci_bus",
        "pci/pci_bus_id",
        "pci/pci_domain",
        "pci/pci_device",
        "serial",
        "uuid",
        "pdi",
        "platformInfo",
        "fabric/clusterUuid",
        "fabric/cluster_uuid",
        "fabric/cliqueId",
        "fabric/clique_id",
    }
)

#: Node-wide elements outside the GPUs that are compared, and the one that is not.
NODE_COMPARED = ("driver_version", "cuda_version", "attached_gpus")
NODE_IDENTITY = ("timestamp",)

#: Why an element still differs.  None of them is a value the profile gets wrong.
NO_BLACKWELL = (
    "nvidia-smi 535 predates Blackwell and prints an architecture id it does not know as "
    "Unknown; the library reports NVML_DEVICE_ARCH_BLACKWELL (pynvml reads 10)"
)
CLOCKS_CUT = (
    "the board lists {count} graphics clocks; nvidia-smi 535 asks for at most 256 and prints "
    "Unknown Error for a longer list, so the profile keeps the 256 highest ({kept})"
)

#: Every difference the comparison finds, per capture: element path → reason.
KNOWN_DIFFERENCES: dict[str, dict[str, str]] = {
    "a100": {},
    "b200": {
        "product_architecture": NO_BLACKWELL,
    },
    "gb200": {
        "product_architecture": NO_BLACKWELL,
        "supported_clocks": CLOCKS_CUT.format(count=260, kept="2062..150 MHz"),
    },
    "gb300": {
        "product_architecture": NO_BLACKWELL,
        "supported_clocks": CLOCKS_CUT.format(count=261, kept="2070..157 MHz"),
    },
    "h100": {},
    "l40s": {},
    "t4": {},
}


def capture_path(profile: str) -> Path:
    return DATA / "nvidia-smi" / f"qx-{profile}.xml"


def load_capture(profile: str) -> ET.Element:
    return ET.parse(capture_path(profile)).getroot()


def _excluded(path: str, names: Iterable[str]) -> bool:
    """``path`` is one of ``names`` or lies under one of them."""
    return any(path == name or path.startswith(name + "/") for name in names)


def _bare(path: str) -> str:
    """The path without repetition indices: ``a[2]/b`` → ``a/b``."""
    return "/".join(part.split("[", 1)[0] for part in path.split("/"))


def gpu_elements(gpu: ET.Element) -> dict[str, str]:
    """Leaf path → stripped text of one ``<gpu>``; ``supported_clocks`` as one element."""
    out: dict[str, str] = {}

    def walk(element: ET.Element, prefix: str) -> None:
        seen: Counter[str] = Counter()
        for child in element:
            tag = child.tag if not seen[child.tag] else f"{child.tag}[{seen[child.tag]}]"
            seen[child.tag] += 1
            path = prefix + tag
            if path == "supported_clocks":
                out[path] = " ".join(t.strip() for t in child.itertext() if t.strip())
            elif len(child):
                walk(child, path + "/")
            else:
                out[path] = (child.text or "").strip()

    walk(gpu, "")
    return out


@attrs.frozen
class Difference:
    gpu: int  # position in the report; -1 for a node-wide element
    path: str
    ours: str
    real: str


@attrs.frozen
class Comparison:
    """The outcome of comparing one mock report with one capture."""

    profile: str
    compared: int
    equal: int
    #: compared elements where the real board reports a value (not ``N/A`` or empty)
    compared_with_value: int
    equal_with_value: int
    differences: tuple[Difference, ...]
    excluded: int
    #: elements the capture has in all (the node's and every GPU's)
    capture_elements: int

    @property
    def share(self) -> float:
        return self.equal / self.compared if self.compared else 0.0

    @property
    def share_with_value(self) -> float:
        return self.equal_with_value / self.compared_with_value if self.compared_with_value else 0.0

    def differing_paths(self) -> set[str]:
        """Differences by element, across GPUs (indices of repeated elements dropped)."""
        return {_bare(d.path) for d in self.differences}


def compare(profile: str, ours: ET.Element, real: ET.Element) -> Comparison:
    """Compare a mock ``-q -x`` report with a capture (both ``<nvidia_smi_log>`` roots)."""
    compared = equal = with_value = equal_with_value = excluded = 0
    capture_elements = len(real) - len(real.findall("gpu"))
    differences: list[Difference] = []

    def count(gpu: int, path: str, ours_text: str, real_text: str) -> None:
        nonlocal compared, equal, with_value, equal_with_value
        compared += 1
        same = ours_text == real_text
        equal += same
        if real_text not in ("", "N/A"):
            with_value += 1
            equal_with_value += same
        if not same:
            differences.append(Difference(gpu, path, ours_text, real_text))

    excluded += sum(1 for tag in NODE_IDENTITY if real.find(tag) is not None
                    and ours.find(tag) is not None)
    for tag in NODE_COMPARED:
        count(-1, tag, (ours.findtext(tag) or "").strip(), (real.findtext(tag) or "").strip())
    ours_gpus, real_gpus = ours.findall("gpu"), real.findall("gpu")
    if len(ours_gpus) != len(real_gpus):
        raise AssertionError(
            f"{profile}: the mock reports {len(ours_gpus)} GPUs, the capture {len(real_gpus)}"
        )
    for position, (ours_gpu, real_gpu) in enumerate(zip(ours_gpus, real_gpus, strict=True)):
        mine, theirs = gpu_elements(ours_gpu), gpu_elements(real_gpu)
        capture_elements += len(theirs)
        for path, real_text in theirs.items():
            if path not in mine:
                continue
            if _excluded(_bare(path), DYNAMIC | IDENTITY):
                excluded += 1
                continue
            count(position, path, mine[path], real_text)
    return Comparison(
        profile=profile,
        compared=compared,
        equal=equal,
        compared_with_value=with_value,
        equal_with_value=equal_with_value,
        differences=tuple(differences),
        excluded=excluded,
        capture_elements=capture_elements,
    )


def mock_report(profile: str, smi: Path, native_dir: Path, workdir: Path) -> ET.Element:
    """``nvidia-smi -q -x`` of the mock library staged for a built-in profile.

    The fabric manager is taken as ready (its marker exists), as on a node
    whose fabric is up: the captures were taken on such nodes.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    config = write_config(workdir, compile_profile(profile, node_name=NODE_NAME))
    node_path(workdir, layout.FABRIC_READY_MIRROR).touch()
    result = run_smi(smi, native_dir, config, "-q", "-x")
    if result.returncode != 0:
        raise AssertionError(
            f"nvidia-smi -q -x for {profile} exited {result.returncode}:\n"
            f"{result.stdout}{result.stderr}"
        )
    return ET.fromstring(result.stdout)


def measure(profile: str, smi: Path, native_dir: Path, workdir: Path) -> Comparison:
    return compare(profile, mock_report(profile, smi, native_dir, workdir), load_capture(profile))


def table(comparisons: Iterable[Comparison]) -> str:
    """The Markdown table of ``docs/fidelity.md``."""
    lines = [
        "| Capture | GPUs | Elements | Both write | Excluded | Compared | Equal | Share "
        "| Where the board has a value |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        gpus = len(load_capture(c.profile).findall("gpu"))
        lines.append(
            f"| `qx-{c.profile}.xml` | {gpus} | {c.capture_elements} | "
            f"{c.compared + c.excluded} | {c.excluded} | {c.compared} | {c.equal} | "
            f"**{100 * c.share:.1f} %** | {c.equal_with_value} / {c.compared_with_value} "
            f"({100 * c.share_with_value:.1f} %) |"
        )
    return "\n".join(lines)


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def estimates(profile: str) -> list[str]:
    """What a built-in profile states without a document behind it: its ``sources``
    entries that are estimates, as ``group: what``.  The capture cannot check these
    either (nvidia-smi does not print them, or the driver no longer answers)."""
    note = load_profile(profile).sources
    return [f"{group}: {s.what}" for group, entries in note.items() for s in entries
            if s.is_estimate]


def main(argv: list[str]) -> int:
    profiles = argv or list(CAPTURED_PROFILES)
    with tempfile.TemporaryDirectory(prefix="mokka-fidelity-") as tmp:
        native_dir = Path(tmp) / "native"
        native_dir.mkdir()
        load_target("nvml").build(native_dir, compiler())
        smi = real_nvidia_smi()
        comparisons = [measure(p, smi, native_dir, Path(tmp) / p) for p in profiles]
    print(table(comparisons))
    for c in comparisons:
        print(f"\n{c.profile}: differences")
        known = KNOWN_DIFFERENCES.get(c.profile, {})
        for path in sorted(c.differing_paths()):
            first = next(d for d in c.differences if _bare(d.path) == path)
            gpus = sum(1 for d in c.differences if _bare(d.path) == path)
            print(f"  {path} ({gpus}x): mock {_short(first.ours)!r}, real {_short(first.real)!r}"
                  f" -- {known.get(path, 'NOT LISTED')}")
        if not c.differences:
            print("  none")
        print(f"{c.profile}: not from a document (sources: estimate)")
        for line in estimates(c.profile):
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
