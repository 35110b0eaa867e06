"""The command line never misleads: one-line errors naming the flag, exit 2
before anything starts, no abbreviations, ``--version``, unknown commands."""

from __future__ import annotations

import importlib.metadata
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mokka import cli
from tests.daemon_support import PROCESS_TIMEOUT, daemon_env


def _main(*argv: str) -> int:
    """``cli.main`` with argparse's own exits turned into a return code."""
    try:
        return cli.main(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)


def _one_line_error(capsys, prefix: str) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(prefix), captured.err
    return captured.err.strip()


def test_a_misspelt_command_is_named_and_the_commands_listed(capsys, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _main("deamon") == 2
    err = _one_line_error(capsys, "mokka: error: ")
    assert err == (
        "mokka: error: unknown command 'deamon', expected one of: daemon, cleanup, ctl, "
        "fabricmanager-ctl (no command: daemon)"
    )
    assert os.listdir(tmp_path) == []


def test_version_is_the_installed_package_s(capsys):
    assert _main("--version") == 0
    assert capsys.readouterr().out == f"mokka {importlib.metadata.version('mokka')}\n"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--profil", "h100"], "--profil"),
        (["daemon", "--root=/nonexistent", "--onc"], "--onc"),
        (["cleanup", "--roo", "/nonexistent"], "--roo"),
        (["ctl", "status", "--jso"], "--jso"),
    ],
)
def test_abbreviated_flags_are_refused(argv, flag, capsys, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _main(*argv) == 2
    err = _one_line_error(capsys, "mokka")
    assert f"unrecognized arguments: {flag}" in err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--uvm-major", "abc"], "mokka daemon: error: --uvm-major: 'abc' is not an integer"),
        (
            ["--fabric-manager-init-delay", "soon"],
            "mokka daemon: error: --fabric-manager-init-delay: 'soon' is not a number",
        ),
        (
            ["--uvm-major", "195"],
            "mokka daemon: error: --uvm-major: got 195, expected a character major in 1..4095 "
            "other than 195",
        ),
        (
            ["--nvidia-caps-major", "0"],
            "mokka daemon: error: --nvidia-caps-major: got 0, expected a character major in "
            "1..4095 other than 195",
        ),
    ],
)
def test_a_bad_simulator_flag_is_one_line_naming_the_flag(
    argv, expected, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert _main("daemon", *argv) == 2
    assert _one_line_error(capsys, "mokka daemon: error: ") == expected
    assert os.listdir(tmp_path) == []


def test_an_unknown_builtin_profile_is_refused_before_anything_starts(
    capsys, tmp_path: Path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert _main("--profile", "h1000") == 2
    err = _one_line_error(capsys, "mokka daemon: error: --profile: 'h1000' is not a built-in")
    assert "h100" in err
    # No ./mokka-node, no log, no probes: nothing started.
    assert os.listdir(tmp_path) == []


def test_a_missing_profile_path_is_left_to_the_daemon(tmp_path: Path):
    """A path may appear later (a ConfigMap mounted late): not a usage error."""
    from mokka.daemon.command import check_before_start
    from mokka.settings import Settings

    check_before_start(Settings(profile=str(tmp_path / "later.yaml"), node_name="n"))
    check_before_start(Settings(profile="custom.yaml", node_name="n"))


def test_the_control_plane_source_is_refused_before_anything_starts(
    capsys, tmp_path: Path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert _main("--source", "control-plane", "--health-addr", "127.0.0.1:0") == 2
    _one_line_error(capsys, "mokka daemon: error: --source control-plane: ")
    assert os.listdir(tmp_path) == []


def test_a_busy_probe_address_says_so_and_exits_2(tmp_path: Path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "mokka",
                "--health-addr",
                f"127.0.0.1:{port}",
                "--node-name",
                "test-node",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=daemon_env(),
            timeout=PROCESS_TIMEOUT,
            check=False,
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        f"mokka daemon: error: --health-addr: cannot listen on 127.0.0.1:{port}: "
        "address already in use\n"
    )
    assert "Traceback" not in done.stdout
    assert "sub-exception" not in done.stdout + done.stderr
    assert os.listdir(tmp_path) == []  # the ./mokka-node it made is gone again


def test_the_docs_name_the_supervised_daemons_there_are():
    """docs/daemon.md lists the simulators the supervisor runs; it must stay true."""
    import re

    from mokka.simulators.base import Daemon
    from mokka.simulators.registry import build_simulators

    text = (Path(__file__).parent.parent / "docs" / "daemon.md").read_text()
    listed = re.search(r"Simulators that are also `Daemon`s \(today ([^)]*)\)", text)
    assert listed, "docs/daemon.md no longer lists the supervised daemons"
    named = re.findall(r"`([\w-]+)`", listed[1])
    args = cli.build_parser().parse_args(["daemon"])
    daemons = [sim.name for sim in build_simulators(args) if isinstance(sim, Daemon)]
    assert named == daemons
