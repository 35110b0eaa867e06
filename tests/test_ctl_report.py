"""``mokka ctl`` says what it changed and whether a daemon applies it.

Every writing verb prints one line: the GPU (index and UUID, as the engine
config pairs them), the change in the verb's units, and the daemon holding
the node root, or that none does, which exits 3 unless ``--no-daemon-ok``
(or env ``MOKKA_CTL_NO_DAEMON_OK=1``).  The daemon is recognised by the lock
it takes (``nodelock``'s ``flock`` on the root directory, held here by this
process and by a real ``mokka daemon``), read from ``/proc/locks`` without
taking it.  ``status`` lists the InfiniBand port counters ``ib-counter``
raised, read from the files the ib simulator stages (staged by hand, and by
a real daemon whose ``mock-ib`` took the change); an unknown flag is named as
such even where a required one is missing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from mokka.ctl import command as ctl
from mokka.ctl.command import EXIT_NO_DAEMON, NO_DAEMON_OK_ENV
from mokka.daemon.nodelock import try_hold_node_root
from mokka.layout import CONFIG_DIR, ENGINE_CONFIG
from mokka.noderoot.host import Host
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.simulators.ib.hca import plan_hcas
from mokka.simulators.ib.sysfs import hca_artifacts
from mokka.state.compile import compile_profile
from tests.daemon_support import PROCESS_TIMEOUT, daemon_env, running_daemon, stop_daemon
from tests.support import snapshot

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def staged(tmp_path: Path) -> tuple[Path, list[str]]:
    """A node root as a staged daemon leaves it for ctl (h100 engine config); its UUIDs."""
    root = tmp_path / "node"
    state = compile_profile("h100", node_name="report-node")
    (root / CONFIG_DIR.lstrip("/")).mkdir(parents=True)
    (root / ENGINE_CONFIG.lstrip("/")).write_text(render_engine_config(state))
    return root, [gpu.uuid for gpu in state.gpus]


def mokka(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = daemon_env()
    base.pop(NO_DAEMON_OK_ENV, None)
    return subprocess.run([sys.executable, "-m", "mokka", *argv], env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=PROCESS_TIMEOUT, check=False)


def test_without_a_daemon_the_change_is_written_said_and_exits_3(staged, tmp_path: Path):
    root, uuids = staged
    before = snapshot(root)
    done = mokka("ctl", "temp", "--root", str(root), "--gpu", "0", "--celsius", "70")
    assert done.returncode == EXIT_NO_DAEMON == 3
    assert done.stdout == (f"gpu 0 ({uuids[0]}): temperature 70 C; no daemon holds {root}: "
                           "nothing applies it until one starts\n")
    assert done.stderr == ("mokka ctl: error: no daemon applies this change "
                           "(exit 3; --no-daemon-ok makes it 0)\n")
    # written all the same: a daemon started later applies it
    shown = mokka("ctl", "status", "--root", str(root))
    assert shown.returncode == 0
    assert "thermal.temperature_gpu_c  70" in shown.stdout
    # told otherwise: the flag (before or after the verb) or the environment
    for argv, env in (
        (["ctl", "--no-daemon-ok", "xid", "--root", str(root), "--gpu", uuids[3], "--code", "79"],
         None),
        (["ctl", "power", "--root", str(root), "--gpu", "2", "--watts", "350.5",
          "--no-daemon-ok"], None),
        (["ctl", "reset", "--root", str(root)], {NO_DAEMON_OK_ENV: "1"}),
    ):
        done = mokka(*argv, env=env)
        assert (done.returncode, done.stderr) == (0, ""), argv
        assert done.stdout.endswith(f"; no daemon holds {root}: nothing applies it until one "
                                    "starts\n")
    assert mokka("ctl", "--no-daemon-ok", "xid", "--root", str(root), "--gpu", uuids[3],
                 "--code", "31").stdout.startswith(f"gpu 3 ({uuids[3]}): Xid 31 raised; ")
    assert mokka("ctl", "reset", "--root", str(root), "--no-daemon-ok").stdout.startswith(
        "every override removed; ")
    cleanup = mokka("cleanup", "--root", str(root))
    assert cleanup.returncode == 0, cleanup.stderr
    assert snapshot(root) == before


def test_with_the_daemons_lock_held_the_change_is_applied_and_exits_0(staged, capsys):
    root, uuids = staged
    # the lock ``mokka daemon`` holds for as long as it runs, taken by this process
    with try_hold_node_root(root) as held:
        assert held
        # a UUID in upper case: the line names it as the engine config spells it
        code = ctl.main(["fail", "--root", str(root), "--gpu", "GPU-" + uuids[5][4:].upper(),
                         "--mode", "fallen_off_bus", "--after-calls", "3", "--xid", "79"])
        out = capsys.readouterr()
    assert (code, out.err) == (0, "")
    assert out.out == (f"gpu 5 ({uuids[5]}): failure mode fallen_off_bus, after 3 guarded NVML "
                       f"calls, Xid 79; applied by the daemon holding {root} (pid {os.getpid()})\n")
    Host(root).discard_all()


def test_an_unknown_flag_is_named_before_a_missing_required_one(staged, capsys):
    root, _ = staged
    done = mokka("ctl", "temp", "--root", str(root), "--gpu", "0", "--cels", "50")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "mokka ctl temp: error: unrecognized arguments: --cels\n"
    with pytest.raises(SystemExit) as exited:
        ctl.main(["temp", "--root", str(root), "--gpu", "0", "--cels=50"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "mokka ctl temp: error: unrecognized arguments: --cels\n"
    assert not (root / CONFIG_DIR.lstrip("/") / "overrides.yaml").exists()


def test_status_lists_the_raised_ib_counters(staged):
    root, _ = staged
    before = snapshot(root)
    state = compile_profile("h100", node_name="report-node")
    hcas = plan_hcas(state)
    host = Host(root)
    # the files the ib simulator stages, with what ``ib-counter`` raised on two ports
    host.converge("ib-report", [
        *hca_artifacts(hcas[1], {"link_downed": 2}),
        *hca_artifacts(hcas[0]),
        *hca_artifacts(hcas[7], {"symbol_error": 5, "port_rcv_errors": 1}),
    ])
    done = mokka("ctl", "status", "--root", str(root))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"no overrides in {root}{CONFIG_DIR}/overrides.yaml",
        "",
        "IB PORT        COUNTER          VALUE",
        "mlx5_1 port 1  link_downed      2",
        "mlx5_7 port 1  port_rcv_errors  1",
        "mlx5_7 port 1  symbol_error     5",
    ]
    host.discard("ib-report")
    assert snapshot(root) == before


async def test_a_running_daemon_is_named_and_its_raised_ib_counters_listed(tmp_path: Path):
    root = tmp_path / "node"
    root.mkdir()
    before = snapshot(root)
    uuid = compile_profile("h100", node_name="report-node").gpus[0].uuid

    def ctl_call(*argv: str) -> subprocess.CompletedProcess[str]:
        return mokka("ctl", argv[0], "--root", str(root), *argv[1:])

    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon("--root", str(root), "--profile", "h100", "--health-addr",
                                  "127.0.0.1:0", cwd=tmp_path, node_name="report-node") as daemon:
            await daemon.wait_for_line(r"reconcile pass ok generation=1")
            temp = await trio.to_thread.run_sync(
                ctl_call, "temp", "--gpu", "0", "--celsius", "66")
            raised = await trio.to_thread.run_sync(
                ctl_call, "ib-counter", "--hca", "mlx5_2", "symbol_error=3")
            shown = await trio.to_thread.run_sync(ctl_call, "status")
            code = await stop_daemon(daemon, signal.SIGTERM)
    assert (temp.returncode, temp.stderr) == (0, "")
    assert temp.stdout == (f"gpu 0 ({uuid}): temperature 66 C; applied by the daemon holding "
                           f"{root} (pid {daemon.process.pid})\n")
    assert (raised.returncode, raised.stdout) == (0, "mlx5_2 port 1 symbol_error = 3\n")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-3:] == [
        "",
        "IB PORT        COUNTER       VALUE",
        "mlx5_2 port 1  symbol_error  3",
    ]
    assert code == 0
    assert snapshot(root) == before
