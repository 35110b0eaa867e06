"""The ``daemon`` and ``cleanup`` commands: real processes, real signals, real probes.

Plus the command line's own pieces (settings from flags and env, exit code 2
on bad values, the log line formats), which need no process.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from mokka import cli
from mokka.errors import SpecError
from mokka.logs import JsonFormatter, TextFormatter, setup_logging
from mokka.settings import FEATURE_GATES, Settings
from tests.daemon_support import (
    PROCESS_TIMEOUT,
    daemon_env,
    run_mokka,
    running_daemon,
    stop_daemon,
)
from tests.support import snapshot


def _plant(root: Path) -> None:
    """Files a real node root has before the daemon comes (and must have after)."""
    (root / "etc").mkdir()
    (root / "etc/hostname").write_text("test-node\n")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/tool").write_text("#!/bin/sh\n")
    os.chmod(root / "usr/bin/tool", 0o755)


async def test_sigterm_exits_zero_and_leaves_the_root_as_it_was(node_root: Path, tmp_path: Path):
    _plant(node_root)
    before = snapshot(node_root)
    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon(
            "--root", str(node_root), "--health-addr", "127.0.0.1:0", cwd=tmp_path
        ) as daemon:
            port = int((await daemon.wait_for_line(r"health probes on .* port=(\d+)"))[1])
            await daemon.wait_for_line(r"reconcile pass (\S+) generation=1")
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                health = await client.get("/healthz")
                ready = await client.get("/readyz")
                metrics = await client.get("/metrics")
            assert health.status_code == 200, health.text
            assert health.json()["observed_generation"] == 1
            assert set(ready.json()["simulators"]) >= {"gpudriver", "pcibus", "cri"}
            # The embedded default is ready: daemons start (and signal started)
            # within the pass whose log line we waited for.
            assert ready.status_code == 200, ready.text
            assert "mokka_passes_total" in metrics.text
            assert snapshot(node_root) != before  # it did stage something
            code = await stop_daemon(daemon, signal.SIGTERM)
    log = "\n".join(daemon.lines)
    assert code == 0, log
    assert "received SIGTERM; tearing down" in log
    assert "teardown finished" in log
    assert snapshot(node_root) == before


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_second_signal_during_teardown_changes_nothing(
    node_root: Path, tmp_path: Path, signum: signal.Signals
):
    """Ctrl-C twice (or a second SIGTERM): teardown still completes, exit code 0, no traceback."""
    before = snapshot(node_root)
    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon(
            "--root", str(node_root), "--health-addr", "127.0.0.1:0", cwd=tmp_path
        ) as daemon:
            await daemon.wait_for_line(r"reconcile pass ok generation=1")
            daemon.process.send_signal(signum)
            await daemon.wait_for_line(r"tearing down")
            code = await stop_daemon(daemon, signum)
    log = "\n".join(daemon.lines)
    assert code == 0, log
    assert "Traceback" not in log
    assert "teardown finished" in log
    assert snapshot(node_root) == before


async def test_ctrl_c_on_the_local_default_leaves_no_root_behind(tmp_path: Path):
    """``mokka`` with no root: ``./mokka-node`` is made and, after Ctrl-C, gone again."""
    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon("--health-addr", "127.0.0.1:0", cwd=tmp_path) as daemon:
            await daemon.wait_for_line(r"reconcile pass \S+ generation=1")
            assert (tmp_path / "mokka-node").is_dir()
            code = await stop_daemon(daemon, signal.SIGINT)
    assert code == 0, "\n".join(daemon.lines)
    assert any(f"root {tmp_path / 'mokka-node'}" in line for line in daemon.lines)
    assert os.listdir(tmp_path) == []


def test_once_leaves_the_files_and_cleanup_removes_them(node_root: Path, tmp_path: Path):
    _plant(node_root)
    before = snapshot(node_root)
    once = run_mokka("--once", "--root", str(node_root), "--node-name", "test-node", cwd=tmp_path)
    summary = re.search(r"^generation 1: (\S+) in [\d.]+s \((\d+) staged", once.stdout, re.M)
    assert summary, once.stdout + once.stderr
    assert once.returncode == (0 if summary[1] == "ok" else 1)
    assert int(summary[2]) >= 5
    assert snapshot(node_root) != before  # --once leaves what it staged

    cleanup = run_mokka("cleanup", "--root", str(node_root), cwd=tmp_path)
    assert cleanup.returncode == 0, cleanup.stderr
    # A summary by simulator, not a thousand lines: the paths only with -v.
    *per_owner, total = cleanup.stdout.splitlines()
    counts = dict(
        re.fullmatch(r"(.+): (\d+) path\(s\) removed", line).groups() for line in per_owner
    )
    assert {"gpudriver", "pcibus", "cri"} <= set(counts), cleanup.stdout
    assert total == (
        f"{sum(map(int, counts.values()))} path(s) removed under {node_root} (-v lists them)"
    )
    assert snapshot(node_root) == before
    again = run_mokka("cleanup", "--root", str(node_root), cwd=tmp_path)
    assert again.stdout.strip() == f"0 path(s) removed under {node_root}"

    # -v: every removed path, once, under its simulator.
    run_mokka("--once", "--root", str(node_root), "--node-name", "test-node", cwd=tmp_path)
    verbose = run_mokka("cleanup", "-v", "--root", str(node_root), cwd=tmp_path)
    assert verbose.returncode == 0, verbose.stderr
    listed = [line.strip() for line in verbose.stdout.splitlines() if line.startswith("  /")]
    assert len(listed) == len(set(listed)) > len(counts)
    assert verbose.stdout.splitlines()[-1] == f"{len(listed)} path(s) removed under {node_root}"
    assert snapshot(node_root) == before


def test_the_cleanup_command_once_prints_can_be_pasted_into_a_shell(tmp_path: Path):
    """Whatever the root is called: spaces, quotes, ``$`` and backquotes stay its name."""
    sentinel = tmp_path / "ran"
    root = tmp_path / f"my node 'a\"$(touch {sentinel})`touch {sentinel}`" / "node"
    root.mkdir(parents=True)
    once = run_mokka("--once", "--root", str(root), "--node-name", "test-node", cwd=tmp_path)
    hint = re.search(r"\(remove with: (.+)\)$", once.stdout, re.M)
    assert hint, once.stdout + once.stderr
    assert os.listdir(root) != []
    command = hint[1].replace("mokka ", f"{shlex.quote(sys.executable)} -m mokka ", 1)
    done = subprocess.run(["sh", "-c", command], cwd=tmp_path, env=daemon_env(),
                          capture_output=True, text=True, timeout=PROCESS_TIMEOUT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert os.listdir(root) == []
    assert not sentinel.exists()


# ---- flags and settings -----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--health-addr", "nowhere"], "--health-addr: 'nowhere' is not HOST:PORT"),
        (["--health-addr", "127.0.0.1:70000"], "--health-addr: port '70000'"),
        (
            ["--feature-gates", "Bogus=true"],
            "--feature-gates: unknown gate 'Bogus', expected one of: IMEXDownload",
        ),
        (
            ["--feature-gates", "IMEXDownload=maybe"],
            "expected IMEXDownload=true or IMEXDownload=false",
        ),
        (["--resync-interval", "-1"], "--resync-interval: '-1', expected a number >= 0"),
        (["--reload-debounce", "-0.5"], "--reload-debounce: '-0.5', expected a number >= 0"),
        (["--reload-debounce", "nan"], "--reload-debounce: 'nan', expected a number >= 0"),
        (["--shutdown-timeout", "0"], "--shutdown-timeout: '0', expected a number > 0"),
        (["--shutdown-timeout", "soon"], "--shutdown-timeout: 'soon' is not a number of seconds"),
        (["--log-format", "xml"], "--log-format: 'xml', expected one of: text, json"),
        (["--log-level", "loud"], "--log-level: 'loud', expected one of: DEBUG"),
        (["--source", "etcd"], "--source: 'etcd', expected one of: file, control-plane"),
    ],
)
def test_invalid_values_give_one_line_and_exit_2(args, message, capsys, tmp_path: Path):
    code = cli.main(["daemon", "--root", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith("mokka daemon: error: ")
    assert message in err
    assert os.listdir(tmp_path) == []


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    Settings.add_arguments(parser)
    return parser.parse_args(argv)


def test_settings_defaults_for_a_localrun_mokka():
    s = Settings.from_args(_parse(), environ={})
    assert s.root == Path("mokka-node")
    assert s.health_addr == ("127.0.0.1", 9091)
    assert (s.profile, s.topology, s.overrides) == ("h100", None, None)
    assert s.node_name
    assert s.node_name == __import__("socket").gethostname()
    assert (s.resync_interval, s.shutdown_timeout, s.once) == (60, 25, False)
    assert s.reload_debounce == 0.01
    assert (s.log_format, s.log_level, s.source) == ("text", "INFO", "file")
    assert dict(s.feature_gates) == {"IMEXDownload": False} == dict(FEATURE_GATES)


def test_settings_from_flags_and_env():
    env = {"MOKKA_ROOT": "/host", "NODE_NAME": "gpu-node-7"}
    s = Settings.from_args(_parse(), environ=env)
    # A root does not expose the probes: only --health-addr does (the chart passes it).
    assert (s.root, s.node_name, s.health_addr) == (
        Path("/host"),
        "gpu-node-7",
        ("127.0.0.1", 9091),
    )
    s = Settings.from_args(
        _parse(
            "--root",
            "/r",
            "--node-name",
            "flag-wins",
            "--health-addr",
            "[::1]:0",
            "--feature-gates",
            "IMEXDownload=true",
            "--log-level",
            "debug",
            "--once",
            "--topology",
            "/t.yaml",
            "--overrides",
            "/o.yaml",
            "--resync-interval",
            "0",
            "--reload-debounce",
            "0",
        ),
        environ=env,
    )
    assert (s.root, s.node_name, s.health_addr) == (Path("/r"), "flag-wins", ("::1", 0))
    assert s.feature_gates["IMEXDownload"] is True
    assert s.log_level == "DEBUG"
    assert s.once
    assert (s.topology, s.overrides, s.resync_interval) == (Path("/t.yaml"), Path("/o.yaml"), 0)
    assert s.reload_debounce == 0
    with pytest.raises(TypeError):
        s.feature_gates["IMEXDownload"] = False  # frozen all the way down
    with pytest.raises(SpecError, match="--node-name"):
        Settings.from_args(_parse("--node-name", " "), environ={})


def test_plain_mokka_and_the_node_agent_are_the_daemon(monkeypatch: pytest.MonkeyPatch):
    seen: list[argparse.Namespace] = []
    monkeypatch.setattr("mokka.daemon.command.run_daemon_command", lambda a: seen.append(a) or 0)
    assert cli.main(["--once", "--root", "/x"]) == 0
    monkeypatch.setattr(sys, "argv", ["mokka-node-agent", "--profile", "a100"])
    assert cli.node_agent_main() == 0
    assert [(a.command, a.once, a.profile) for a in seen] == [
        ("daemon", True, "h100"),
        ("daemon", False, "a100"),
    ]


# ---- log lines --------------------------------------------------------------


def _record(msg: str, *args, exc: bool = False, **extra) -> logging.LogRecord:
    logger = logging.getLogger("mokka.test")
    exc_info = None
    if exc:
        try:
            raise ValueError("inner\nline")
        except ValueError:
            exc_info = sys.exc_info()
    record = logger.makeRecord(
        "mokka.test", logging.WARNING, __file__, 1, msg, args, exc_info, extra=extra
    )
    record.created = 0.25
    record.msecs = 250
    return record


def test_text_lines_carry_extras_and_show_a_traceback_as_a_block():
    text = TextFormatter().format(_record("pass %s", "ok", generation=3, note="a b", exc=True))
    first, *block = text.split("\n")
    assert first == '1970-01-01T00:00:00.250Z WARNING mokka.test pass ok generation=3 note="a b"'
    # The traceback as Python prints it, indented under its record.
    assert block[0] == "    Traceback (most recent call last):"
    assert block[-2:] == ["    ValueError: inner", "    line"]
    assert all(line.startswith("    ") for line in block)
    plain = TextFormatter().format(_record("two\nlines", generation=1))
    assert plain.count("\n") == 0
    assert "two\\nlines" in plain


def test_json_lines_parse_back():
    line = JsonFormatter().format(_record("pass %s", "ok", generation=3, exc=True))
    doc = json.loads(line)
    assert (doc["ts"], doc["level"], doc["logger"], doc["msg"], doc["generation"]) == (
        "1970-01-01T00:00:00.250Z",
        "WARNING",
        "mokka.test",
        "pass ok",
        3,
    )
    assert doc["exc"].endswith("ValueError: inner\nline")


def test_setup_logging_writes_one_line_per_record_to_the_stream():
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        setup_logging(level="INFO", fmt="json", stream=stream)
        logging.getLogger("mokka.x").info("hello %d", 1, extra={"k": "v"})
        logging.getLogger("mokka.x").debug("hidden")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    lines = stream.getvalue().splitlines()
    assert [json.loads(x)["msg"] for x in lines] == ["hello 1"]
    assert json.loads(lines[0])["k"] == "v"


def test_an_unservable_source_is_a_usage_error(capsys, tmp_path: Path):
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        code = cli.main(["--once", "--root", str(tmp_path), "--source", "control-plane"])
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("mokka daemon: error: --source control-plane: ")
    assert os.listdir(tmp_path) == []
