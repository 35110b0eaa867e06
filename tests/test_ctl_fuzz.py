"""``mokka ctl`` under hostile arguments: never a traceback, and every value it accepts stages.

Every verb ``mokka ctl --help`` lists gets each hostile value in each of its
slots (huge, negative and 4300-digit numbers, NaN and infinities, deep and
long keys, long strings, control characters, bytes that are not UTF-8, the
empty string): the call ends with exit 0, 1 or 2 and one line per problem,
and whatever it wrote compiles and renders into an engine config the mock
library's reader takes, which is what the gpudriver's stage checks.  Most
calls run in-process (a few thousand of them); a sample runs as real
processes, and one staged node runs ``mokka daemon --once`` on what ctl
accepted, then ``mokka cleanup``.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mokka.ctl import command as ctl
from mokka.ctl import edits as ctl_edits
from mokka.ctl import verbs as ctl_verbs
from mokka.errors import SpecError
from mokka.layout import CONFIG_DIR, ENGINE_CONFIG, OVERRIDES
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.simulators.ib import mad
from mokka.simulators.ib.counters import COUNTER_MAX
from mokka.simulators.ib.mockib import UMAD_SOCKET
from mokka.state.compile import NodeMeta, compile_state
from mokka.state.override_doc import Overrides
from mokka.state.overrides import load_overrides
from mokka.state.profile import load_profile
from mokka.state.reader import load_yaml
from tests.daemon_support import PROCESS_TIMEOUT, daemon_env, run_mokka
from tests.support import snapshot

NODE = "fuzz-node"
#: Where a hostile value goes in a template.
X = "\N{BLACK SQUARE}"
#: Text that is not UTF-8, as Python hands it over from a command line
#: (``os.fsdecode``: each bad byte becomes a lone surrogate).
NOT_UTF8 = os.fsdecode(b"\xff\xfe\x80")
HOSTILE = [
    "18446744073709551615", "18446744073709551616", "-1", "-9223372036854775809",
    "9" * 4200, "9" * 4301, "-" + "9" * 5000, "1e400", "-1e400", "1e-400", "0x10", "0o7", "1_0",
    "nan", "NaN", ".nan", "inf", "-inf", ".inf", "Infinity",
    "", " ", "\x00", "a\nb", "\t", "\x1b[31m", "\x9b", "\u2028", NOT_UTF8, "\udcff",
    "x" * 5000, "y" * 4096, "\N{SNOWMAN}" * 1366, "[" * 10_000, "{a: " * 200, "&a [*a]",
    "!!binary AAEC", "!!int x", "2024-01-01", "2024-13-45", "1:20", "true", "null", "~",
    "a." * 10_001 + "b", ".".join(["k"] * 70), "fan." + ".".join(["k"] * 61), "k" * 300,
    "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff", "all", "P99", "p0", "none", "mlx5_4294967296",
    "mlx5_\N{SUPERSCRIPT TWO}", "\N{SUPERSCRIPT TWO}", "symbol_error=18446744073709551616",
]
#: Every verb's slots: its arguments, with ``X`` where the hostile value goes.
SLOTS: dict[str, list[list[str]]] = {
    "fail": [["--gpu", X, "--mode", "lost"], ["--gpu", "0", "--mode", X],
             ["--gpu", "0", "--mode", "lost", "--after-calls", X],
             ["--gpu", "0", "--mode", "lost", "--probability", X],
             ["--gpu", "0", "--mode", "lost", "--probability", "0.5", "--seed", X],
             ["--gpu", "0", "--mode", "lost", "--xid", X]],
    "xid": [["--gpu", X, "--code", "79"], ["--gpu", "0", "--code", X]],
    "temp": [["--gpu", "0", "--celsius", X]],
    "power": [["--gpu", "0", "--watts", X]],
    "util": [["--gpu", "0", "--gpu-pct", X], ["--gpu", "0", "--gpu-pct", "5", "--mem-pct", X]],
    "clocks": [["--gpu", "0", "--graphics", X], ["--gpu", "0", "--graphics", "1", "--memory", X]],
    "throttle": [["--gpu", "0", "--reasons", X]],
    "pstate": [["--gpu", "0", "--state", X]],
    "nvlink-error": [["--gpu", "0", "--link", X], ["--gpu", "0", "--link", "1", "--count", X]],
    "fabric-health": [["--gpu", "0", "--state", X]],
    "mig": [["--gpu", X, "--create", "1g.10gb"], ["--gpu", "0", "--create", X],
            ["--gpu", "0", "--mode", X]],
    "set": [[X], [f"fan.speed={X}"], [f"fan={X}"], [f"processes={X}"],
            [f"thermal.temperature_gpu_c={X}"], [f"persistence_mode={X}"], [f"{X}=1"],
            [f"fan.{X}=1"], ["--gpu", X, "fan.speed=1"]],
    "status": [["--gpu", X], ["--gpu", X, "--json"]],
    "reset": [["--gpu", X]],
    ctl_verbs.IB_COUNTER_VERB: [["--hca", X, "symbol_error=1"], ["--hca", "mlx5_0", X],
                                ["--hca", "mlx5_0", f"symbol_error={X}"],
                                ["--hca", "mlx5_0", "--set", f"link_downed={X}"]],
}
#: Where a path goes (``--root``, ``--file``): the node root is placed after ``X``.
PATHS = ["\x00", "a\x00b", NOT_UTF8, "x" * 5000, "", "-", "/proc/self/mem", "/dev/null"]
#: The line every problem ctl itself reports starts with.
ERROR = "mokka ctl: error: "


@pytest.fixture
def staged(tmp_path: Path) -> Path:
    """A node root as a staged agent leaves it for ctl: the driver config directory and the
    h100 engine config (so ``--gpu`` is checked against this node's GPUs)."""
    root = tmp_path / "node"
    (root / CONFIG_DIR.lstrip("/")).mkdir(parents=True)
    state = compile_state(load_profile("h100"), node=NodeMeta(node_name=NODE))
    (root / ENGINE_CONFIG.lstrip("/")).write_text(render_engine_config(state))
    return root


@pytest.fixture
def mock_ib(staged: Path) -> Iterator[list[int]]:
    """A stand-in for ``mock-ib``'s umad socket: answers every counter change with success,
    so ``ib-counter`` gets as far as sending; yields the values it was sent."""
    path = staged / UMAD_SOCKET.lstrip("/")
    path.parent.mkdir(parents=True)
    received: list[int] = []
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as server:
        # by the directory's descriptor, as ctl connects: the path is too long for AF_UNIX
        server.bind(f"/proc/self/fd/{directory}/{path.name}")
        os.close(directory)
        server.listen(8)
        server.settimeout(0.2)
        stop = threading.Event()

        def serve() -> None:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(PROCESS_TIMEOUT)
                    while frame := conn.recv(256):
                        change = mad.Control.unpack(frame).counter
                        received.append(change.value)
                        # the reply and the whole 64-bit value after it
                        conn.send(mad.counter_reply(0, change.value))

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            yield received
        finally:
            stop.set()
            thread.join(timeout=PROCESS_TIMEOUT)


def call(argv: list[str], capsys: pytest.CaptureFixture[str], *, path: str = "\0"
         ) -> tuple[int, str]:
    """``mokka ctl ARGV`` in-process: the exit status and stderr.  Anything but an exit
    (a traceback) fails the test as it is raised.  ``path``: a ``--root`` or ``--file``
    given, which a message may name whole."""
    try:
        code = ctl.main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code if isinstance(exc.code, int) else 2
        assert code in (0, 2), argv
        return code, capsys.readouterr().err
    err = capsys.readouterr().err
    assert code in (0, 1, 2), (argv, err)
    lines = err.splitlines()
    # every problem one line of its own, each short enough to read: no value is echoed whole
    assert all(line.startswith(ERROR) and len(line.replace(path, "")) < 700
               for line in lines), (argv, err)
    assert (code == 0) == (lines == []), (argv, err)
    return code, err


def stages(root: Path) -> None:
    """The overrides ctl left compile and render into an engine config, as the stage does."""
    overrides = load_overrides(root / OVERRIDES.lstrip("/"), root=root)
    state = compile_state(load_profile("h100"), node=NodeMeta(node_name=NODE), overrides=overrides)
    assert render_engine_config(state).startswith("#")


def cases() -> Iterator[tuple[str, list[str]]]:
    for verb, templates in SLOTS.items():
        for template in templates:
            for value in HOSTILE:
                yield verb, [value if arg == X else arg.replace(X, value) for arg in template]


@pytest.mark.timeout(600)
def test_every_verb_survives_hostile_values_and_what_it_accepts_stages(
    staged: Path, mock_ib: list[int], capsys: pytest.CaptureFixture[str]
):
    # every verb ``mokka ctl --help`` lists has its slots
    parser = argparse.ArgumentParser(prog="mokka ctl")
    ctl_verbs.add_verbs(parser)
    assert set(SLOTS) == set(ctl_verbs.verbs_action(parser).choices)
    accepted: dict[str, int] = {}
    refused = 0
    for verb, args in cases():
        code, err = call([verb, "--root", str(staged), *args], capsys)
        if verb == ctl_verbs.IB_COUNTER_VERB:
            assert code in (0, 2), (args, err)
        elif code == 0 and verb != "status":
            stages(staged)
            accepted[verb] = accepted.get(verb, 0) + 1
            assert ctl.main(["reset", "--root", str(staged)]) == 0
        refused += code != 0
    # Values did land on every writing verb, and many more were refused.
    assert set(accepted) >= {"fail", "xid", "power", "set", "reset"}, accepted
    assert refused > 1000
    # ib-counter sent only values that fit the frame
    assert mock_ib
    assert all(0 <= value <= COUNTER_MAX for value in mock_ib)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flag", ["--root", "--file"])
def test_hostile_paths_are_refused_or_read_never_a_traceback(
    staged: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], flag: str
):
    monkeypatch.chdir(tmp_path)
    for verb in ("status", "set", "reset", ctl_verbs.IB_COUNTER_VERB):
        rest = {"set": ["fan.speed=1"], ctl_verbs.IB_COUNTER_VERB: ["--hca", "mlx5_0",
                                                                     "symbol_error=1"]}
        # (ib-counter prints through its own module: a path that is not UTF-8 is
        # left to the real processes below, whose stderr escapes it)
        for path in PATHS if verb != ctl_verbs.IB_COUNTER_VERB else PATHS[:2]:
            code, err = call([verb, flag, path, *rest.get(verb, [])], capsys, path=path)
            if verb == ctl_verbs.IB_COUNTER_VERB and flag == "--file":
                assert (code, err) == (2, f"{ERROR}{verb} needs the node root (--root), "
                                          "not --file\n")
            elif "\x00" in path:
                assert (code, err) == (
                    2, f"{ERROR}{flag}: {path!r} holds a NUL byte, expected a path\n")
            elif path.startswith("/"):  # a device, or a file no one may replace
                assert code in (1, 2), (verb, flag, path, err)
    # nothing was made but what a --file named (a new overrides file, and its lock)
    named = {name + suffix for name in ("-", NOT_UTF8) for suffix in ("", ".lock")}
    assert set(os.listdir(tmp_path)) <= {"node", *named}
    assert os.listdir(tmp_path / "node") == ["var"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("value", "reason"), [
    ("x" * 5000, "value is 5000 bytes, expected at most 4096"),
    ('"a\\x01b"', "got 'a\\x01b', expected a string without newlines or control characters"),
    (".nan", "got nan, expected a finite number"),
    ("-.inf", "got -inf, expected a finite number"),
    ("2024-01-01", "got a date, expected a string, number or boolean"),
    ("!!binary AAEC", "got a bytes, expected a string, number or boolean"),
    ("9" * 4200, "a number of 4200 digits, expected at most 4096"),
])
def test_ctl_refuses_what_the_stage_refuses_with_the_same_reason(
    staged: Path, capsys: pytest.CaptureFixture[str], value: str, reason: str
):
    """``fan`` is an open block: the schema passes its shape, and the engine config's
    reader decides.  What the stage would refuse is refused at once (exit 2, the file
    untouched, the node never unready), in the stage's own words."""
    assert ctl.main(["set", "--root", str(staged), "--gpu", "0", "fan.speed=1"]) == 0
    before = (staged / OVERRIDES.lstrip("/")).read_bytes()
    code, err = call(["set", "--root", str(staged), "--gpu", "0", f"fan.speed={value}"], capsys)
    assert code == 2
    assert err == f"{ERROR}{staged}{OVERRIDES}: devices.0.fan.speed: {reason}\n"
    assert (staged / OVERRIDES.lstrip("/")).read_bytes() == before
    # the stage, handed the same value unchecked, refuses it for the same reason
    unchecked = Overrides(devices={"0": {"fan": {"speed": load_yaml(value, "value")}}})
    state = compile_state(load_profile("h100"), node=NodeMeta(node_name=NODE),
                          overrides=unchecked)
    with pytest.raises(SpecError) as refusal:
        render_engine_config(state)
    assert str(refusal.value) == f"engine config: device.0.fan.speed: {reason}"


# ---- real processes -------------------------------------------------------


def ctl_process(*args: str | bytes, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """A real ``python -m mokka ctl`` process; bytes arguments reach it as they are
    (not UTF-8, as a shell could pass them)."""
    return subprocess.run([sys.executable, "-m", "mokka", "ctl", *args], cwd=cwd,
                          env=daemon_env(), capture_output=True, timeout=PROCESS_TIMEOUT,
                          check=False)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("args", [
    ["set", "fan=" + "x" * 5000],
    ["set", "a." * 10_001 + "b=1"],
    ["set", "fan.speed=" + "9" * 4301],
    ["set", b"fan=\xff\xfe"],
    ["set", b"fan.\xff=1"],
    ["fail", "--gpu", "0", "--mode", "lost", "--after-calls", "9" * 4200],
    ["ib-counter", "--hca", "mlx5_0", "symbol_error=18446744073709551616"],
    ["ib-counter", "--hca", "mlx5_4294967296", "symbol_error=1"],
])
def test_a_real_call_with_hostile_arguments_prints_one_line_never_a_traceback(
    staged: Path, args: list[str | bytes]
):
    verb, *rest = args
    done = ctl_process(verb, "--root", str(staged), *rest, cwd=staged.parent)
    err = done.stderr.decode("utf-8", "backslashreplace")
    assert (done.returncode, done.stdout) == (2, b""), err
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1 or err.startswith("usage: "), err
    assert not (staged / OVERRIDES.lstrip("/")).exists()


@pytest.mark.timeout(300)
def test_what_ctl_accepts_at_the_limits_stages_in_a_real_pass(tmp_path: Path):
    """The longest value, the deepest key and the widest counter ctl takes: ``mokka daemon
    --once`` stages them, and ``mokka cleanup`` then leaves the root as it was found."""
    root = tmp_path / "node"
    root.mkdir()
    once = ["--once", "--root", str(root), "--node-name", NODE]
    assert run_mokka(*once, cwd=tmp_path).returncode == 0
    deep = "fan." + ".".join(["k"] * (ctl_edits.SET_KEY_MAX_DEPTH - 1))
    for args in (["set", f"fan.speed={'y' * 4096}", f"{deep}=1", "processes=[{pid: 1}, 2]"],
                 ["set", "--gpu", "1", f"fan.max={'9' * 4096}", "dynamic_metrics.x=1.5e+300"],
                 ["nvlink-error", "--gpu", "0", "--link", "3", "--count", str(2**64 - 1)],
                 ["fail", "--gpu", "2", "--mode", "lost", "--after-calls", str(2**64 - 1)]):
        done = ctl_process(args[0], "--root", str(root), *args[1:], cwd=tmp_path)
        assert (done.returncode, done.stderr) == (0, b""), args
    # a step past each limit is refused, the file left as it was
    written = (root / OVERRIDES.lstrip("/")).read_bytes()
    for args in (["set", f"fan.speed={'y' * 4097}"], ["set", f"{deep}.k=1"],
                 ["nvlink-error", "--gpu", "0", "--link", "3"],
                 ["fail", "--gpu", "2", "--after-calls", str(2**64)]):
        assert ctl_process(args[0], "--root", str(root), *args[1:], cwd=tmp_path).returncode == 2
    assert (root / OVERRIDES.lstrip("/")).read_bytes() == written

    staged = run_mokka(*once, cwd=tmp_path)
    assert staged.returncode == 0, staged.stdout + staged.stderr
    assert re.search(r"^generation 1: ok in ", staged.stdout, re.M), staged.stdout
    config = (root / ENGINE_CONFIG.lstrip("/")).read_text()
    assert f'device.0.fan.speed: "{"y" * 4096}"' in config
    assert f"device.1.fan.max: {'9' * 4096}" in config
    assert f"device.0.nvlink_errors.3: {2**64 - 1}" in config

    cleanup = run_mokka("cleanup", "--root", str(root), cwd=tmp_path)
    assert cleanup.returncode == 0, cleanup.stderr
    assert snapshot(root) == {}
