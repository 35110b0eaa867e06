"""The drift check of a repair pass: nothing re-rendered, nothing written, every drift seen.

A repair pass over an unchanged state replays each simulator's last good
call when the host finds its part of the node unchanged
(``mokka.daemon.waves.Replays``).  These tests hold that fast path to both
of its promises on a whole node (every simulator the daemon builds): with
nothing drifted, no simulator is called and the root is not touched at
all, not even an mtime; and each kind of drift an operator or another tool
can cause is still put right by the very next repair pass.  Were the check
skipped, the repaired snapshot would not match.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
import trio

import mokka.noderoot.settled
from mokka import cli
from mokka.daemon.command import build_simulators
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.teardown import teardown
from mokka.noderoot.host import File, Host
from mokka.state.compile import compile_profile
from mokka.state.sources.inotify import Inotify
from tests.fakes import FakeSimulator, make_state
from tests.support import snapshot

NODE = "worker-3"
TOPOLOGY = f"""\
version: 1
domains:
  - name: drift
    uuid: 00000000-0000-0000-0000-0000000000d1
    cliques:
      - id: 1
        nodes: [{NODE}]
"""

DRIVER = "var/lib/nvml-mock/driver"
PCI_DEVICE = "var/lib/nvml-mock/sys/devices/pci0000:48/0000:48:01.0/0000:05:00.0"
IB_PORT_FILE = "var/lib/nvml-mock/ib/sys/class/infiniband/mlx5_0/node_guid"


def node(root: Path) -> dict[str, tuple]:
    """``snapshot`` without the engine config's change counter, which every converge
    that changed the config's batch bumps (a repaired directory mode too)."""
    tree = snapshot(root)
    tree.pop(f"{DRIVER}/config/generation", None)
    return tree


def stat_tree(root: Path) -> dict[str, tuple[int, ...]]:
    """Every entry under ``root`` (and ``root`` itself) with inode, mode, size and times:
    equal before and after means not one byte, mode, link or timestamp was written."""
    tree: dict[str, tuple[int, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            tree[os.path.relpath(path, root)] = (
                st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns
            )
    return tree


async def settled_node(root: Path, *args: str, profile: str = "h100", watch: bool = False):
    """A reconciler over every simulator, passed until a pass calls no simulator at all.

    The first pass records every call; a retract whose specs a later call
    published is made once more by the second (see
    ``test_the_first_repair_pass_makes_no_stage_and_no_apply_again``); from
    the third on, nothing changed means nothing called.  ``watch``: with the
    daemon's drift watch (inotify vouches for the records between passes).
    """
    parsed = cli.build_parser().parse_args(
        ["daemon", "--root", str(root), "--profile", profile, "--node-name", NODE, *args]
    )
    simulators = build_simulators(parsed)
    host = Host(root)
    if watch:
        host.watch_for_drift()
    topology = None
    if "--topology" in args:
        topology = Path(args[args.index("--topology") + 1])
    state = compile_profile(profile, node_name=NODE, topology=topology)
    reconciler = Reconciler(host, simulators, supervisor=None, repair_interval=60)
    for _ in range(3):
        made = reconciler.replays.made
        result = await reconciler.reconcile_once(state)
        assert result.ok, result.summary()
    assert reconciler.replays.made == made, "the third pass over the same state called a simulator"
    if watch:
        # Told apart: a machine without inotify cannot run this test, while a
        # watch that did not open where inotify works is the daemon's regression.
        assert host.drift_watch is not None or not _inotify_works(), (
            "the drift watch did not open although inotify works on this machine")
        assert host.drift_watch is not None, "no inotify on this machine: cannot test the watch"
    return host, simulators, state, reconciler


def _inotify_works() -> bool:
    try:
        with Inotify.open():
            return True
    except OSError:
        return False


@pytest.mark.parametrize("check", ["lstat", "inotify"])
@pytest.mark.parametrize("scenario", ["h100", "gb200-imex"])
async def test_a_repair_pass_with_nothing_changed_calls_nothing_and_writes_nothing(
    tmp_path: Path, scenario: str, check: str
) -> None:
    root = tmp_path / "node"
    root.mkdir()
    args: tuple[str, ...] = ()
    profile = "h100"
    if scenario == "gb200-imex":
        topology = tmp_path / "topology.yaml"
        topology.write_text(TOPOLOGY)
        profile = "gb200"
        args = ("--topology", str(topology), "--imex", "on", "--imex-channels", "64")
    host, simulators, state, reconciler = await settled_node(
        root, *args, profile=profile, watch=check == "inotify")
    before = stat_tree(root)
    made, replayed = reconciler.replays.made, reconciler.replays.replayed
    if check == "inotify":
        await reconciler.reconcile_once(state)  # the last pass's own checks vouched
        checked, trusted = host.drift_watch.checked, host.drift_watch.trusted

    result = await reconciler.reconcile_once(state)

    if check == "inotify":
        # Not one record was checked by lstat: no event said anything changed.
        assert host.drift_watch.checked == checked
        assert host.drift_watch.trusted > trusted

    assert result.ok, result.summary()
    assert reconciler.replays.made == made
    # Every call of every wave was replayed: one per simulator's stage and
    # per applier (a retractor's retract too).
    retractors = sum(1 for s in simulators if hasattr(s, "retract"))
    passes = 2 if check == "inotify" else 1
    assert reconciler.replays.replayed - replayed == passes * (
        len(result.stage) + len(result.apply) + retractors
    )
    assert stat_tree(root) == before
    report = await teardown(host, simulators, timeout=60)
    assert report.clean, report.failures
    host.stop_watching_for_drift()
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("profile", ["h100", "gb200"])
async def test_the_first_repair_pass_makes_no_stage_and_no_apply_again(
    tmp_path: Path, profile: str
) -> None:
    """A call's own writes are part of its record: the kernel log's stand-in, a
    publication's link and manifest, the change notice bumped after its batch.

    Only a retract is made once more: the specs it found missing were
    published by its simulator's apply, a later call (it returns at once
    for the state already applied, and is replayed from then on).
    """
    root = tmp_path / "node"
    root.mkdir()
    parsed = cli.build_parser().parse_args(
        ["daemon", "--root", str(root), "--profile", profile, "--node-name", NODE]
    )
    simulators = build_simulators(parsed)
    host = Host(root)
    state = compile_profile(profile, node_name=NODE)
    reconciler = Reconciler(host, simulators, supervisor=None, repair_interval=60)
    assert (await reconciler.reconcile_once(state)).ok
    made = dict(reconciler.replays.made_per_call)
    assert ("gpudriver", "stage") in made
    assert ("kernellog", "stage") in made

    result = await reconciler.reconcile_once(state)

    assert result.ok, result.summary()
    again = {key for key, count in reconciler.replays.made_per_call.items()
             if count > made.get(key, 0)}
    assert {what for _name, what in again} <= {"retract"}, sorted(again)
    report = await teardown(host, simulators, timeout=60)
    assert report.clean, report.failures
    assert list(root.iterdir()) == []


def _delete_device_node(root: Path) -> None:
    path = root / DRIVER / "dev/nvidia0"
    assert stat.S_ISCHR(os.lstat(path).st_mode) or path.is_file()
    path.unlink()


def _rewrite_in_place(root: Path) -> None:
    # Same size, new bytes, the same inode: only the times say it changed.
    path = root / DRIVER / "proc/driver/nvidia/version"
    data = bytearray(path.read_bytes())
    data[0:1] = b"#" if data[0:1] != b"#" else b" "
    with open(path, "r+b") as out:
        out.write(bytes(data))


def _chmod(root: Path) -> None:
    os.chmod(root / PCI_DEVICE / "vendor", 0o600)


def _overwrite_spec(root: Path) -> None:
    # Another tool's atomic save: a temp file renamed over the spec.
    spec = root / "var/run/cdi/nvidia.yaml"
    tmp = spec.with_name(".nvidia.yaml.other-tool")
    tmp.write_text("cdiVersion: 0.5.0\nkind: other.vendor/gpu\ndevices: []\n")
    os.rename(tmp, spec)


def _swap_in_a_link(root: Path) -> None:
    # A link to a copy: the content read through it is the same, the entry is not.
    path = root / IB_PORT_FILE
    copy = root / "elsewhere"
    copy.write_bytes(path.read_bytes())
    path.unlink()
    os.symlink("/elsewhere", path)


def _remove_a_directory(root: Path) -> None:
    directory = root / PCI_DEVICE
    for entry in directory.iterdir():
        if entry.is_file() and not entry.is_symlink():
            entry.unlink()


def _replace_a_directory(root: Path) -> None:
    # The same name, another directory: what was placed in the old one went with it.
    directory = root / DRIVER / "proc/driver/nvidia"
    os.rename(directory, root / "moved-away")
    directory.mkdir()


def _chmod_a_directory(root: Path) -> None:
    # The engine config's directory is asked for with its mode (CDI mounts it whole).
    os.chmod(root / DRIVER / "config", 0o700)


DRIFTS = {
    "directory chmod'ed": (_chmod_a_directory, "gpudriver"),
    "device node deleted": (_delete_device_node, "gpudriver"),
    "file rewritten in place": (_rewrite_in_place, "gpudriver"),
    "file chmod'ed": (_chmod, "pcibus"),
    "spec overwritten by another tool": (_overwrite_spec, "cri"),
    "link swapped in": (_swap_in_a_link, "ib"),
    "files of a directory removed": (_remove_a_directory, "pcibus"),
    "directory replaced": (_replace_a_directory, "gpudriver"),
}


@pytest.mark.parametrize("check", ["lstat", "inotify"])
@pytest.mark.parametrize("drift", sorted(DRIFTS))
async def test_every_kind_of_drift_is_repaired_by_the_next_repair_pass(
    tmp_path: Path, drift: str, check: str
) -> None:
    root = tmp_path / "node"
    root.mkdir()
    host, simulators, state, reconciler = await settled_node(root, watch=check == "inotify")
    if check == "inotify":
        trusted = host.drift_watch.trusted
        await reconciler.reconcile_once(state)
        assert host.drift_watch.trusted > trusted  # the records are vouched for
    staged = node(root)
    cause, simulator = DRIFTS[drift]
    cause(root)
    assert node(root) != staged
    made = reconciler.replays.made

    result = await reconciler.reconcile_once(state)

    assert result.ok, result.summary()
    (root / "elsewhere").unlink(missing_ok=True)  # the link's target, not the node's
    shutil.rmtree(root / "moved-away", ignore_errors=True)  # likewise
    assert node(root) == staged
    # Only the drifted simulator's calls were made again, not the whole node's.
    assert 1 <= reconciler.replays.made - made <= 3
    assert simulator in {o.name for o in result.outcomes}
    # And it settles again: the pass after the repair calls nothing.
    made = reconciler.replays.made
    await reconciler.reconcile_once(state)
    await reconciler.reconcile_once(state)
    assert reconciler.replays.made - made <= 3
    report = await teardown(host, simulators, timeout=60)
    assert report.clean, report.failures
    host.stop_watching_for_drift()
    assert list(root.iterdir()) == []


# ---- what a recorded call depends on -----------------------------------------


class Reader(FakeSimulator):
    """Stages a copy of a node file it reads (a file it does not own)."""

    async def stage(self, host: Host, state) -> None:
        self._record("stage", state)
        data = host.read_bytes("/etc/input") if host.exists("/etc/input") else b"none"
        host.converge(self.name, [File(f"/fake/{self.name}/copy", data)])


async def passed_twice(host: Host, sim: FakeSimulator):
    """A reconciler over ``sim`` alone, and the state it has passed over twice."""
    reconciler = Reconciler(host, [sim])
    state = make_state(1)
    await reconciler.reconcile_once(state)
    await reconciler.reconcile_once(state)
    return reconciler, state


class Creator(FakeSimulator):
    """Looks for its marker and creates it when missing (``_ensure_kmsg``'s way)."""

    async def stage(self, host: Host, state) -> None:
        self._record("stage", state)
        if not host.exists(f"/fake/{self.name}/marker"):
            host.converge(self.name, [File(f"/fake/{self.name}/marker", b"")])


async def test_a_path_a_call_looked_for_and_then_created_is_recorded_as_it_left_it(
    autojump_clock, host: Host, node_root: Path
) -> None:
    sim = Creator("creator")
    reconciler, state = await passed_twice(host, sim)
    assert len(sim.calls("stage")) == 1  # its own write did not make it stale
    marker = node_root / "fake/creator/marker"
    marker.write_bytes(b"someone else's")  # anyone else's write still is drift
    await reconciler.reconcile_once(state)
    assert len(sim.calls("stage")) == 2
    await teardown(host, [sim], timeout=10)
    assert not marker.exists()


class Commander(FakeSimulator):
    """Runs a host command in its stage: nothing outside the root can be checked."""

    async def stage(self, host: Host, state) -> None:
        self._record("stage", state)
        host.run(["true"])
        host.converge(self.name, [File(f"/fake/{self.name}/ran", b"yes")])


class ProcReader(FakeSimulator):
    """Reads a pseudo-file (``/proc``), whose content changes under the same signature."""

    async def stage(self, host: Host, state) -> None:
        self._record("stage", state)
        data = host.read_bytes("/proc/devices")
        host.converge(self.name, [File(f"/fake/{self.name}/devices", data)])


class MachineReader(FakeSimulator):
    """Stages what it finds at a path of the machine itself, outside the node root
    (``Host.depends_on``: the mount table, an installed binary, an archive directory)."""

    def __init__(self, name: str, path: Path) -> None:
        super().__init__(name)
        self.path = path

    async def stage(self, host: Host, state) -> None:
        self._record("stage", state)
        host.depends_on(self.path)
        data = self.path.read_bytes()[:16] if self.path.is_file() else b"absent"
        host.converge(self.name, [File(f"/fake/{self.name}/found", data)])


class Recorder:
    def __init__(self) -> None:
        self.argv: list[list[str]] = []

    def run(self, argv, **kwargs):
        import subprocess

        self.argv.append(list(argv))
        return subprocess.CompletedProcess(list(argv), 0, "", "")


async def test_a_file_a_call_read_is_part_of_what_it_is_replayed_on(
    autojump_clock, host: Host, node_root: Path
) -> None:
    sim = Reader("reader")
    reconciler, state = await passed_twice(host, sim)
    assert len(sim.calls("stage")) == 1  # replayed: nothing it read or placed changed
    (node_root / "etc").mkdir()
    (node_root / "etc/input").write_bytes(b"new input")  # appears: the call's input changed
    await reconciler.reconcile_once(state)
    assert len(sim.calls("stage")) == 2
    assert (node_root / "fake/reader/copy").read_bytes() == b"new input"
    (node_root / "etc/input").write_bytes(b"newer input")  # rewritten, same path
    await reconciler.reconcile_once(state)
    assert (node_root / "fake/reader/copy").read_bytes() == b"newer input"
    await reconciler.reconcile_once(state)
    assert len(sim.calls("stage")) == 3
    await teardown(host, [sim], timeout=10)


async def test_a_call_that_runs_a_command_or_reads_proc_is_made_every_time(
    autojump_clock, node_root: Path
) -> None:
    runner = Recorder()
    host = Host(node_root, runner=runner)
    (node_root / "proc").mkdir()
    (node_root / "proc/devices").write_text("Character devices:\n  1 mem\n")
    commander, proc = Commander("commander"), ProcReader("proc")
    reconciler = Reconciler(host, [commander, proc])
    state = make_state(1)
    for _ in range(2):  # the first converges change /fake, which both share
        await reconciler.reconcile_once(state)
    staged = len(proc.calls("stage"))
    await reconciler.reconcile_once(state)
    assert len(commander.calls("stage")) == 3  # a command: never replayed
    assert len(runner.argv) == 3
    assert len(proc.calls("stage")) == staged  # /proc read by content: unchanged, replayed
    # Same size, same times: only the content differs (what procfs does).
    devices = node_root / "proc/devices"
    before = os.stat(devices)
    devices.write_text("Character devices:\n  2 pty\n")
    os.utime(devices, ns=(before.st_atime_ns, before.st_mtime_ns))
    await reconciler.reconcile_once(state)
    assert len(proc.calls("stage")) == staged + 1
    assert (node_root / "fake/proc/devices").read_text().endswith("2 pty\n")
    await teardown(host, [commander, proc], timeout=10)


async def test_a_machine_path_a_call_depends_on_is_part_of_what_it_is_replayed_on(
    autojump_clock, host: Host, node_root: Path, tmp_path: Path
) -> None:
    """A binary installed on the machine after the first pass (outside the node root)
    is found by the next repair pass; while it stays as it is, the call is replayed."""
    installed = tmp_path / "machine/usr/bin/nvidia-smi"
    sim = MachineReader("machine", installed)
    reconciler = Reconciler(host, [sim])
    state = make_state(1)
    for _ in range(2):
        await reconciler.reconcile_once(state)
    staged = len(sim.calls("stage"))
    await reconciler.reconcile_once(state)
    assert len(sim.calls("stage")) == staged  # nothing changed: replayed
    installed.parent.mkdir(parents=True)
    installed.write_bytes(b"\x7fELF nvidia-smi")
    await reconciler.reconcile_once(state)
    assert len(sim.calls("stage")) == staged + 1
    assert (node_root / "fake/machine/found").read_bytes() == b"\x7fELF nvidia-smi"
    await reconciler.reconcile_once(state)
    assert len(sim.calls("stage")) == staged + 1  # unchanged again: replayed again
    await teardown(host, [sim], timeout=10)


#: ``/proc/version``'s length (its ``stat`` says 0, as every procfs file's does).
KERNEL_VERSION_SIZE = len(Path("/proc/version").read_bytes())


async def test_a_machine_pseudo_file_too_large_to_compare_is_never_replayed(
    autojump_clock, host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mount table of a busy node can exceed what is compared by content: a call
    that depends on such a file is made every time rather than trusted unchanged."""
    version = Path("/proc/version")
    sim = MachineReader("kernel", version)
    reconciler = Reconciler(host, [sim])
    state = make_state(1)
    for _ in range(3):
        await reconciler.reconcile_once(state)
    made = len(sim.calls("stage"))
    assert made < 3  # small and unchanged: compared, replayed
    monkeypatch.setattr(mokka.noderoot.settled, "CONTENT_LIMIT", KERNEL_VERSION_SIZE - 1)
    for _ in range(3):
        await reconciler.reconcile_once(state)
    assert len(sim.calls("stage")) == made + 3
    await teardown(host, [sim], timeout=10)


async def test_a_failed_call_is_never_replayed(autojump_clock, host: Host) -> None:
    from mokka.errors import StageError

    sim = FakeSimulator("sim", stage_errors=[None, StageError("disk full")])
    reconciler = Reconciler(host, [sim])
    state = make_state(1)
    assert (await reconciler.reconcile_once(state)).ok
    # A new state fails; going back to the first state must stage it again,
    # not replay a record of a call the failure may have undone.
    assert not (await reconciler.reconcile_once(make_state(2))).ok
    assert (await reconciler.reconcile_once(state)).ok
    assert [c[2] for c in sim.calls("stage")] == [1, 2, 1]
    await teardown(host, [sim], timeout=10)


async def test_trio_threads_carry_the_recording(autojump_clock, host: Host) -> None:
    """A stage that converges from a worker thread is recorded (and replayed) too."""

    class Threaded(FakeSimulator):
        async def stage(self, host: Host, state) -> None:
            self._record("stage", state)
            await trio.to_thread.run_sync(
                host.converge, self.name, [File(f"/fake/{self.name}/x", b"x")]
            )

    sim = Threaded("threaded")
    reconciler, state = await passed_twice(host, sim)
    assert len(sim.calls("stage")) == 1
    (host.root / "fake/threaded/x").unlink()
    await reconciler.reconcile_once(state)
    assert len(sim.calls("stage")) == 2
    assert (host.root / "fake/threaded/x").read_bytes() == b"x"
    await teardown(host, [sim], timeout=10)
