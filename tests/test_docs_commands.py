"""Every command in README.md and docs/*.md runs as shown, or is listed with why not.

The commands come from the docs' ``sh``/``bash`` blocks and ``$ `` prompts
(``tests/docs_commands_support.py``).  The local ones run with ``bash -c`` as
the docs write them (rewritten only where the table says: a placeholder, a
host path, a fixed port), most of them against ONE daemon this module starts:
the README's bare ``mokka`` in a temporary directory, so ``./mokka-node`` in
the docs is its node root.  Each checks the exit code the doc implies and a
stable part of the output it shows; a scratch root a command staged is
cleaned up and checked empty, and the shared daemon's Ctrl-C is checked to
leave its directory as it found it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.daemon_support import PROCESS_TIMEOUT, daemon_env
from tests.docs_commands_support import (
    NOT_RUN,
    RUN,
    NotRun,
    classify,
    commands_in,
    doc_commands,
    fill,
    rewritten,
)
from tests.helm_tool import helm_binary
from tests.support import ROOT, real_nvidia_smi

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(120)]

COMMANDS = doc_commands()
VENV_BIN = Path(sys.executable).parent
#: The flags the shared daemon adds to the README's bare ``mokka`` (see RUN["mokka"]).
SHARED_FLAGS = ("--health-addr", "127.0.0.1:0", "--node-name", "docs")
TOPOLOGY = """\
version: 1
domains:
  - uuid: "00000000-0000-0000-0000-0000000000d0"
    cliques:
      - id: 0
        nodes: [worker-1]
"""


def first_place(text: str) -> str:
    return next(c.where for c in COMMANDS if c.text == text)


def command_env(home: Path) -> dict[str, str]:
    env = daemon_env()
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"
    # helm keeps its caches under a temporary home, never the user's.
    for name in ("HOME", "HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[name] = str(home / name.lower())
    return env


def bash(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
        check=False,
    )


# --------------------------------------------------------------------------
# Every command is classified
# --------------------------------------------------------------------------


def test_every_doc_command_is_run_or_listed() -> None:
    unclassified = [f"{c.where}: {c.text}" for c in COMMANDS if classify(c) is None]
    assert not unclassified, (
        "commands in the docs that the docs test neither runs nor lists; add each to RUN or "
        "NOT_RUN in tests/docs_commands_support.py:\n" + "\n".join(unclassified)
    )
    # The extraction sees what it must: a fair number, from README.md and docs/.
    assert len(COMMANDS) > 100
    assert {c.path for c in COMMANDS} >= {"README.md", "docs/helm.md", "docs/ctl.md"}


def test_a_new_command_is_unclassified_until_listed(tmp_path: Path) -> None:
    doc = tmp_path / "new.md"
    doc.write_text("# New\n\n```sh\nmokka ctl frobnicate --gpu 0\nkubectl get nodes\n```\n")
    new, cluster = commands_in(doc, "docs/new.md")
    assert new.where == "docs/new.md:4"
    assert classify(new) is None
    assert isinstance(classify(cluster), NotRun)


def test_every_listed_command_is_still_in_the_docs() -> None:
    shown = {c.text for c in COMMANDS}
    stale = sorted((set(RUN) | set(NOT_RUN)) - shown)
    assert not stale, "table entries no doc shows any more (remove them):\n" + "\n".join(stale)
    assert all(isinstance(treatment, NotRun) and treatment.reason for treatment in NOT_RUN.values())
    # A rewrite says why it is there.
    assert [text for text, run in RUN.items() if run.rewrite and not run.why] == []


def test_extraction_joins_what_the_shell_joins(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n"
        "```sh\n"
        "# a comment line\n"
        "mokka ctl status   # trailing comment\n"
        "helm install a ./b \\\n"
        "  --set x=1\n"
        "sh -c '\n"
        "  echo # not a comment\n"
        "'\n"
        "for f in a b; do\n"
        '  echo "$f"\n'
        "done\n"
        "cat > x.json <<'EOF'\n"
        '{"a": \'b}\n'
        "EOF\n"
        "```\n"
        "- item:\n"
        "  ```\n"
        "  $ mokka --version\n"
        "  mokka 0.1.0\n"
        "  $ true\n"
        "  ```\n"
        "```yaml\n"
        "key: value\n"
        "```\n"
    )
    found = [(c.line, c.text, c.shown) for c in commands_in(doc, "doc.md")]
    assert found == [
        (4, "mokka ctl status", ""),
        (5, "helm install a ./b --set x=1", ""),
        (7, "sh -c '\necho # not a comment\n'", ""),
        (10, 'for f in a b; do\necho "$f"\ndone', ""),
        (13, "cat > x.json <<'EOF'\n{\"a\": 'b}\nEOF", ""),
        (19, "mokka --version", "mokka 0.1.0"),
        (21, "true", ""),
    ]


# --------------------------------------------------------------------------
# The shared daemon: the README's bare `mokka`
# --------------------------------------------------------------------------


@attrs.frozen
class SharedDaemon:
    directory: Path  #: where `mokka` was started: ./mokka-node is its root
    port: int
    env: dict[str, str]


def wait_for_log(log: Path, pattern: str, process: subprocess.Popen) -> re.Match:
    deadline = time.monotonic() + PROCESS_TIMEOUT
    while time.monotonic() < deadline:
        if match := re.search(pattern, log.read_text()):
            return match
        if process.poll() is not None:
            break
        time.sleep(0.05)  # polling a log, not timing anything
    raise AssertionError(f"the daemon never logged {pattern!r}; log:\n{log.read_text()}")


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedDaemon]:
    directory = tmp_path_factory.mktemp("docs-daemon")
    scratch = tmp_path_factory.mktemp("docs-daemon-log")
    log = scratch / "daemon.log"
    env = command_env(scratch)
    argv = [*shlex.split("mokka"), "--nvidia-smi-binary", str(real_nvidia_smi()), *SHARED_FLAGS]
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, cwd=directory, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        port = int(wait_for_log(log, r"health probes on http://127\.0\.0\.1:(\d+)/", process)[1])
        wait_for_log(log, r"reconcile pass ok generation=1", process)
        yield SharedDaemon(directory, port, env)
    finally:
        process.send_signal(signal.SIGINT)  # the README's Ctrl-C
        code = process.wait(timeout=PROCESS_TIMEOUT)
    assert code == 0, log.read_text()
    # Ctrl-C removes ./mokka-node, which it made: the directory is as it was found.
    assert list(directory.iterdir()) == [], log.read_text()


# --------------------------------------------------------------------------
# The commands that run
# --------------------------------------------------------------------------


def runnable() -> list[str]:
    return [text for text in RUN if any(c.text == text for c in COMMANDS)]


def placeholders(tmp_path: Path, daemon: SharedDaemon, command: str) -> dict[str, str]:
    values = {
        "port": str(daemon.port),
        "node": str(tmp_path / "node"),
        "topology": str(tmp_path / "topo.yaml"),
        "profile": str(ROOT / "mokka" / "state" / "profiles" / "h100.yaml"),
        "helm": "",
    }
    (tmp_path / "topo.yaml").write_text(TOPOLOGY)
    if "helm" in command:
        values["helm"] = str(helm_binary())
    return values


@pytest.mark.parametrize("text", runnable(), ids=lambda text: first_place(text))
def test_doc_command_runs_as_shown(text: str, shared_daemon: SharedDaemon, tmp_path: Path) -> None:
    run = RUN[text]
    if run.is_shared_daemon:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{shared_daemon.port}/readyz", timeout=10
        ) as r:
            assert json.load(r)["status"] == "ready"
        return
    cwd = {"daemon": shared_daemon.directory, "scratch": tmp_path, "repo": ROOT}[run.cwd]
    values = placeholders(tmp_path, shared_daemon, text + run.before)
    env = {**shared_daemon.env, "HOME": str(tmp_path / "home")}
    before_run = set(cwd.iterdir()) if run.cwd == "daemon" else None
    try:
        if run.before:
            done = bash(fill(run.before, values), cwd, env)
            assert done.returncode == 0, f"{run.before}:\n{done.stdout}{done.stderr}"
        command = rewritten(text, run, values)
        done = bash(command, cwd, env)
        output = done.stdout + done.stderr
        where = f"{first_place(text)}: {command}"
        assert done.returncode == run.exit, f"{where}: exit {done.returncode}\n{output}"
        assert run.shows in output, f"{where}: no {run.shows!r} in\n{output}"
    finally:
        if run.resets:
            reset = bash("mokka ctl reset", cwd, env)
            assert reset.returncode == 0, reset.stdout + reset.stderr
    if run.cwd == "daemon":
        assert set(cwd.iterdir()) == before_run, "the command left files beside ./mokka-node"
    node = tmp_path / "node"
    if node.exists():
        cleanup = bash(f"mokka cleanup --root {shlex.quote(str(node))}", tmp_path, env)
        assert cleanup.returncode == 0, cleanup.stdout + cleanup.stderr
        assert not node.exists() or list(node.iterdir()) == [], "cleanup left files behind"


def test_runnable_commands_check_something() -> None:
    # Each run asserts a stable part of its output, or is the daemon itself.
    assert [t for t, run in RUN.items() if not run.shows and not run.is_shared_daemon and
            not run.before] == []  # fmt: skip
    assert RUN["mokka"].is_shared_daemon
