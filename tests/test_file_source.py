"""FileSource: real inotify on temp dirs (ConfigMap swap, editor save, symlink chains),
resync without inotify, debounce and error handling under the autojump clock."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import attrs
import pytest
import trio
import trio_util

from mokka.errors import SpecError
from mokka.layout import OVERRIDES
from mokka.noderoot.host import Host
from mokka.state.overrides import update_overrides
from mokka.state.sources import ControlPlaneSource, FileSource, SourceUpdate, make_source
from mokka.state.sources.file import watch_plan
from mokka.state.sources.inotify import IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO, Event
from tests.support import DATA

PROFILE = (DATA / "profiles" / "minimal.yaml").read_text()
CHANGED = PROFILE.replace("NVIDIA Test GPU", "NVIDIA Test GPU Rev 2")
#: Real inotify events arrive in microseconds; this bounds a broken test, not a timing.
DEADLINE = 10


async def inline(fn):
    """Run the re-read in the trio thread: under autojump no worker thread can be outrun."""
    return fn()


def no_inotify():
    raise OSError(errno.ENOSYS, "inotify_init1: Function not implemented")


def make(profile: Path | str, **kwargs) -> FileSource:
    kwargs.setdefault("debounce", 0.05)
    kwargs.setdefault("resync_interval", 0)
    return FileSource(profile=profile, node_name="worker-0", **kwargs)


async def generation(out: trio_util.AsyncValue, n: int) -> SourceUpdate:
    return await out.wait_value(lambda u: u is not None and u.state is not None
                                and u.state.generation >= n)


def kubelet_update(volume: Path, files: dict[str, str], stamp: int) -> None:
    """What the kubelet's atomic writer does to a ConfigMap volume, step by step."""
    new = volume / f"..2026_01_01_00_00_{stamp:02d}.123456789"
    new.mkdir()
    for name, text in files.items():
        (new / name).write_text(text)
    data = volume / "..data"
    old = os.readlink(data) if data.is_symlink() else None
    os.symlink(new.name, volume / "..data_tmp")
    os.rename(volume / "..data_tmp", data)
    for name in files:
        if not (volume / name).is_symlink():
            os.symlink(f"..data/{name}", volume / name)
    if old is not None:
        shutil.rmtree(volume / old)


def editor_save(path: Path, text: str) -> None:
    """Write a temp file beside the target and rename it over (vim, most editors)."""
    tmp = path.with_name(f".{path.name}.swp")
    tmp.write_text(text)
    os.rename(tmp, path)


def test_watch_plan_follows_the_configmap_layout(tmp_path: Path) -> None:
    volume = tmp_path / "mokka"
    volume.mkdir()
    kubelet_update(volume, {"config.yaml": PROFILE}, 1)
    real = os.readlink(volume / "..data")
    assert watch_plan(volume / "config.yaml") == {
        # the link, the ..data link, and the directory ..data points at
        str(volume): {"config.yaml", "..data", real},
        str(volume / real): {"config.yaml"},
    }


def test_watch_plan_of_a_missing_file_watches_the_nearest_directory(tmp_path: Path) -> None:
    assert watch_plan(tmp_path / "later" / "topology.yaml") == {str(tmp_path): {"later"}}


async def test_configmap_update_yields_exactly_one_new_state(tmp_path: Path) -> None:
    volume = tmp_path / "mokka"
    volume.mkdir()
    kubelet_update(volume, {"config.yaml": PROFILE}, 1)
    overrides = tmp_path / "config" / "overrides.yaml"
    overrides.parent.mkdir()
    source = make(volume / "config.yaml", overrides=overrides)
    out = trio_util.AsyncValue(None)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(source.run, out)
            assert out.value.state.generation == 1
            kubelet_update(volume, {"config.yaml": CHANGED}, 2)
            update = await generation(out, 2)
            assert update.state.gpus[0].name == "NVIDIA Test GPU Rev 2"
            # a later, unrelated change proves the swap's whole burst is behind us
            update_overrides(overrides, lambda d: d.update(all={"performance_state": "P2"}))
            update = await generation(out, 3)
            assert update.state.gpus[0].fields["performance_state"] == "P2"
            stats = source.statistics()
            assert (stats.generation, stats.reloads) == (3, 3)
            assert str(volume) in stats.watched
            assert not any("..2026_01_01_00_00_01" in d for d in stats.watched)
            nursery.cancel_scope.cancel()


async def test_editor_rename_over_yields_one_new_state(tmp_path: Path) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE)
    overrides = tmp_path / "overrides.yaml"
    source = make(profile, overrides=overrides)
    out = trio_util.AsyncValue(None)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(source.run, out)
            editor_save(profile, CHANGED)
            await generation(out, 2)
            update_overrides(overrides, lambda d: d.update(all={"performance_state": "P4"}))
            await generation(out, 3)
            assert source.statistics().reloads == 3
            nursery.cancel_scope.cancel()


async def test_edit_behind_a_symlink_chain_arrives(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    (tmp_path / "c" / "real.yaml").write_text(PROFILE)
    (tmp_path / "c" / "other.yaml").write_text(PROFILE.replace("Test GPU", "Other GPU"))
    os.symlink("../c/real.yaml", tmp_path / "b" / "mid.yaml")
    os.symlink("../b/mid.yaml", tmp_path / "a" / "link.yaml")
    source = make(tmp_path / "a" / "link.yaml")
    out = trio_util.AsyncValue(None)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(source.run, out)
            assert set(source.statistics().watched) == {
                str(tmp_path / n) for n in ("a", "b", "c")}
            # in place, at the far end of the chain
            (tmp_path / "c" / "real.yaml").write_text(CHANGED)
            assert (await generation(out, 2)).state.gpus[0].name == "NVIDIA Test GPU Rev 2"
            # re-point the middle link: the watch set follows the new target
            os.symlink("../c/other.yaml", tmp_path / "b" / "tmp.yaml")
            os.rename(tmp_path / "b" / "tmp.yaml", tmp_path / "b" / "mid.yaml")
            assert (await generation(out, 3)).state.gpus[0].name == "NVIDIA Other GPU"
            (tmp_path / "c" / "other.yaml").write_text(CHANGED.replace("Rev 2", "Rev 3"))
            assert (await generation(out, 4)).state.gpus[0].name == "NVIDIA Test GPU Rev 3"
            nursery.cancel_scope.cancel()


async def test_optional_files_appearing_later_are_picked_up(tmp_path: Path) -> None:
    topology = tmp_path / "later" / "topology.yaml"
    source = make("t4", topology=topology, overrides=tmp_path / "absent" / "overrides.yaml")
    out = trio_util.AsyncValue(None)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(source.run, out)
            assert out.value.error is None
            assert out.value.state.topology is None
            topology.parent.mkdir()
            topology.write_text((DATA / "profiles" / "topology-plain.yaml").read_text())
            update = await out.wait_value(
                lambda u: u.state is not None and u.state.topology is not None)
            assert update.state.topology.placement("worker-0") is not None
            nursery.cancel_scope.cancel()


async def test_resync_picks_changes_up_without_inotify(
    tmp_path: Path, autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE)
    source = make(profile, resync_interval=30, open_inotify=no_inotify, offload=inline)
    out = trio_util.AsyncValue(None)
    caplog.set_level(logging.WARNING, logger="mokka.state.sources.file")
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(source.run, out)
        assert "inotify unavailable" in caplog.text
        profile.write_text(CHANGED)
        await trio.sleep(31)
        assert out.value.state.generation == 2
        assert out.value.at == start + 30
        # an unchanged file re-read by the next resync keeps its generation,
        # republished as a fresh update (the reconciler's drift-repair tick)
        changed = out.value
        await trio.sleep(30)
        assert source.statistics().reloads == 3
        assert out.value.state.generation == 2
        assert out.value.state is changed.state
        assert out.value is not changed
        assert out.value.at == start + 60
        nursery.cancel_scope.cancel()


async def test_broken_profile_keeps_last_good_state(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE)
    source = make(profile, resync_interval=10, open_inotify=no_inotify, offload=inline)
    out = trio_util.AsyncValue(None)
    async with trio.open_nursery() as nursery:
        await nursery.start(source.run, out)
        good = out.value.state
        profile.write_text(PROFILE.replace('"580.105.08"', '"five"'))
        await trio.sleep(11)
        assert out.value.state is good
        assert isinstance(out.value.error, SpecError)
        assert out.value.error.problems == (
            f"{profile}: system.driver_version: 'five' is not a driver version of 2-3 "
            "dot-separated numbers like 580.105.08",)
        # back to the same content: the error clears, still generation 1
        profile.write_text(PROFILE)
        await trio.sleep(10)
        assert (out.value.state, out.value.error) == (good, None)
        profile.write_text("version: [\n")
        await trio.sleep(10)
        assert out.value.error.problems[0].startswith(f"{profile}: line 2 column 1: not valid YAML")
        profile.write_text(CHANGED)
        await trio.sleep(10)
        assert out.value.error is None
        assert out.value.state.generation == 2
        nursery.cancel_scope.cancel()


class FakeInotify:
    """Events on demand, so the debounce runs on the autojump clock."""

    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[Event](100)
        self.dirs: dict[str, int] = {}

    def add_watch(self, directory: str) -> int:
        return self.dirs.setdefault(directory, len(self.dirs) + 1)

    def rm_watch(self, wd: int) -> None:
        pass

    async def read_events(self) -> list[Event]:
        return [await self.receive.receive()]

    def close(self) -> None:
        pass

    def touch(self, path: Path) -> None:
        self.send.send_nowait(Event(self.dirs[str(path.parent)], IN_CLOSE_WRITE, 0, path.name))

    def rename(self, source: Path, target: Path) -> None:
        """The events of ``rename(source, target)`` within one watched directory."""
        wd = self.dirs[str(target.parent)]
        self.send.send_nowait(Event(wd, IN_MOVED_FROM, 7, source.name))
        self.send.send_nowait(Event(wd, IN_MOVED_TO, 7, target.name))


def on_fake_inotify(tmp_path: Path) -> tuple[Path, FakeInotify, FileSource]:
    """A profile, events on demand for it, and a source following it with a 0.1 s debounce."""
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE)
    fake = FakeInotify()
    source = make(profile, debounce=0.1, max_delay=1.0, open_inotify=lambda: fake,
                  offload=inline)
    return profile, fake, source


async def test_bursts_are_debounced(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    profile, fake, source = on_fake_inotify(tmp_path)
    out = trio_util.AsyncValue(None)
    async with trio.open_nursery() as nursery:
        await nursery.start(source.run, out)
        start = trio.current_time()
        profile.write_text(CHANGED)
        for _ in range(3):
            fake.touch(profile)
            await trio.sleep(0.05)
        fake.touch(tmp_path / "unrelated.txt")  # not a watched name: no effect
        update = await generation(out, 2)
        # last relevant event at +0.10, then 0.1 s of quiet
        assert update.at - start == pytest.approx(0.2)
        assert source.statistics().reloads == 2
        # a never-ending burst still reloads after max_delay
        start = trio.current_time()
        profile.write_text(PROFILE)
        async with trio.open_nursery() as chatter:
            async def keep_touching() -> None:
                while True:
                    fake.touch(profile)
                    await trio.sleep(0.05)
            chatter.start_soon(keep_touching)
            update = await generation(out, 3)
            chatter.cancel_scope.cancel()
        assert update.at - start == pytest.approx(1.0)
        nursery.cancel_scope.cancel()


async def test_a_rename_onto_the_file_is_read_at_once(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """A rename lands a whole file: no quiet period after it, even in the middle of a burst."""
    profile, fake, source = on_fake_inotify(tmp_path)
    out = trio_util.AsyncValue(None)
    async with trio.open_nursery() as nursery:
        await nursery.start(source.run, out)
        start = trio.current_time()
        (tmp_path / ".profile.yaml.swp").write_text(CHANGED)
        os.rename(tmp_path / ".profile.yaml.swp", profile)
        fake.rename(tmp_path / ".profile.yaml.swp", profile)
        update = await generation(out, 2)
        assert update.at - start == 0
        # A burst of in-place writes waits for quiet, until a rename ends it.
        start = trio.current_time()
        profile.write_text(PROFILE)
        fake.touch(profile)
        await trio.sleep(0.05)
        fake.touch(profile)
        await trio.sleep(0.05)
        (tmp_path / ".profile.yaml.swp").write_text(CHANGED.replace("Rev 2", "Rev 3"))
        os.rename(tmp_path / ".profile.yaml.swp", profile)
        fake.rename(tmp_path / ".profile.yaml.swp", profile)
        update = await generation(out, 3)
        assert update.at - start == pytest.approx(0.1)
        assert "Rev 3" in update.state.gpus[0].name
        assert source.statistics().reloads == 3
        # The temp name going away alone is noise, not a change.
        fake.send.send_nowait(Event(fake.dirs[str(tmp_path)], IN_MOVED_FROM, 8,
                                    ".profile.yaml.swp"))
        await trio.sleep(1)
        assert source.statistics().reloads == 3
        nursery.cancel_scope.cancel()


def test_make_source_defaults_overrides_to_the_node_path(tmp_path: Path) -> None:
    host = Host(tmp_path)
    settings = SimpleNamespace(
        source="file", profile="gb200", topology=None, overrides=None, node_name="n1",
        resync_interval=15.0, reload_debounce=0.25, feature_gates={"IMEXDownload": True})
    source = make_source(settings, host)
    assert isinstance(source, FileSource)
    assert source.debounce == 0.25  # --reload-debounce
    assert source.overrides == host.resolve(OVERRIDES)
    assert source.overrides == tmp_path / OVERRIDES.lstrip("/")
    assert (source.profile, source.node_name, source.resync_interval) == ("gb200", "n1", 15.0)
    assert source.paths() == [source.overrides]  # a built-in profile is not a file
    # the root's own file is read without following links beneath the root...
    assert source.overrides_root == host.root
    given = SimpleNamespace(**{**vars(settings), "overrides": tmp_path / "o.yaml"})
    # ...a file the operator names is followed (a ConfigMap volume is links)
    assert make_source(given, host).overrides == tmp_path / "o.yaml"
    assert make_source(given, host).overrides_root is None


async def test_control_plane_source_says_it_is_not_implemented(tmp_path: Path) -> None:
    settings = SimpleNamespace(source="control-plane")
    source = make_source(settings, Host(tmp_path))
    assert isinstance(source, ControlPlaneSource)
    with pytest.raises(SpecError) as info:
        await source.run(trio_util.AsyncValue(None))
    assert info.value.problems == (
        "--source control-plane: the control-plane state source (MEP-0001) is not implemented; "
        "the file source (--source file, the default) is the one in use",)


async def test_an_unexpected_error_is_an_error_update_not_a_crash(
    tmp_path: Path, autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A compiler bug met by some input must not end the source (and with it the
    daemon, whose teardown would take every GPU off the node): it is reported
    like a bad input, the last good state stays, and the next good read recovers."""
    import mokka.state.sources.file as file_source

    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE)
    source = make(profile, resync_interval=10, open_inotify=no_inotify, offload=inline)
    out = trio_util.AsyncValue(None)
    real_compile = file_source.compile_state

    def compile_state(*args, **kwargs):
        if "Rev 2" in profile.read_text():
            raise KeyError("pci")
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(file_source, "compile_state", compile_state)
    caplog.set_level(logging.ERROR, logger="mokka.state.sources.file")
    async with trio.open_nursery() as nursery:
        await nursery.start(source.run, out)
        good = out.value.state
        profile.write_text(CHANGED)
        await trio.sleep(11)
        assert out.value.state is good
        assert out.value.error.problems == (
            f"{profile}: cannot be compiled (KeyError: 'pci')",)
        await trio.sleep(10)  # the same error again: logged once, not per resync
        logged = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
        assert [r.exc_info[0] for r in logged if r.exc_info] == [KeyError]
        profile.write_text(PROFILE.replace("NVIDIA Test GPU", "NVIDIA Test GPU Rev 3"))
        await trio.sleep(10)
        assert out.value.error is None
        assert out.value.state.generation == 2
        nursery.cancel_scope.cancel()


async def test_an_unchanged_resync_compiles_nothing_and_republishes_the_same_state(
    tmp_path: Path, autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mokka.state.sources import file as file_source

    compiled: list[int] = []
    real_compile = file_source.compile_state

    def counting(*args, **kwargs):
        compiled.append(1)
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(file_source, "compile_state", counting)
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE)
    # racy_ns=0: the file was written a moment ago, and is trusted at once here
    source = make(profile, resync_interval=30, open_inotify=no_inotify, offload=inline,
                  racy_ns=0)
    out = trio_util.AsyncValue(None)
    async with trio.open_nursery() as nursery:
        await nursery.start(source.run, out)
        first = out.value
        await trio.sleep(31)
        assert source.statistics().reloads == 2
        assert out.value is not first  # a fresh update: the reconciler's repair tick
        assert out.value.state is first.state
        assert (len(compiled), source.statistics().unchanged_reads) == (1, 1)
        # Same size, new content, same inode: the times tell the re-read.
        profile.write_text(PROFILE.replace("Test GPU", "Best GPU"))
        await trio.sleep(30)
        assert out.value.state.generation == 2
        assert out.value.state.gpus[0].name == "NVIDIA Best GPU"
        assert (len(compiled), source.statistics().unchanged_reads) == (2, 1)
        nursery.cancel_scope.cancel()


async def test_a_freshly_written_input_is_read_in_full_at_the_next_resync(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """Within ``racy_ns`` of its last change a file could change again within the same
    timestamp tick, unseen: its signature is not trusted yet."""
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE)
    source = make(profile, resync_interval=30, open_inotify=no_inotify, offload=inline,
                  racy_ns=3_600 * 10**9)
    out = trio_util.AsyncValue(None)
    async with trio.open_nursery() as nursery:
        await nursery.start(source.run, out)
        await trio.sleep(61)
        stats = source.statistics()
        assert (stats.reloads, stats.unchanged_reads) == (3, 0)
        nursery.cancel_scope.cancel()


# ---- a file read while it is rewritten in place ----------------------------------

FULL = "version: 1\ndomains: []\n# the rest of a longer document\n"
PREFIX = "version: 1\n"  # what an in-place writer has written so far: valid YAML too


@attrs.define
class InPlaceWriter:
    """Rewrites one file the way ``open(path, "w")`` does (same inode, truncated, then
    written), one step at a time: under the first ``races`` reads (between the reader's
    ``fstat`` and its ``read``), then at each of the reader's settles.  Deterministic."""

    path: Path
    steps: list[str]
    races: int = 0
    settles: int = 0
    _between_reads: bool = True

    def step(self) -> None:
        if self.steps:
            with open(self.path, "r+") as out:  # in place: the inode is kept
                out.truncate(0)
                out.write(self.steps.pop(0))

    def settle(self) -> None:
        self.settles += 1
        self.step()

    def read(self, fd: int, size: int) -> bytes:
        if self._between_reads and self.races > 0:
            self.races -= 1
            self.step()
        data = os.read(fd, size)
        self._between_reads = not data  # the end of one read: the next call starts another
        return data


def _at_rest(path: Path, text: str) -> None:
    path.write_text(text)
    an_hour_ago = os.stat(path).st_mtime_ns - 3600 * 10**9
    os.utime(path, ns=(an_hour_ago, an_hour_ago))


def _read_racing(monkeypatch: pytest.MonkeyPatch, writer: InPlaceWriter) -> str | None:
    from mokka.state import reader

    monkeypatch.setattr(reader, "os", SimpleNamespace(**{**vars(os), "read": writer.read}))
    monkeypatch.setattr(reader, "_settle", writer.settle, raising=False)
    return reader.read_input(writer.path, "the topology document")


def test_a_file_truncated_during_the_read_is_read_again_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path = tmp_path / "topology.yaml"
    _at_rest(path, FULL)
    writer = InPlaceWriter(path, [PREFIX, FULL], races=1)
    assert _read_racing(monkeypatch, writer) == FULL
    assert writer.steps == []


def test_a_file_just_written_in_place_is_read_once_it_settled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path = tmp_path / "topology.yaml"
    path.write_text(PREFIX)  # the writer's first write, this instant; the rest comes next
    writer = InPlaceWriter(path, [FULL])
    assert _read_racing(monkeypatch, writer) == FULL
    assert writer.settles == 1


def test_a_file_at_rest_is_read_once_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path = tmp_path / "topology.yaml"
    _at_rest(path, FULL)
    writer = InPlaceWriter(path, [PREFIX])
    assert _read_racing(monkeypatch, writer) == FULL
    assert writer.settles == 0


def test_a_file_that_never_stops_changing_is_refused_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path = tmp_path / "topology.yaml"
    _at_rest(path, FULL)
    writer = InPlaceWriter(path, [f"{PREFIX}# {i}\n" for i in range(20)], races=20)
    with pytest.raises(SpecError) as info:
        _read_racing(monkeypatch, writer)
    assert info.value.problems == (
        f"{path}: changed while being read (5 tries), expected the topology document at rest "
        "(it is read again at its next change)",
    )
