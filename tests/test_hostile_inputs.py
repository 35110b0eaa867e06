"""Hostile inputs: nothing in a profile, topology or overrides file may hang the daemon,
make it write outside its root, serve content from outside the root, or leave the
node changed.

Each test first reproduces one way an input used to do that:

* nested aliases ("billion laughs"): 342 bytes that the old shape check
  walked path by path (9 levels never finished), and which every later walk
  would expand again;
* a FIFO as the profile or overrides file (``open`` blocks forever) and
  ``/dev/zero`` as the profile (read until memory runs out);
* a planted ``overrides.yaml.lock`` symlink (the lock was created wherever it
  pointed) and an ``overrides.yaml`` symlink to a file outside the root (read,
  and its first line served in ``/readyz``);
* ``mokka ctl`` edits, then a killed daemon: ``mokka cleanup`` left the
  overrides file, its lock and their directories behind.

Blocking calls run in an abandonable worker thread under ``trio.fail_after``,
so a regression fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio_util

from mokka import cli
from mokka.ctl import command as ctl
from mokka.errors import SpecError
from mokka.layout import CONFIG_DIR, OVERRIDES
from mokka.noderoot.host import File, Host
from mokka.state import checks, overrides, reader
from mokka.state.compile import load_inputs
from mokka.state.overrides import MANIFEST_OWNERS, load_overrides, reset_file, update_overrides
from mokka.state.profile import load_profile, parse_profile, read_profile_text
from mokka.state.sources.file import FileSource
from mokka.state.topology import load_topology
from tests.daemon_support import (
    PROCESS_TIMEOUT,
    kill_daemon,
    run_mokka,
    running_daemon,
    stop_daemon,
)
from tests.support import snapshot

#: Bound on one parse or read that must be quick (seconds, generous for a
#: loaded machine: the defects this guards against take minutes or forever).
QUICK = 20
SECRET = "TOPSECRET-4711: the first line of a root-only file outside the node root\n"


async def bounded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a worker thread, failing the test if it takes past ``QUICK``."""
    with trio.fail_after(QUICK):
        return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs), abandon_on_cancel=True)


async def bounded_error(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> SpecError:
    """The ``SpecError`` ``fn`` raises, within ``QUICK`` seconds."""
    def call() -> SpecError:
        with pytest.raises(SpecError) as info:
            fn(*args, **kwargs)
        return info.value
    return await bounded(call)


def billion_laughs(levels: int, fan: int = 9) -> str:
    """``levels`` anchors, each a list of ``fan`` aliases of the one before (fan**levels values)."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * fan) + "]"]
    for level in range(1, levels + 1):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * fan) + "]")
    return "\n".join(lines) + "\n"


# ---- the YAML reader -------------------------------------------------------


async def test_billion_laughs_of_nine_levels_is_refused_quickly() -> None:
    text = billion_laughs(9)
    assert len(text) < 600  # a few hundred bytes standing for 387 million values
    error = await bounded_error(reader.load_yaml, text, "bomb.yaml")
    assert error.problems == (
        f"bomb.yaml: more than {reader.MAX_NODES} values once its aliases are expanded, "
        "expected a document of at most that size (nested aliases multiply: a few lines can "
        "stand for billions of values)",)


async def test_the_shape_check_is_linear_in_what_the_text_spells_out() -> None:
    # 60 levels of two aliases each: 2**60 paths, which a walk path by path
    # never finishes; measured container by container it is 61 steps.
    wide = billion_laughs(60, fan=2)
    error = await bounded_error(reader.load_yaml, wide, "wide.yaml")
    assert "once its aliases are expanded" in str(error)
    # one alias per level: as deep, but small, so it loads
    doc = await bounded(reader.load_yaml, billion_laughs(60, fan=1), "chain.yaml")
    value = doc["a60"]
    for _ in range(60):
        value = value[0]
    assert value == ["lol"]


async def test_a_document_just_under_the_budget_loads() -> None:
    # 5**7 = 78,125 scalars plus the lists holding them: under 250,000
    doc = await bounded(reader.load_yaml, billion_laughs(6, fan=5), "fine.yaml")
    assert len(doc["a6"]) == 5
    assert reader.shape_problem(doc) is None


def test_depth_through_an_alias_counts_where_the_alias_is_used() -> None:
    # 40 levels under the anchor are fine where it is defined (depth 1),
    # but the alias sits 30 levels deeper: 70 levels in all.
    inner = "[" * 40 + "]" * 40
    deep_use = "[" * 30 + "*x" + "]" * 30
    with pytest.raises(SpecError, match=f"nested deeper than {reader.MAX_DEPTH} levels"):
        reader.load_yaml(f"a: &x {inner}\nb: {deep_use}\n", "deep.yaml")
    # the same alias used near the top is fine
    doc = reader.load_yaml(f"a: &x {inner}\nb: [*x]\n", "ok.yaml")
    assert doc["b"][0] is doc["a"]


def test_a_recursive_alias_is_still_refused() -> None:
    with pytest.raises(SpecError, match="a recursive alias"):
        reader.load_yaml("a: &a [1, {b: *a}]\n", "loop.yaml")


def test_messages_quote_only_a_short_excerpt() -> None:
    key = "k" * 1000  # YAML's longest plain key
    with pytest.raises(SpecError) as info:
        parse_profile(read_profile_text("t4")[1] + f"{key}: 1\n", source="t4.yaml")
    message = str(info.value)
    assert "k" * 61 not in message
    assert "t4.yaml: " + "k" * 57 + "...: unknown key" in message
    # an undefined alias's name is PyYAML's own words: cut as well
    with pytest.raises(SpecError) as info:
        reader.load_yaml("a: *" + "z" * 5000 + "\n", "alias.yaml")
    assert len(str(info.value)) < 200, str(info.value)


def test_a_file_reports_at_most_max_problems() -> None:
    extra = "".join(f"junk{i}: 1\n" for i in range(500))
    with pytest.raises(SpecError) as info:
        parse_profile(read_profile_text("t4")[1] + extra, source="t4.yaml")
    assert len(info.value.problems) == checks.MAX_PROBLEMS + 1
    assert info.value.problems[-1] == f"t4.yaml: and {500 - checks.MAX_PROBLEMS} more problems"


# ---- files that are not regular files --------------------------------------


@pytest.mark.parametrize("loader", [load_profile, load_topology, load_overrides],
                         ids=["profile", "topology", "overrides"])
async def test_a_fifo_input_is_refused_without_blocking(tmp_path: Path, loader) -> None:
    fifo = tmp_path / "input.yaml"
    os.mkfifo(fifo)
    error = await bounded_error(loader, fifo)
    assert str(error).startswith(f"{fifo}: a FIFO (named pipe), expected the ")
    assert str(error).endswith(" as a regular file")


async def test_dev_zero_as_the_profile_is_refused(tmp_path: Path) -> None:
    error = await bounded_error(load_profile, Path("/dev/zero"))
    assert str(error) == "/dev/zero: a character device, expected the profile as a regular file"
    # also behind a symlink (a profile path is followed, as a ConfigMap volume needs)
    link = tmp_path / "profile.yaml"
    link.symlink_to("/dev/zero")
    error = await bounded_error(load_profile, link)
    assert str(error) == f"{link}: a character device, expected the profile as a regular file"


async def test_a_directory_and_an_oversized_file_are_refused(tmp_path: Path) -> None:
    error = await bounded_error(load_topology, tmp_path)
    assert str(error) == (
        f"{tmp_path}: a directory, expected the topology document as a regular file")
    big = tmp_path / "big.yaml"
    big.touch()
    os.truncate(big, reader.MAX_INPUT_BYTES + 1)  # sparse: costs no disk
    error = await bounded_error(load_profile, big)
    assert str(error) == (f"{big}: larger than {reader.MAX_INPUT_BYTES} bytes, expected the "
                          "profile of at most 4 MiB")


async def test_load_inputs_reports_every_refused_file(tmp_path: Path) -> None:
    for name in ("topology.yaml", "overrides.yaml"):
        os.mkfifo(tmp_path / name)
    bomb = tmp_path / "profile.yaml"
    bomb.write_text(billion_laughs(9))
    error = await bounded_error(
        load_inputs, bomb, tmp_path / "topology.yaml", tmp_path / "overrides.yaml")
    assert [p.split(":")[0] for p in error.problems] == [
        str(bomb), str(tmp_path / "topology.yaml"), str(tmp_path / "overrides.yaml")]


# ---- the overrides file and its lock under the root ------------------------


def _config_dir(root: Path) -> Path:
    directory = root / CONFIG_DIR.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    return outside


def _planted_lock(root: Path, outside: Path) -> Path:
    """The overrides lock under ``root`` as a link to a file not yet in ``outside``."""
    lock = overrides.lock_path(_config_dir(root) / "overrides.yaml")
    lock.symlink_to(outside / "created-by-the-lock")
    return lock


def test_an_overrides_symlink_under_the_root_is_refused_and_never_quoted(
    node_root: Path, tmp_path: Path, capsys
) -> None:
    outside = _outside(tmp_path)
    path = _config_dir(node_root) / "overrides.yaml"
    path.symlink_to(outside / "secret")
    with pytest.raises(SpecError) as info:
        load_overrides(path, root=node_root)
    assert str(info.value) == (
        f"{path}: a symbolic link, expected the overrides file as a regular file (no link is "
        "followed beneath the node root)")
    # mokka ctl under the root: status and a change both refuse it
    assert ctl.main(["--root", str(node_root), "status"]) == 2
    assert ctl.main(["--root", str(node_root), "temp", "--gpu", "0", "--celsius", "70"]) == 2
    err = capsys.readouterr().err
    assert "TOPSECRET" not in err
    assert "a symbolic link, expected the overrides file" in err
    assert (outside / "secret").read_text() == SECRET
    assert sorted(os.listdir(outside)) == ["secret"]


def test_a_config_directory_swapped_for_a_link_is_never_followed(
    node_root: Path, tmp_path: Path, capsys
) -> None:
    """The path was resolved beneath the root; a directory on it replaced by a link since."""
    outside = _outside(tmp_path)
    (outside / "overrides.yaml").write_text(SECRET)
    (outside / "overrides.yaml.lock").write_text("")
    config = _config_dir(node_root)
    path = config / "overrides.yaml"
    config.rmdir()
    config.symlink_to(outside)
    with pytest.raises(SpecError) as info:
        load_overrides(path, root=node_root)
    assert str(info.value) == (
        f"{path}: a symbolic link, expected the overrides file as a regular file (no link is "
        "followed beneath the node root)")
    with pytest.raises(OSError, match="config, a directory on the way, is a symbolic link"):
        reset_file(path, root=node_root)
    # mokka ctl resolves the path afresh, the way the host would: the link's
    # absolute target re-rooted, where there is nothing (and nothing is made);
    # status and a change both say the node is not staged there
    assert ctl.main(["--root", str(node_root), "status"]) == 1
    assert ctl.main(["--root", str(node_root), "temp", "--gpu", "0", "--celsius", "70"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count(f"mokka ctl: error: {node_root}{outside}: no such directory") == 2
    assert "TOPSECRET" not in out + err
    assert sorted(os.listdir(outside)) == ["overrides.yaml", "overrides.yaml.lock", "secret"]
    assert (outside / "overrides.yaml").read_text() == SECRET
    # nothing made under the root either (the link's target re-rooted, say)
    assert sorted(p.name for p in node_root.iterdir()) == ["var"]


def test_a_lock_held_for_good_does_not_stall_the_reset(tmp_path: Path, monkeypatch) -> None:
    import fcntl

    monkeypatch.setattr(overrides, "RESET_LOCK_TIMEOUT", 0.05)
    path = tmp_path / "overrides.yaml"
    path.write_text("version: 1\n")
    holder = overrides.open_lock(path)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        # ends after the (shortened) timeout, and resets all the same
        assert reset_file(path) is True
    finally:
        os.close(holder)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind", ["fifo", "billion-laughs"])
async def test_ctl_file_status_of_a_hostile_file_is_refused_at_once(
    tmp_path: Path, kind: str, capsys
) -> None:
    path = tmp_path / "overrides.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(billion_laughs(9))
    assert await bounded(ctl.main, ["--file", str(path), "status"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mokka ctl: error: {path}: ")
    assert err.count("\n") == 1


async def test_a_planted_lock_symlink_creates_nothing_outside(tmp_path: Path, capsys) -> None:
    outside = _outside(tmp_path)
    directory = tmp_path / "config"
    directory.mkdir()
    path = directory / "overrides.yaml"
    overrides.lock_path(path).symlink_to(outside / "created-by-the-lock")

    def refused() -> None:
        with pytest.raises(OSError, match="a symbolic link, expected the lock file"):
            update_overrides(path, lambda doc: None)
    await bounded(refused)
    # mokka ctl --file: exit 1, naming the lock file
    assert await bounded(
        ctl.main, ["--file", str(path), "temp", "--gpu", "0", "--celsius", "70"]) == 1
    err = capsys.readouterr().err
    assert err == (f"mokka ctl: error: {overrides.lock_path(path)}: a symbolic link, expected "
                   "the lock file Mokka creates (no link is followed: it could lead outside the "
                   "node root)\n")
    assert not path.exists()
    # the daemon's reset removes the planted link itself, unfollowed
    assert await bounded(reset_file, path) is False
    assert os.listdir(directory) == []
    assert sorted(os.listdir(outside)) == ["secret"]


def test_ctl_under_a_root_replaces_a_planted_lock_and_puts_it_back(
    node_root: Path, tmp_path: Path
) -> None:
    """Under a root the lock is written through ``Host``: a link in its place is kept aside."""
    outside = _outside(tmp_path)
    lock = _planted_lock(node_root, outside)
    before = snapshot(node_root)
    assert ctl.main(["--root", str(node_root), "temp", "--gpu", "0", "--celsius", "70"]) == 0
    assert not lock.is_symlink()
    assert lock.is_file()
    assert sorted(os.listdir(outside)) == ["secret"]
    host = Host(node_root)
    for owner in MANIFEST_OWNERS:
        host.discard(owner)
    assert snapshot(node_root) == before


def test_ctl_records_the_file_and_lock_for_cleanup(node_root: Path) -> None:
    """``mokka cleanup`` (``discard_all``) removes what ``mokka ctl`` wrote, and its directories."""
    host = Host(node_root)
    # the directory as a simulator stages it: recorded by its owner
    host.converge("gpudriver-config", [File(CONFIG_DIR + "/config.yaml", b"device.0.index: 0\n")])
    before_ctl = snapshot(node_root)
    assert ctl.main(["--root", str(node_root), "xid", "--gpu", "0", "--code", "79"]) == 0
    assert set(host.owned(MANIFEST_OWNERS[0])) >= {OVERRIDES}
    assert set(host.owned(MANIFEST_OWNERS[1])) >= {OVERRIDES + ".lock"}
    assert snapshot(node_root) != before_ctl
    host.discard_all()
    assert os.listdir(node_root) == []


# ---- the source never waits for a read -------------------------------------


async def test_a_stuck_read_is_abandoned_on_cancel(tmp_path: Path, monkeypatch) -> None:
    import threading

    release = threading.Event()
    entered = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def stuck(*args: Any, **kwargs: Any) -> Any:
        token.run_sync_soon(entered.set)
        release.wait(QUICK * 3)  # a read that never ends (ended by the test below)
        raise SpecError("never")

    monkeypatch.setattr("mokka.state.sources.file.load_inputs", stuck)
    source = FileSource(profile="h100", node_name="n", open_inotify=_no_inotify)
    out: trio_util.AsyncValue = trio_util.AsyncValue(None)
    try:
        with trio.fail_after(QUICK):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(source.run, out)
                await entered.wait()
                nursery.cancel_scope.cancel()
        assert out.value is None  # nothing was published by the abandoned read
    finally:
        release.set()


def _no_inotify():
    raise OSError("inotify disabled for this test")


# ---- the real daemon -------------------------------------------------------


def _hostile_profile(kind: str, tmp_path: Path) -> Path:
    if kind == "fifo":
        path = tmp_path / "profile.yaml"
        os.mkfifo(path)
        return path
    if kind == "dev-zero":
        return Path("/dev/zero")
    path = tmp_path / "profile.yaml"
    path.write_text(billion_laughs(9))
    return path


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "billion-laughs"])
async def test_daemon_with_a_hostile_profile_exits_zero_on_sigterm(
    node_root: Path, tmp_path: Path, kind: str
) -> None:
    profile = _hostile_profile(kind, tmp_path)
    before = snapshot(node_root)
    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon(
            "--root", str(node_root), "--profile", str(profile), "--health-addr", "127.0.0.1:0",
            "--shutdown-timeout", "10", cwd=tmp_path) as daemon:
            port = int((await daemon.wait_for_line(r"health probes on .* port=(\d+)"))[1])
            await daemon.wait_for_line(r"desired state inputs are invalid")
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert str(profile) in ready.text
            with trio.fail_after(10 + 5):  # the shutdown timeout, plus start-up of the exit
                code = await stop_daemon(daemon, signal.SIGTERM)
    log = "\n".join(daemon.lines)
    assert code == 0, log
    assert "Traceback" not in log
    assert "teardown finished" in log
    assert snapshot(node_root) == before


async def test_daemon_never_serves_an_outside_file_nor_creates_one(
    node_root: Path, tmp_path: Path
) -> None:
    """A planted lock link (before start), an overrides link (while running): nothing outside."""
    outside = _outside(tmp_path)
    _planted_lock(node_root, outside)
    before = snapshot(node_root)
    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon(
            "--root", str(node_root), "--health-addr", "127.0.0.1:0", cwd=tmp_path) as daemon:
            port = int((await daemon.wait_for_line(r"health probes on .* port=(\d+)"))[1])
            await daemon.wait_for_line(r"reconcile pass \S+ generation=1")
            (node_root / OVERRIDES.lstrip("/")).symlink_to(outside / "secret")
            await daemon.wait_for_line(r"desired state inputs are invalid.*symbolic link")
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                ready = await client.get("/readyz")
            assert "TOPSECRET" not in ready.text
            assert "a symbolic link, expected the overrides file" in ready.text
            code = await stop_daemon(daemon, signal.SIGTERM)
    log = "\n".join(daemon.lines)
    assert code == 0, log
    assert "TOPSECRET" not in log
    assert sorted(os.listdir(outside)) == ["secret"]
    assert (outside / "secret").read_text() == SECRET
    # Both planted links are the user's: left in place, unfollowed, as found.
    before[OVERRIDES.lstrip("/")] = ("link", str(outside / "secret"))
    assert snapshot(node_root) == before


async def test_daemon_with_a_fifo_in_the_overrides_place_exits_zero_on_sigterm(
    node_root: Path, tmp_path: Path
) -> None:
    before = snapshot(node_root)
    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon(
            "--root", str(node_root), "--health-addr", "127.0.0.1:0", "--shutdown-timeout", "10",
            cwd=tmp_path) as daemon:
            await daemon.wait_for_line(r"reconcile pass \S+ generation=1")
            os.mkfifo(node_root / OVERRIDES.lstrip("/"))
            await daemon.wait_for_line(r"desired state inputs are invalid.*a FIFO")
            with trio.fail_after(10 + 5):  # the shutdown timeout, and the exit itself
                code = await stop_daemon(daemon, signal.SIGTERM)
    log = "\n".join(daemon.lines)
    assert code == 0, log
    assert "teardown finished" in log
    # the FIFO sat where the runtime overrides live: reset (removed) with them
    assert snapshot(node_root) == before


@pytest.mark.parametrize("when", ["running", "tearing-down"])
async def test_ctl_edit_then_a_killed_daemon_then_cleanup_leaves_the_root_as_it_was(
    node_root: Path, tmp_path: Path, when: str
) -> None:
    before = snapshot(node_root)
    with trio.fail_after(PROCESS_TIMEOUT):
        # Without the InfiniBand simulator: its relay socket is not the subject here.
        async with running_daemon(
            "--root", str(node_root), "--health-addr", "127.0.0.1:0", "--ib-mode", "off",
            cwd=tmp_path) as daemon:
            await daemon.wait_for_line(r"reconcile pass ok generation=1")
            assert await trio.to_thread.run_sync(cli.main, [
                "ctl", "--root", str(node_root), "temp", "--gpu", "0", "--celsius", "77"]) == 0
            await daemon.wait_for_line(r"desired state generation 2")
            if when == "tearing-down":
                daemon.process.send_signal(signal.SIGTERM)
                await daemon.wait_for_line(r"tearing down")
            await kill_daemon(daemon)
    cleanup = await trio.to_thread.run_sync(
        lambda: run_mokka("cleanup", "--root", str(node_root), cwd=tmp_path))
    assert cleanup.returncode == 0, cleanup.stdout + cleanup.stderr
    assert snapshot(node_root) == before
