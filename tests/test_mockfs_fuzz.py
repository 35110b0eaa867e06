"""libmockfs.so against random and adversarial paths, under AddressSanitizer
and UBSan.

A probe (``tests/mockfs_fuzz_probe.c``) calls every path hook on each path
of a list; it runs once under the sanitized shim and once without it on the
paths ``tests.mockfs_fuzz_support.expected_route`` says the shim must use,
and every answer (inode reached, errno, link target, resolved path, entry
count) must agree.  On top of that, whatever a redirected path reaches is
an inode of the mock tree: no spelling (``..`` past a prefix, through a
link, from a working directory inside the mock) leads out of the root.
The mock tree is the H100 PCI tree the pcibus simulator stages; the root is
restored byte for byte afterwards.
"""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mokka import layout
from mokka.noderoot.host import Host
from mokka.simulators.pcibus import PcibusSettings, PcibusSimulator
from tests.mockfs_fuzz_support import (
    NULL,
    build_sanitized,
    check,
    environ,
    expected_route,
    mokka_view,
    paths,
    pci_view,
    run_probe,
    tree_inodes,
)
from tests.support import snapshot
from tests.test_pcibus import h100_state

SEED = 424242
RANDOM_PATHS = 1000


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The shim and the probe, both built with ASan and UBSan."""
    return build_sanitized(tmp_path_factory.mktemp("mockfs-asan"))


@pytest.fixture
async def mock_root(host: Host, node_root: Path) -> AsyncIterator[Path]:
    """The H100 PCI tree staged by the simulator; yields the directory
    standing for ``/``, and checks discard restores the node root."""
    before = snapshot(node_root)
    sim = PcibusSimulator(PcibusSettings(fallback_cpus=8))
    await sim.stage(host, h100_state())
    yield node_root / layout.STATE_ROOT.lstrip("/")
    await sim.revoke(host)
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_random_and_adversarial_paths(mock_root: Path, sanitized: tuple[Path, Path],
                                            tmp_path: Path) -> None:
    shim, probe = sanitized
    view = mokka_view(mock_root)
    items = paths(SEED, RANDOM_PATHS, view)
    inside = tree_inodes(mock_root)
    wrong = check(probe, shim, tmp_path, items, [view], {"MOKKA_MOCKFS_ROOT": str(mock_root)},
                  inside)
    assert not wrong, f"{len(wrong)} wrong answers:\n" + "\n".join(wrong[:40])
    # The model itself: the cases the brief names go where they must.
    kinds = {p: expected_route([view], p, b"/").kind for p in items}
    assert kinds[b"/sys/bus/pcix"] == "pass"
    assert kinds[b"//sys/bus/pci"] == "redirect"
    assert kinds[b"/sys/bus/pci/../../etc/passwd"] == "redirect"
    assert kinds[b"/x/../sys/bus/pci/devices"] == "redirect"
    assert kinds[NULL] == "pass"
    assert sum(k == "fail" for k in kinds.values()) >= 4  # the over-long ones
    assert sum(k == "redirect" for k in kinds.values()) > 100
    assert sum(k == "pass" for k in kinds.values()) > 100


async def test_escapes_reach_nothing_of_the_host(mock_root: Path, sanitized: tuple[Path, Path],
                                                 tmp_path: Path) -> None:
    """The plainest statement of the rule: no spelling of a prefixed path
    opens the host's /etc/passwd or lists the host's PCI devices."""
    shim, probe = sanitized
    host_passwd = os.stat("/etc/passwd")
    passwd = f"ok {host_passwd.st_dev}:{host_passwd.st_ino}"
    escapes = [b"/sys/bus/pci/" + b"../" * k + b"etc/passwd" for k in range(1, 16)]
    escapes += [b"/sys/bus/pci/devices/0000:1a:00.0/" + b"../" * k + b"etc/passwd"
                for k in range(1, 16)]
    escapes += [b"/sys/devices/pci0000:00/0000:00:05.0/0000:1a:00.0/subsystem/" + b"../" * k
                + b"etc/passwd" for k in range(1, 16)]
    answers = run_probe(probe, escapes, tmp_path,
                        environ(shim, MOKKA_MOCKFS_ROOT=str(mock_root)), tag="escape")
    opened = [(escapes[i], call) for (i, call), got in answers.items() if got == passwd]
    assert opened == []
    assert answers[(0, "stat")] == f"err {errno.ENOENT}"  # <root>/etc/passwd: none staged


async def test_relative_paths_from_inside_the_mock(mock_root: Path,
                                                   sanitized: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    shim, probe = sanitized
    view = mokka_view(mock_root)
    items = [b"vendor", b"../..", b"../../../../../../../../../../etc/passwd",
             b"0000:1a:00.0/..", b"0000:1a:00.0/../class", b"0000:1a:00.0/../../..",
             b"../drivers/nvidia", b"../../pci/devices/0000:1a:00.0/config",
             b"./../devices", b"0000:1a:00.0/" + b"../" * 12 + b"sys/bus/pci/devices",
             b"nope/..", b".", b"..", b"../../../../../../../../../../sys/bus/pci/devices"]
    wrong = check(probe, shim, tmp_path, items, [view], {"MOKKA_MOCKFS_ROOT": str(mock_root)},
                  tree_inodes(mock_root), shim_cwd=Path("/sys/bus/pci/devices"),
                  plain_cwd=mock_root / "sys/bus/pci/devices")
    assert not wrong, "\n".join(wrong)


async def test_the_older_pci_root_convention(mock_root: Path, sanitized: tuple[Path, Path],
                                             tmp_path: Path) -> None:
    shim, probe = sanitized
    view = pci_view(mock_root / "sys")
    items = paths(SEED + 1, RANDOM_PATHS // 2, view)
    wrong = check(probe, shim, tmp_path, items, [view], {"MOCK_PCI_ROOT": str(mock_root / "sys")},
                  tree_inodes(mock_root / "sys"))
    assert not wrong, f"{len(wrong)} wrong answers:\n" + "\n".join(wrong[:40])
