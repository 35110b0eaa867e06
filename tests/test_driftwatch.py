"""``DriftWatch``: a converged record trusted on inotify's silence, and every change still seen.

The watch must never vouch for a record whose part of the node changed: each
kind of change is made after the record was vouched for (so only an event
can tell), and ``holds`` must say False.  With nothing changed it must
answer without a single ``lstat``.  Where the kernel cannot report (a lost
watch, an overflowed queue, a watch that could not be added), the record is
checked by ``lstat`` again.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest

from mokka.noderoot import driftwatch
from mokka.noderoot.driftwatch import DriftWatch, watched_directories
from mokka.noderoot.host import Directory, File, Host, Symlink
from mokka.noderoot.settled import Settled
from mokka.state.sources.inotify import IN_IGNORED, IN_Q_OVERFLOW, Event, Inotify, coalesced

OWNER = "watched"
ARTIFACTS = [
    Directory("/srv/data", 0o755),
    File("/srv/data/config.yaml", b"version: 1\n", 0o644),
    File("/srv/data/deep/er/leaf", b"leaf", 0o600),
    Symlink("/srv/current", "data"),
]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def converged(host: Host) -> Settled:
    """Converge ``ARTIFACTS`` and return the record the converge left."""
    with host.recording() as activity:
        host.converge(OWNER, ARTIFACTS)
    settled = activity.converged[OWNER]
    assert settled is not None
    return settled


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def watch(clock: Clock):
    watch = DriftWatch(Inotify.open(), clock=clock)
    yield watch
    watch.close()


def vouched(watch: DriftWatch, settled: Settled) -> None:
    """The record checked once by lstat (and vouched for), then trusted without one."""
    checked = watch.checked
    assert watch.holds(settled)
    assert watch.checked == checked + 1
    trusted = watch.trusted
    assert watch.holds(settled)
    assert watch.trusted == trusted + 1
    assert watch.checked == checked + 1


def test_an_unchanged_record_is_trusted_without_a_single_lstat(
    host: Host, watch: DriftWatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    settled = converged(host)
    vouched(watch, settled)
    calls = []
    real_lstat, real_stat = os.lstat, os.stat
    with monkeypatch.context() as patched:
        patched.setattr(os, "lstat", lambda *a, **k: calls.append(a) or real_lstat(*a, **k))
        patched.setattr(os, "stat", lambda *a, **k: calls.append(a) or real_stat(*a, **k))
        for _ in range(5):
            assert watch.holds(settled)
    assert calls == []
    host.discard(OWNER)


def _rewrite_same_size(root: Path) -> None:
    path = root / "srv/data/config.yaml"
    with open(path, "r+b") as out:
        out.write(b"V")


def _append(root: Path) -> None:
    with open(root / "srv/data/deep/er/leaf", "ab") as out:
        out.write(b"+")


def _chmod(root: Path) -> None:
    os.chmod(root / "srv/data/deep/er/leaf", 0o644)


def _chown(root: Path) -> None:
    os.chown(root / "srv/data/config.yaml", 4242, 4242)


def _delete(root: Path) -> None:
    (root / "srv/data/config.yaml").unlink()


def _rename_over(root: Path) -> None:
    other = root / "srv/data/.other"
    other.write_bytes(b"version: 1\n")
    os.rename(other, root / "srv/data/config.yaml")


def _swap_link(root: Path) -> None:
    (root / "srv/current").unlink()
    os.symlink("elsewhere", root / "srv/current")


def _chmod_directory(root: Path) -> None:
    os.chmod(root / "srv/data/deep", 0o700)


def _replace_a_parent(root: Path) -> None:
    os.rename(root / "srv/data/deep", root / "srv/deep-moved")
    (root / "srv/data/deep/er").mkdir(parents=True)
    (root / "srv/data/deep/er/leaf").write_bytes(b"leaf")
    os.chmod(root / "srv/data/deep/er/leaf", 0o600)


def _hard_link_count(root: Path) -> None:
    os.link(root / "srv/data/config.yaml", root / "srv/another-name")


CHANGES = {
    "rewritten in place, same size": _rewrite_same_size,
    "appended to": _append,
    "file chmod'ed": _chmod,
    "file chown'ed": _chown,
    "file deleted": _delete,
    "renamed over": _rename_over,
    "link swapped": _swap_link,
    "directory chmod'ed": _chmod_directory,
    "parent directory replaced, same content": _replace_a_parent,
    "hard link added": _hard_link_count,
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_every_change_after_the_record_was_vouched_for_is_seen(
    host: Host, node_root: Path, watch: DriftWatch, change: str
) -> None:
    settled = converged(host)
    vouched(watch, settled)
    CHANGES[change](node_root)
    assert not watch.holds(settled)
    assert not watch.holds(settled)  # and stays seen
    for leftover in ("srv/deep-moved", "srv/another-name"):
        path = node_root / leftover
        if path.is_dir():
            for dirpath, _dirs, files in os.walk(path, topdown=False):
                for name in files:
                    os.unlink(os.path.join(dirpath, name))
                os.rmdir(dirpath)
        elif path.exists():
            path.unlink()
    host.discard(OWNER)


def test_a_directory_put_where_a_watched_one_was_is_watched_itself(
    host: Host, node_root: Path, watch: DriftWatch
) -> None:
    # The old watch follows the moved directory; the new one at the same
    # path must get a watch of its own, or changes in it go unseen.
    settled = converged(host)
    vouched(watch, settled)
    _replace_a_parent(node_root)
    assert not watch.holds(settled)
    settled = converged(host)  # converged again, into the new directory
    vouched(watch, settled)
    _append(node_root)
    assert not watch.holds(settled)
    (node_root / "srv/deep-moved/er/leaf").unlink()
    (node_root / "srv/deep-moved/er").rmdir()
    (node_root / "srv/deep-moved").rmdir()
    host.discard(OWNER)


def test_a_write_inotify_never_reports_is_caught_by_the_periodic_recheck(
    host: Host, node_root: Path, watch: DriftWatch, clock: Clock
) -> None:
    # A write through a shared mapping raises no inotify event, but changes
    # the file's times: the record is checked by lstat again after at most
    # RECHECK_AFTER seconds.
    settled = converged(host)
    vouched(watch, settled)
    with open(node_root / "srv/data/config.yaml", "r+b") as file, mmap.mmap(
        file.fileno(), 0
    ) as mapping:
        mapping[0:1] = b"W"
        mapping.flush()
    clock.now += driftwatch.RECHECK_AFTER + 1
    assert not watch.holds(settled)
    host.discard(OWNER)


def test_the_watched_directories_cover_every_entry_and_every_directory_on_the_way(
    host: Host, node_root: Path
) -> None:
    settled = converged(host)
    root = str(node_root)
    assert watched_directories(settled) == {
        root,  # /srv itself, in its parent
        f"{root}/srv",
        f"{root}/srv/data",
        f"{root}/srv/data/deep",
        f"{root}/srv/data/deep/er",
        str(host.state_dir / "manifests"),
    }
    host.discard(OWNER)


class FakeInotify:
    """Answers watches with numbers and hands out queued events; can refuse watches."""

    def __init__(self, refuse: set[str] = frozenset()) -> None:
        self.refuse = refuse
        self.watches: dict[str, int] = {}
        self.queued: list[Event] = []

    def add_watch(self, directory: str, mask: int) -> int:
        if directory in self.refuse:
            raise OSError(errno.ENOSPC, "inotify_add_watch: no space left on device")
        return self.watches.setdefault(directory, len(self.watches) + 1)

    def read_changes(self) -> dict[int, int]:
        events, self.queued = self.queued, []
        return coalesced(events)

    def close(self) -> None:
        pass


def test_an_overflowed_queue_has_every_record_checked_again(host: Host) -> None:
    inotify = FakeInotify()
    watch = DriftWatch(inotify)  # type: ignore[arg-type]
    settled = converged(host)
    vouched(watch, settled)
    inotify.queued.append(Event(-1, IN_Q_OVERFLOW, 0, ""))
    checked = watch.checked
    assert watch.holds(settled)  # nothing really changed: the check by lstat says so
    assert watch.checked == checked + 1
    host.discard(OWNER)


def test_a_dropped_watch_has_its_records_checked_again(host: Host) -> None:
    inotify = FakeInotify()
    watch = DriftWatch(inotify)  # type: ignore[arg-type]
    settled = converged(host)
    vouched(watch, settled)
    wd = inotify.watches[str(host.root / "srv/data")]
    inotify.queued.append(Event(wd, IN_IGNORED, 0, ""))
    checked = watch.checked
    assert watch.holds(settled)
    assert watch.checked == checked + 1
    host.discard(OWNER)


def test_a_record_with_a_directory_that_could_not_be_watched_is_always_checked(
    host: Host,
) -> None:
    inotify = FakeInotify(refuse={str(host.root / "srv/data/deep/er")})
    watch = DriftWatch(inotify)  # type: ignore[arg-type]
    settled = converged(host)
    for _ in range(3):
        assert watch.holds(settled)
    assert watch.checked == 3
    assert watch.trusted == 0
    host.discard(OWNER)


def test_the_daemon_host_opens_one_descriptor_at_the_first_drift_check_and_releases_it(
    host: Host,
) -> None:
    # Not at start: where inotify descriptors run short, the watchers that
    # would fall back to polling on timers must have theirs first.
    with host.recording() as activity:
        host.converge(OWNER, ARTIFACTS)
    before = set(os.listdir("/proc/self/fd"))
    host.watch_for_drift()
    host.watch_for_drift()  # idempotent
    assert host.drift_watch is None
    assert set(os.listdir("/proc/self/fd")) == before
    assert host.unchanged(activity)
    assert host.unchanged(activity)
    assert host.drift_watch is not None
    assert host.drift_watch.checked == 1
    assert host.drift_watch.trusted == 1
    assert len(set(os.listdir("/proc/self/fd")) - before) == 1
    host.stop_watching_for_drift()
    assert host.drift_watch is None
    assert set(os.listdir("/proc/self/fd")) == before
    assert host.unchanged(activity)  # by lstat again
    assert host.drift_watch is None
    host.discard(OWNER)


def test_without_inotify_the_drift_check_stats_and_stops_trying(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    tries = []

    def no_inotify() -> Inotify:
        tries.append(1)
        raise OSError(errno.EMFILE, "inotify_init1: Too many open files")

    monkeypatch.setattr(Inotify, "open", no_inotify)
    with host.recording() as activity:
        host.converge(OWNER, ARTIFACTS)
    host.watch_for_drift()
    assert host.unchanged(activity)
    (host.root / "srv/data/config.yaml").write_bytes(b"changed")
    assert not host.unchanged(activity)  # seen by lstat
    assert host.drift_watch is None
    assert len(tries) == 1
    host.discard(OWNER)


def test_a_watched_directory_swapped_for_a_link_to_its_copy_is_seen(
    host: Host, node_root: Path, watch: DriftWatch
) -> None:
    # A hostile swap: the same content read through the link, but no longer
    # the directory the record placed into (its watch is not followed there).
    settled = converged(host)
    vouched(watch, settled)
    os.rename(node_root / "srv/data/deep", node_root / "srv/deep-moved")
    os.symlink("../deep-moved", node_root / "srv/data/deep")
    assert (node_root / "srv/data/deep/er/leaf").read_bytes() == b"leaf"
    assert not watch.holds(settled)
    (node_root / "srv/data/deep").unlink()
    os.rename(node_root / "srv/deep-moved", node_root / "srv/data/deep")
    host.discard(OWNER)
    assert os.listdir(node_root) == []
