"""Damaged files under running NVML clients: they keep answering, never crash or hang.

Every file the mock library reads (the engine config, its change notice
``generation`` and the workload file) is damaged under a client that holds
the library open and polls it: truncated (to 0 and to lengths that cut the
counter, the format line, a quoted string, a line boundary), replaced by a
FIFO, a directory or a symlink loop, or given bytes that are not UTF-8.
Each poll must answer within its time limit, every answer the last good
one or an NVML error (a damaged workload file means every GPU is idle, as
documented), every string valid UTF-8; once the file is repaired the good
answers come back.  The client is a small C program (tests/
nvml_damage_client.c) in the matrix and under valgrind, nvidia-ml-py for the
decoding client of the report, and the real nvidia-smi looping on a query.

The files are staged through ``Host`` with the change notice, as the daemon
stages them, with ``MOCK_NVML_RECHECK_INTERVAL_MS=0`` so that every call
looks at them: a damage is met by the very next poll, with no waiting.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mokka import layout
from mokka.noderoot.host import File, Host
from mokka.simulators.gpudriver import notice
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state.compile import compile_profile
from tests.gpudriver_support import node_paths
from tests.nvml_support import compiler, load_target, nvml_env
from tests.support import require_tool

OWNER = "damage-test"
CLIENT = Path(__file__).resolve().parent / "nvml_damage_client.c"
HOLDER_NAME = "k8s:team/train/main"
WORKLOAD = f"""format: 1
workload.memory_share_per_holder: 0.25
workload.utilization_per_holder: 60
device_count: 8
device.0.process_count: 2
device.0.process.0.pid: 200001
device.0.process.0.name: "{HOLDER_NAME}"
device.0.process.1.pid: 200002
device.0.process.1.name: "k8s:lab/infer/server"
"""


@pytest.fixture(scope="module")
def client(native: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    header = load_target("nvml")._exports().find_header()
    binary = tmp_path_factory.mktemp("damage") / "nvml_damage_client"
    subprocess.run(
        [compiler(), "-O1", "-g", "-Wall", "-Werror", f"-I{header.parent}", str(CLIENT),
         "-o", str(binary), f"-L{native}", "-l:libnvidia-ml.so.1"],
        check=True, timeout=120,
    )
    return binary


@pytest.fixture
def staged(host: Host):
    """The engine config, its counter and a workload file, staged as the daemon does;
    discarding them afterwards leaves the root empty."""
    text = render_engine_config(compile_profile("h100", node_name="worker-1"))
    notice.converge_announced(host, OWNER, [File(layout.ENGINE_CONFIG, text),
                                            File(layout.WORKLOAD_CONFIG, WORKLOAD)])
    yield host
    host.discard(OWNER)
    assert node_paths(host.root) == set()


class Client:
    """A running client: one round of calls per ``poll``, parsed."""

    def __init__(self, argv: list[str], native: Path, config: Path, timeout: float) -> None:
        self.timeout = timeout
        env = {k: v for k, v in nvml_env(native, config).items() if not k.startswith("MOCK_NVML_")}
        env.update(LD_LIBRARY_PATH=str(native), MOCK_NVML_CONFIG=str(config),
                   MOCK_NVML_RECHECK_INTERVAL_MS="0")
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.init = self._line()

    def _line(self) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        if not ready:
            self.proc.kill()
            pytest.fail(f"the client hung: no answer within {self.timeout} s")
        raw = self.proc.stdout.readline()
        if not raw:
            self.proc.wait(timeout=60)
            pytest.fail(f"the client died (status {self.proc.returncode}): "
                        f"{self.proc.stderr.read()[-4000:]!r}")
        return raw.decode("utf-8")  # strict: whatever the library returned is UTF-8

    def poll(self) -> dict[str, tuple[str, str]]:
        """``what -> (NVML code, answer)`` of one round of calls."""
        self.proc.stdin.write(b"poll\n")
        self.proc.stdin.flush()
        fields = self._line().rstrip("\n").split("\t")
        return {what: tuple(rest.split(":", 1)) for what, rest in
                (field.split("=", 1) for field in fields)}

    def close(self) -> subprocess.CompletedProcess:
        try:
            out, err = self.proc.communicate(timeout=self.timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)


# ------------------------------------------------------------------ damages


def replace_with(path: Path, make: Callable[[Path], None]) -> None:
    path.unlink()
    make(path)


def truncate_to(length: int | Callable[[bytes], int]) -> Callable[[Path, bytes], None]:
    def damage(path: Path, good: bytes) -> None:
        os.truncate(path, length(good) if callable(length) else length)
    return damage


def after(needle: bytes, extra: int = 0) -> Callable[[bytes], int]:
    """The length that ends ``extra`` bytes after the end of ``needle``."""
    return lambda good: good.index(needle) + len(needle) + extra


def end_of_line(needle: bytes) -> Callable[[bytes], int]:
    """The length that ends right after the line holding ``needle``."""
    return lambda good: good.index(b"\n", good.index(needle)) + 1


def overwrite(raw: bytes) -> Callable[[Path, bytes], None]:
    """Writes ``raw`` over the start of the file, in place."""
    def damage(path: Path, good: bytes) -> None:
        with open(path, "r+b") as f:
            f.write(raw)
    return damage


def fifo(path: Path, good: bytes) -> None:
    replace_with(path, os.mkfifo)


def directory(path: Path, good: bytes) -> None:
    replace_with(path, os.mkdir)


def symlink_loop(path: Path, good: bytes) -> None:
    replace_with(path, lambda p: os.symlink(p.name, p))


def garble(old: bytes, new: bytes) -> Callable[[Path, bytes], None]:
    """Rewrites the file in place with ``old`` replaced by ``new`` (not UTF-8)."""
    def damage(path: Path, good: bytes) -> None:
        assert old in good
        with open(path, "r+b") as f:
            f.write(good.replace(old, new))
            f.truncate()
    return damage


def repair(path: Path, good: bytes) -> None:
    """The good bytes back in place of whatever the damage left."""
    if path.is_dir() and not path.is_symlink():
        path.rmdir()  # a rename replaces a FIFO or a link, not a directory
    tmp = path.with_name(path.name + ".repair")
    tmp.write_bytes(good)
    os.replace(tmp, path)


#: Damages per file: (label, damage, what the client answers meanwhile).
#: "good": the last good answers or NVML errors; "idle": the workload file
#: is ignored, so device 0 has no holders; a dict: those answers change.
GOOD = "good"
IDLE = "idle"
NAME = b"NVIDIA H100 80GB HBM3"
COMMON = [
    ("replaced by a FIFO", fifo),
    ("replaced by a directory", directory),
    ("replaced by a symlink loop", symlink_loop),
]
DAMAGES: dict[str, list[tuple[str, Callable[[Path, bytes], None], object]]] = {
    layout.ENGINE_CONFIG: [
        ("truncated to 0", truncate_to(0), GOOD),
        ("truncated to 1", truncate_to(1), GOOD),
        ("cut inside the format line", truncate_to(after(b"\nformat: ")), GOOD),
        ("cut after the format line", truncate_to(after(b"\nformat: 1\n")), GOOD),
        ("cut inside a quoted name", truncate_to(after(b'device.0.name: "NVIDIA', 2)), GOOD),
        ("cut at a line boundary", truncate_to(end_of_line(b"device.0.uuid: ")), GOOD),
        ("cut before the last newline", truncate_to(lambda good: len(good) - 1), GOOD),
        *[(label, damage, GOOD) for label, damage in COMMON],
        ("invalid bytes in a name", garble(NAME, b"NVIDIA \xff\xfe H100 \xe2\x82 \xed\xa0\x80"),
         {"name": ("0", "NVIDIA ?? H100 ?? ???")}),
        ("invalid bytes in a key", garble(b"device.0.minor:", b"device.0.mi\xffor:"), GOOD),
    ],
    layout.CONFIG_GENERATION: [
        ("truncated to 0", truncate_to(0), GOOD),
        ("truncated to 1", truncate_to(1), GOOD),
        ("truncated to 7", truncate_to(7), GOOD),
        *[(label, damage, GOOD) for label, damage in COMMON],
        ("invalid bytes", overwrite(b"\xff" * 8), GOOD),
    ],
    layout.WORKLOAD_CONFIG: [
        ("truncated to 0", truncate_to(0), IDLE),
        ("cut inside a quoted name", truncate_to(after(b'process.0.name: "k8s')), IDLE),
        *[(label, damage, IDLE) for label, damage in COMMON],
        ("invalid bytes in a holder's name",
         garble(HOLDER_NAME.encode(), b"k8s:team/tr\xc3\x28in/m\xffain"),
         {"process": ("0", "k8s:team/tr?(in/m?ain")}),
    ],
}


def check(label: str, answers: dict[str, tuple[str, str]], good: dict, idle: dict,
          how: object) -> None:
    """Each answer is the last good one (idle ones for an ignored workload file) or
    an NVML error; a damage that changes answers on purpose gives exactly those."""
    base = idle if how == IDLE else good
    changed = how if isinstance(how, dict) else {}
    assert answers.keys() == good.keys(), label
    for what, (code, value) in answers.items():
        if what in changed:
            assert (code, value) == changed[what], (label, what)
        else:
            assert (code, value) == base[what] or (code != "0" and value in ("", "0")), (
                label, what, code, value)


def idle_answers(client: Client, workload: Path) -> dict[str, tuple[str, str]]:
    """What the client answers without the workload file: no holders."""
    away = workload.with_name(workload.name + ".away")
    os.replace(workload, away)
    try:
        idle = client.poll()
    finally:
        os.replace(away, workload)
    assert idle["procs"] == ("0", "0")
    return idle


def damage_and_repair(client: Client, host: Host, node_files: list[str], polls: int) -> int:
    """Every damage of every file in ``node_files``, each polled ``polls`` times and
    then repaired (the good answers back); the number of damages done."""
    good = client.poll()
    assert good["name"] == ("0", NAME.decode())
    assert good["procs"] == ("0", "2")
    assert good["process"] == ("0", HOLDER_NAME)
    idle = idle_answers(client, host.resolve(layout.WORKLOAD_CONFIG))
    done = 0
    for node_file in node_files:
        path = host.resolve(node_file)
        good_bytes = path.read_bytes()
        for label, damage, how in DAMAGES[node_file]:
            damage(path, good_bytes)
            for _ in range(polls):
                check(f"{node_file} {label}", client.poll(), good, idle, how)
            repair(path, good_bytes)
            notice.bump(host)  # the daemon's next change: read through the repaired counter
            assert client.poll() == good, f"{node_file} {label}: not good again once repaired"
            done += 1
    return done


@pytest.mark.timeout(300)
@pytest.mark.parametrize("node_file", list(DAMAGES))
def test_a_running_client_survives_every_damage_of_a_file(
    staged: Host, client: Path, native: Path, node_file: str,
):
    c = Client([str(client)], native, staged.resolve(layout.ENGINE_CONFIG), timeout=60)
    try:
        assert c.init == "init=0\n"
        assert damage_and_repair(c, staged, [node_file], polls=2) == len(DAMAGES[node_file])
    finally:
        result = c.close()
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.mark.realclient
@pytest.mark.timeout(600)
def test_every_damage_under_valgrind(staged: Host, client: Path, native: Path):
    """The same damages, one client throughout, under memcheck: no invalid read or
    write, no definite leak, no descriptor left open (the counter file's included)."""
    valgrind = require_tool("valgrind")
    c = Client([valgrind, "--error-exitcode=1", "--leak-check=full",
                "--errors-for-leak-kinds=definite", "--track-fds=yes", "--quiet",
                str(client), "3"],
               native, staged.resolve(layout.ENGINE_CONFIG), timeout=120)
    try:
        assert c.init == "init=0\n"
        assert damage_and_repair(c, staged, list(DAMAGES), polls=1) == sum(
            len(d) for d in DAMAGES.values())
    finally:
        result = c.close()
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 0, stderr[-4000:]
    assert "generation" not in stderr  # --track-fds names any descriptor still open


@pytest.mark.timeout(300)
@pytest.mark.parametrize("node_file", list(DAMAGES))
@pytest.mark.parametrize("label", [label for label, _ in COMMON])
def test_a_client_started_on_a_damaged_file_does_not_hang(
    staged: Host, client: Path, native: Path, node_file: str, label: str,
):
    """nvmlInit meets the damage: a broken engine config fails it (999, as a file
    that does not parse does), a broken counter or workload file does not."""
    path = staged.resolve(node_file)
    good_bytes = path.read_bytes()
    dict(COMMON)[label](path, good_bytes)
    try:
        c = Client([str(client)], native, staged.resolve(layout.ENGINE_CONFIG), timeout=60)
        try:
            if node_file == layout.ENGINE_CONFIG:
                assert c.init == "init=999\n"
            else:
                assert c.init == "init=0\n"
                answers = c.poll()
                assert answers["name"] == ("0", NAME.decode())
                holders = "0" if node_file == layout.WORKLOAD_CONFIG else "2"
                assert answers["procs"] == ("0", holders)
        finally:
            result = c.close()
        assert result.returncode == 0, result.stderr[-4000:]
    finally:
        repair(path, good_bytes)


#: A long-lived nvidia-ml-py client (the one a monitoring agent is): per line
#: read, device 0's name and the name of a process holding it, as JSON.
PYNVML_CLIENT = r"""
import json, sys
import pynvml as nv
nv.nvmlInit()
handle = nv.nvmlDeviceGetHandleByIndex(0)
print("init=0", flush=True)
for line in sys.stdin:
    for _ in range(200):
        name = nv.nvmlDeviceGetName(handle)
        process = nv.nvmlSystemGetProcessName(200001)
    print(f"name=0:{name}\tprocess=0:{process}", flush=True)
"""


@pytest.mark.timeout(300)
def test_a_pynvml_client_survives_a_truncated_counter_and_a_name_that_is_not_utf8(
    staged: Host, native: Path,
):
    """Truncating the counter faulted (SIGBUS) a client that had it mapped; a name
    with bytes that are not UTF-8 raised UnicodeDecodeError in nvidia-ml-py."""
    c = Client([sys.executable, "-c", PYNVML_CLIENT], native,
               staged.resolve(layout.ENGINE_CONFIG), timeout=60)
    counter = staged.resolve(layout.CONFIG_GENERATION)
    config = staged.resolve(layout.ENGINE_CONFIG)
    counter_bytes, config_bytes = counter.read_bytes(), config.read_bytes()
    try:
        good = c.poll()
        assert good == {"name": ("0", NAME.decode()), "process": ("0", HOLDER_NAME)}
        os.truncate(counter, 0)
        assert c.poll() == good
        garble(NAME, b"NVIDIA \xff H100")(config, config_bytes)
        assert c.poll() == {"name": ("0", "NVIDIA ? H100"), "process": ("0", HOLDER_NAME)}
        repair(config, config_bytes)
        repair(counter, counter_bytes)
        notice.bump(staged)
        assert c.poll() == good
    finally:
        result = c.close()
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.mark.realclient
@pytest.mark.timeout(300)
def test_nvidia_smi_looping_on_a_query_survives_a_truncated_counter(
    staged: Host, native: Path, smi: Path,
):
    """The real nvidia-smi, querying every 20 ms, while the counter is truncated to 0
    and then put back: it keeps printing every GPU and exits cleanly when stopped."""
    counter = staged.resolve(layout.CONFIG_GENERATION)
    counter_bytes = counter.read_bytes()
    config = staged.resolve(layout.ENGINE_CONFIG)
    env = dict(nvml_env(native, config), MOCK_NVML_RECHECK_INTERVAL_MS="0")
    proc = subprocess.Popen([str(smi), "--query-gpu=index,name", "--format=csv,noheader",
                             "-lms", "20"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def rounds(n: int) -> None:
        """Waits for ``n`` more full rounds of the query (8 GPUs each)."""
        for _ in range(8 * n):
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            line = proc.stdout.readline() if ready else ""
            assert line, f"nvidia-smi stopped answering (status {proc.poll()})"
            assert line.split(", ", 1)[1].strip() == NAME.decode(), line

    try:
        rounds(2)
        os.truncate(counter, 0)
        rounds(5)
        repair(counter, counter_bytes)
        rounds(2)
        proc.terminate()
    finally:
        try:
            _out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode in (0, -15), err[-4000:]  # stopped by us, not by a fault
