"""What each command imports: only what its own path needs.

Every ``mokka ctl`` call in a fault drill, every cold ``mokka daemon
--once`` and every daemon of a fleet pays for its imports in start-up time
and in memory (docs/benchmarks.md, "Goals").  These tests pin the module
*sets* (the figures are the benchmarks' business, ``bench/ctl_import.py``,
``bench/cold_warm.py``, ``bench/idle.py``): each command runs in a fresh
interpreter through ``mokka.cli.main`` and reports which of the modules it
must not need ended up in ``sys.modules``.

The first writing call under a node root records its files through
``Host`` (attrs and all); a later one, and ``status``, load neither the
host nor attrs, nor PyYAML for the file Mokka writes as JSON.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from mokka import cli
from mokka.layout import CONFIG_DIR, ENGINE_CONFIG, FABRIC_READY_MARKER
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state.compile import compile_profile
from tests.daemon_support import PROCESS_TIMEOUT, DaemonProcess, daemon_env, kill_if_running
from tests.support import snapshot

#: Runs ``cli.main`` on its arguments, then prints which of ``watched`` (module
#: names; a package stands for its submodules too) were imported, and the code.
PROBE = """
import json, sys
from mokka import cli
code = cli.main(sys.argv[1:])
watched = {watched!r}
found = sorted(m for m in sys.modules if any(m == w or m.startswith(w + ".") for w in watched))
print("IMPORTED " + json.dumps({{"code": code, "modules": found}}), flush=True)
"""

#: The daemon's stack: its event loop, the probes' server, the metrics
#: library, the kubelet client, every simulator.
DAEMON_STACK = ("mokka.daemon", "mokka.simulators", "trio", "trio_util", "hypercorn",
                "prometheus_client", "grpc")
#: Never needed by ctl: the daemon's settings, ``subprocess`` (runs host
#: commands), ``socket`` (finds the daemon's default node name),
#: ``importlib.metadata`` (answers ``--version``), ``logging`` (a call that
#: goes well logs nothing: ``mokka.lazylogger``).
CTL_NEVER = (*DAEMON_STACK, "mokka.settings", "socket", "subprocess", "importlib.metadata",
             "urllib.request", "http", "email", "logging")
#: ``status`` only reads: nothing of what writing a file takes (``Host`` and
#: its bookkeeping, the converge machinery, the backups' digests, ``ctypes``
#: for ``syncfs``).
STATUS_NEVER = (*CTL_NEVER, "mokka.noderoot.host", "mokka.noderoot.manifest",
                "mokka.noderoot.statedir",
                "mokka.noderoot.convergence", "mokka.noderoot.backups", "hashlib", "ctypes")
#: A writing call once the file and its lock are recorded (``mokka.ctl.records``),
#: and ``status``: nothing of the host's bookkeeping, no attrs, no PyYAML, and
#: not ``shutil`` (with ``bz2`` and ``lzma``), which argparse's stock help
#: formatter imports for the terminal's width (``mokka.helpformat``).
RECORDED_NEVER = (*STATUS_NEVER, "attrs", "yaml", "shutil", "bz2", "lzma")
#: What a running daemon needs only when it is asked for: the metrics
#: library (a ``/metrics`` scrape), the kubelet client (a kubelet socket),
#: the IMEX archive's download and unpacking (an archive to install), and
#: the modules of the other commands.
DAEMON_LATER = ("prometheus_client", "mokka.daemon.metrics", "grpc", "urllib.request",
                "http.client", "tarfile", "mokka.ctl", "mokka.ctl.verbs", "mokka.ctl.edits",
                "mokka.ctl.status", "mokka.ctl.targets", "mokka.ctl.fabricmanager",
                "importlib.metadata")
#: Not needed by a pass that serves no probes either: the probes' server.
ONCE_NEVER = (*DAEMON_LATER, "hypercorn")


def imported(argv: list[str], watched: tuple[str, ...], *, cwd: Path) -> tuple[int, list[str]]:
    """``mokka ARGV`` in a fresh interpreter: its exit code and which of ``watched`` it loaded."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(watched=watched), *argv],
        env=daemon_env(), cwd=cwd, capture_output=True, text=True, timeout=PROCESS_TIMEOUT,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("IMPORTED ")]
    assert lines, f"the probe reported nothing; stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    report = json.loads(lines[-1].removeprefix("IMPORTED "))
    return report["code"], report["modules"]


@pytest.fixture
def staged(tmp_path: Path) -> tuple[Path, str]:
    """A node root as a staged daemon leaves it for ctl (the h100 engine config); a GPU's UUID."""
    root = tmp_path / "node"
    state = compile_profile("h100", node_name="imports-node")
    (root / CONFIG_DIR.lstrip("/")).mkdir(parents=True)
    (root / ENGINE_CONFIG.lstrip("/")).write_text(render_engine_config(state))
    return root, state.gpus[5].uuid


# ---- the command table --------------------------------------------------------


def test_the_command_table_is_what_the_modules_register():
    """``cli.COMMAND_MODULES`` names each command's own module, and every command."""
    full = cli.command_names(cli.build_parser())
    assert full == list(cli.COMMAND_MODULES)
    for name, module in cli.COMMAND_MODULES.items():
        assert name in cli.command_names(cli.build_parser([module])), (name, module)


# ---- mokka ctl / fabricmanager-ctl -----------------------------------------------


@pytest.mark.parametrize("verb", [
    ["temp", "--gpu", "0", "--celsius", "70"],
    ["temp", "--gpu", "UUID", "--celsius", "71"],
    ["xid", "--gpu", "1", "--code", "79"],
    ["fail", "--gpu", "all", "--mode", "fallen_off_bus"],
    ["reset", "--gpu", "0"],
])
def test_a_ctl_verb_that_writes_imports_nothing_of_the_daemon(staged, tmp_path: Path, verb):
    root, uuid = staged
    argv = ["ctl", verb[0], "--root", str(root), *(uuid if a == "UUID" else a for a in verb[1:])]
    code, modules = imported(argv, CTL_NEVER, cwd=tmp_path)
    assert code == 0
    assert modules == []


def test_ctl_status_imports_nothing_that_writes(staged, tmp_path: Path):
    root, _ = staged
    # a file to show: the verb must read (and so parse) it
    assert imported(["ctl", "temp", "--root", str(root), "--gpu", "2", "--celsius", "66"],
                    (), cwd=tmp_path)[0] == 0
    for argv in (["ctl", "status", "--root", str(root)],
                 ["ctl", "status", "--root", str(root), "--json"]):
        code, modules = imported(argv, STATUS_NEVER, cwd=tmp_path)
        assert code == 0
        assert modules == []


def test_ctl_calls_after_the_first_load_no_host_attrs_or_yaml(staged, tmp_path: Path):
    root, uuid = staged
    first = ["ctl", "temp", "--root", str(root), "--gpu", "0", "--celsius", "70"]
    code, modules = imported(first, ("mokka.noderoot.host", "attrs"), cwd=tmp_path)
    assert code == 0
    assert "mokka.noderoot.host" in modules  # the first call records the file and its lock
    assert "attrs" in modules
    for argv in (first, ["ctl", "xid", "--root", str(root), "--gpu", uuid, "--code", "79"],
                 ["ctl", "fail", "--root", str(root), "--gpu", "all", "--mode", "fallen_off_bus"],
                 ["ctl", "reset", "--root", str(root), "--gpu", "0"],
                 ["ctl", "status", "--root", str(root)]):
        assert imported(argv, RECORDED_NEVER, cwd=tmp_path) == (0, []), argv


def test_fabricmanager_ctl_imports_nothing_of_the_daemon(staged, tmp_path: Path):
    root, _ = staged
    never = (*CTL_NEVER, "yaml", "attrs", "mokka.state", "mokka.noderoot.host",
             "mokka.noderoot.convergence")
    assert imported(["fabricmanager-ctl", "-q", "--root", str(root)], never, cwd=tmp_path) \
        == (1, [])
    marker = root / FABRIC_READY_MARKER.lstrip("/")
    marker.parent.mkdir(parents=True)
    marker.touch()
    assert imported(["fabricmanager-ctl", "-q", "--root", str(root)], never, cwd=tmp_path) \
        == (0, [])


# ---- mokka daemon --------------------------------------------------------------


@pytest.mark.parametrize("profile", ["h100", "gb200"])
def test_daemon_once_imports_no_server_and_no_daemon_stack(
    node_root: Path, tmp_path: Path, profile: str
):
    """``--once`` serves no probes and runs no daemon: their libraries stay unloaded."""
    before = snapshot(node_root)
    code, modules = imported(
        ["daemon", "--once", "--root", str(node_root), "--profile", profile,
         "--node-name", "imports-node"],
        ONCE_NEVER, cwd=tmp_path)
    assert code == 0
    assert modules == []
    assert snapshot(node_root) != before
    # --once leaves its files; cleanup removes them all, and nothing else
    assert imported(["cleanup", "--root", str(node_root)], ONCE_NEVER, cwd=tmp_path) == (0, [])
    assert snapshot(node_root) == before


async def _daemon_modules(root: Path, cwd: Path, *, scrape: bool) -> tuple[list[str], str]:
    """Run a real daemon to ready (and scrape ``/metrics`` if asked), SIGTERM it;
    the watched modules it had loaded, and the ``/metrics`` body (empty unless scraped)."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", PROBE.format(watched=DAEMON_LATER), "daemon", "--root", str(root),
         "--health-addr", "127.0.0.1:0", "--node-name", "imports-node"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd, env=daemon_env())
    daemon = DaemonProcess(process)
    body = ""
    try:
        port = int((await daemon.wait_for_line(r"health probes on .* port=(\d+)"))[1])
        await daemon.wait_for_line(r"reconcile pass ok generation=1 ")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            assert (await client.get("/readyz")).status_code == 200
            if scrape:
                response = await client.get("/metrics")
                assert response.status_code == 200
                body = response.text
        process.send_signal(signal.SIGTERM)
        report = await daemon.wait_for_line(r"^IMPORTED (.*)$")
        await daemon.drain()
        assert await process.wait() == 0, "\n".join(daemon.lines)
    finally:
        await kill_if_running(daemon)
    found = json.loads(report[1])
    assert found["code"] == 0
    return found["modules"], body


async def test_a_ready_daemon_loads_the_metrics_library_only_when_scraped(
    node_root: Path, tmp_path: Path
):
    """Probes and passes need no ``prometheus_client``; the first ``/metrics`` loads it."""
    before = snapshot(node_root)
    with trio.fail_after(2 * PROCESS_TIMEOUT):
        idle, _ = await _daemon_modules(node_root, tmp_path, scrape=False)
        scraped, body = await _daemon_modules(node_root, tmp_path, scrape=True)
    assert idle == []
    assert "mokka.daemon.metrics" in scraped
    assert "prometheus_client" in scraped
    # (prometheus_client brings urllib.request and http.client along)
    assert [m for m in scraped if m.startswith(("grpc", "tarfile", "mokka.ctl"))] == []
    assert 'mokka_passes_total{outcome="ok"} 1.0' in body
    assert snapshot(node_root) == before
