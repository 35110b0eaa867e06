"""The shell commands of README.md and docs/*.md, and how the docs test treats each.

``doc_commands()`` reads every fenced ``sh``/``bash`` block (every line a
command, continuation lines, open quotes, here-documents and ``for``/``if``
bodies joined into one), and the ``$ `` prompt lines of any other block
(``console`` or a plain fence, whose following lines are the output shown).

``RUN`` says how ``tests/test_docs_commands.py`` runs a command: in which
directory, with which literal rewrites of a placeholder or a host path (each
with its reason), the exit code the doc implies and a stable part of the
output it shows.  ``NOT_RUN`` lists each command that is not run, with why;
``NOT_RUN_FAMILIES`` does the same for whole families (anything ``kubectl``
does needs a cluster).  A command in neither table fails the test, naming its
file and line, so a new command in the docs has to be classified here.

Placeholders in rewrites: ``{port}`` the shared daemon's health port,
``{node}`` a scratch node root of the command's own, ``{topology}`` a
topology document, ``{profile}`` a profile file, ``{helm}`` the pinned helm.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import attrs

from tests.support import ROOT

SHELL_FENCES = {"sh", "bash"}
PROMPT = "$ "
COMPOUND_OPEN = {"for", "while", "until", "if", "case"}
COMPOUND_CLOSE = {"done", "fi", "esac"}
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@attrs.frozen
class DocCommand:
    """One command as the docs show it."""

    path: str  #: relative to the repository
    line: int  #: where it starts (1-based)
    text: str  #: continuation lines joined with a space, the trailing comment dropped
    shown: str = ""  #: the output a ``$ `` prompt line is followed by

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def strip_comments(text: str) -> str:
    """``text`` without its ``# comments`` (a ``#`` outside quotes that starts a word runs
    to the end of its line); quotes may span lines."""
    kept: list[str] = []
    quote = ""
    in_comment = False
    for i, char in enumerate(text):
        if in_comment:
            if char != "\n":
                continue
            in_comment = False
        elif quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            in_comment = True
            continue
        kept.append(char)
    return "".join(kept)


def _is_complete(lines: list[str]) -> bool:
    """Whether ``lines`` hold one whole command: no continuation, quotes and
    here-documents closed, every ``for``/``if``/``case`` ended."""
    if lines[-1].endswith("\\"):
        return False
    if heredocs := HEREDOC.findall(lines[0]):
        # The body is data, not shell: only its terminator matters.
        return all(word in (line.strip() for line in lines[1:]) for _, word in heredocs)
    try:
        words = shlex.split("\n".join(lines), comments=True)
    except ValueError:  # an open quote: the command goes on
        return False
    words = [word.rstrip(";") for word in words]
    return sum(w in COMPOUND_OPEN for w in words) <= sum(w in COMPOUND_CLOSE for w in words)


def _normalise(lines: list[str]) -> str:
    """Continuation lines joined with one space, comments dropped, each line stripped."""
    if HEREDOC.search(lines[0]):
        return "\n".join(line.rstrip() for line in lines)
    text = re.sub(r"\s*\\\n\s*", " ", "\n".join(lines))
    return "\n".join(line.strip() for line in strip_comments(text).splitlines() if line.strip())


def _shell_block(path: str, first: int, lines: list[str]) -> list[DocCommand]:
    commands = []
    pending: list[str] = []
    start = first
    for number, line in enumerate(lines, first):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            start = number
        pending.append(line.strip() if not pending else line)
        if _is_complete(pending):
            commands.append(DocCommand(path, start, _normalise(pending)))
            pending = []
    if pending:
        raise AssertionError(f"{path}:{start}: a command that never ends: {pending!r}")
    return commands


def _prompt_block(path: str, first: int, lines: list[str]) -> list[DocCommand]:
    """``$ `` lines are commands; the lines up to the next prompt are their output."""
    commands = []
    for offset, line in enumerate(lines):
        if not line.startswith(PROMPT):
            continue
        shown = []
        for following in lines[offset + 1 :]:
            if following.startswith(PROMPT):
                break
            shown.append(following)
        text = strip_comments(line[len(PROMPT) :]).strip()
        commands.append(DocCommand(path, first + offset, text, "\n".join(shown)))
    return commands


def commands_in(path: Path, name: str = "") -> list[DocCommand]:
    """The commands of one Markdown file; ``name`` (default: its path in the repository)
    is the ``path`` they report."""
    relative = name or str(path.relative_to(ROOT))
    commands: list[DocCommand] = []
    fence: str | None = None
    indent = 0
    block: list[str] = []
    block_start = 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            if fence is None:
                fence, indent, block, block_start = (
                    stripped[3:].strip(),
                    len(raw) - len(raw.lstrip()),
                    [],
                    number + 1,
                )
                continue
            if fence in SHELL_FENCES:
                commands += _shell_block(relative, block_start, block)
            else:
                commands += _prompt_block(relative, block_start, block)
            fence = None
            continue
        if fence is not None:
            # A block inside a list item is indented; its commands are not.
            block.append(raw[indent:] if raw[:indent].isspace() else raw.lstrip())
    return commands


def doc_commands() -> list[DocCommand]:
    return [command for path in doc_files() for command in commands_in(path)]


# --------------------------------------------------------------------------
# How each command is treated
# --------------------------------------------------------------------------


@attrs.frozen
class Run:
    """How the test runs a documented command (``bash -c``, the venv's ``mokka`` on PATH)."""

    #: ``daemon``: the directory holding the shared daemon's ``./mokka-node``;
    #: ``scratch``: an empty directory of its own; ``repo``: the repository root.
    cwd: str = "daemon"
    #: literal (old, new) replacements, each for a placeholder or a host path
    rewrite: tuple[tuple[str, str], ...] = ()
    #: why the rewrite, or why the command runs the way it does
    why: str = ""
    exit: int = 0
    #: a stable part of the output the doc shows or implies
    shows: str = ""
    #: run first, in the same directory (what the documented command acts on)
    before: str = ""
    #: a ``mokka ctl`` change the next command must not see: ``mokka ctl reset`` afterwards
    resets: bool = False
    #: the command is the shared daemon itself (started by the test's fixture)
    is_shared_daemon: bool = False


@attrs.frozen
class NotRun:
    reason: str


CLUSTER = NotRun("needs a Kubernetes cluster (an API server and nodes)")
ENGINE = NotRun(
    "builds or loads the image: a container engine and the base image's registry "
    "(the install steps are tested in tests/test_image_scripts.py, scripts/kind-load "
    "against stubs in tests/test_quickstart.py)"
)
HOST_EDIT = NotRun(
    "manual cleanup of a real node: edits /etc and /var of the machine itself and restarts "
    "containerd (what it removes is what `mokka cleanup` removes: tests/test_teardown.py)"
)
BENCHMARK = NotRun(
    "a benchmark run: minutes of a quiet machine (docs/benchmarks.md reports them; "
    "tests/test_bench_entry.py runs the entry point)"
)
IMEX_ARCHIVE = NotRun(
    "needs NVIDIA's IMEX archive, which no one may redistribute (tests/test_imex_provision.py "
    "runs the same flags against a synthetic archive)"
)
FULL_IB = NotRun(
    "needs `--ib-mode full` (the verbs shim), which the shared bare daemon does not run: "
    "tests/test_ib_tools.py runs the real tool in that mode"
)

#: How the local commands run.  Keys are ``DocCommand.text``.
RUN: dict[str, Run] = {
    # The shared daemon itself: the README's bare `mokka`, in a directory of its own.
    "mokka": Run(
        is_shared_daemon=True,
        why="the shared daemon every `daemon` command runs against is this command, with "
        "--health-addr 127.0.0.1:0 (no fixed port), --nvidia-smi-binary with the real "
        "nvidia-smi (as ./scripts/daemon stages it) and --node-name docs",
    ),
    "mokka --version": Run(cwd="scratch", shows="mokka 0.1.0"),
    # Long-running daemons on another root: one pass with the same flags, then cleanup.
    "mokka daemon --root /tmp/node --profile gb200 --topology topo.yaml --node-name worker-1": Run(
        cwd="scratch",
        rewrite=(("/tmp/node", "{node}"), ("topo.yaml", "{topology}"), ("--root", "--once --root")),
        why="a second long-running daemon: run as one pass (--once) with the same flags; "
        "/tmp/node is a scratch root, topo.yaml a one-domain topology naming worker-1",
        shows="node ready",
    ),
    "mokka --root /tmp/node --health-addr 127.0.0.1:0 --profile gb200 --node-name n1": Run(
        cwd="scratch",
        rewrite=(("/tmp/node", "{node}"), ("--root", "--once --root")),
        why="a second long-running daemon: run as one pass (--once) with the same flags; "
        "/tmp/node is a scratch root",
        shows="node ready",
    ),
    "mokka daemon --once --root /tmp/node": Run(
        cwd="scratch",
        rewrite=(("/tmp/node", "{node}"),),
        why="/tmp/node: a scratch root",
        shows="node ready",
    ),
    "mokka --once --root /tmp/node": Run(
        cwd="scratch",
        rewrite=(("/tmp/node", "{node}"),),
        why="/tmp/node: a scratch root",
        shows="node ready",
    ),
    "mokka cleanup --root /tmp/node": Run(
        cwd="scratch",
        rewrite=(("/tmp/node", "{node}"),),
        why="/tmp/node: a scratch root a --once pass staged first",
        before="mokka daemon --once --root {node}",
    ),
    "mokka cleanup -v --root /tmp/node": Run(
        cwd="scratch",
        rewrite=(("/tmp/node", "{node}"),),
        why="/tmp/node: a scratch root a --once pass staged first",
        before="mokka daemon --once --root {node}",
        shows="var/lib/nvml-mock/driver/usr/lib64",
    ),
    # Against the shared daemon's ./mokka-node, as written.
    "mokka ctl fail --gpu 0 --mode fallen_off_bus --xid 79": Run(
        shows="failure mode fallen_off_bus, Xid 79; applied by the daemon holding",
        resets=True,
    ),
    "mokka ctl ib-counter --hca mlx5_0 symbol_error=5": Run(
        shows="mlx5_0 port 1 symbol_error = 5",
        resets=True,
    ),
    "mokka ctl status": Run(
        before="mokka ctl ib-counter --hca mlx5_0 symbol_error=5",
        why="after the README's ib-counter call, which it says status shows",
        shows="symbol_error",
        resets=True,
    ),
    "mokka ctl temp --gpu 0 --celsius 70": Run(
        why="against the running daemon (docs/ctl.md's first case; the no-daemon case is "
        "tests/test_ctl_messages.py's)",
        shows="temperature 70 C; applied by the daemon holding",
        resets=True,
    ),
    "mokka fabricmanager-ctl -q": Run(shows="READY"),
    "LD_LIBRARY_PATH=./mokka-node/var/lib/nvml-mock/driver/usr/lib64 "
    "./mokka-node/var/lib/nvml-mock/driver/usr/bin/nvidia-smi -L": Run(
        shows="GPU 7: NVIDIA H100 80GB HBM3 (UUID: GPU-",
    ),
    "LD_PRELOAD=./mokka-node/var/lib/nvml-mock/driver/usr/local/lib/libmockfs.so "
    "MOKKA_MOCKFS_ROOT=$PWD/mokka-node/var/lib/nvml-mock lspci -nn": Run(
        shows="3D controller [0302]: NVIDIA Corporation",
    ),
    "./mokka-node/var/lib/nvml-mock/driver/usr/bin/ibstat": Run(shows="CA 'mlx5_7'"),
    "LD_LIBRARY_PATH=<root>/run/nvidia/driver/usr/lib64 "
    "<root>/run/nvidia/driver/usr/bin/nvidia-smi -L": Run(
        rewrite=(("<root>", "./mokka-node"),),
        why="<root>: the daemon's node root",
        shows="GPU 0: NVIDIA H100 80GB HBM3",
    ),
    # The node's own paths (/var/lib/nvml-mock, /run/nvidia/driver) under the shared root.
    "/var/lib/nvml-mock/driver/usr/bin/ibstat": Run(
        rewrite=(("/var/lib/nvml-mock", "./mokka-node/var/lib/nvml-mock"),),
        why="a node path: under the daemon's node root",
        shows="CA 'mlx5_0'",
    ),
    "lspci -A linux-sysfs -O sysfs.path=/var/lib/nvml-mock/sys/bus/pci -nn -vv -t": Run(
        rewrite=(("/var/lib/nvml-mock", "./mokka-node/var/lib/nvml-mock"),),
        why="a node path: under the daemon's node root",
        shows="NVIDIA Corporation",
    ),
    "LD_PRELOAD=/var/lib/nvml-mock/driver/usr/local/lib/libmockfs.so "
    "MOKKA_MOCKFS_ROOT=/var/lib/nvml-mock lspci -vv": Run(
        rewrite=(("LD_PRELOAD=/var/lib/nvml-mock", "LD_PRELOAD=./mokka-node/var/lib/nvml-mock"),
                 ("MOKKA_MOCKFS_ROOT=/var/lib/nvml-mock",
                  "MOKKA_MOCKFS_ROOT=$PWD/mokka-node/var/lib/nvml-mock")),
        why="node paths: under the daemon's node root (the shim's root absolute)",
        shows="3D controller: NVIDIA Corporation",
    ),
    "/var/lib/nvml-mock/driver/usr/bin/ibstat -l": Run(
        rewrite=(("/var/lib/nvml-mock", "./mokka-node/var/lib/nvml-mock"),),
        why="a node path: under the daemon's node root",
        shows="mlx5_7",
    ),
    "/var/lib/nvml-mock/driver/usr/bin/ibstatus mlx5_0": Run(
        rewrite=(("/var/lib/nvml-mock", "./mokka-node/var/lib/nvml-mock"),),
        why="a node path: under the daemon's node root",
        shows="base lid:",
    ),
    "/run/nvidia/driver/usr/bin/ibstat": Run(
        rewrite=(("/run/nvidia/driver", "./mokka-node/run/nvidia/driver"),),
        why="a node path: under the daemon's node root",
        shows="CA 'mlx5_0'",
    ),
    "LD_PRELOAD=/var/lib/nvml-mock/driver/usr/local/lib/libmockfs.so "
    "MOKKA_MOCKFS_ROOT=/var/lib/nvml-mock/ib "
    "/var/lib/nvml-mock/driver/usr/local/lib/mokka-ib/bin/ibstat": Run(
        rewrite=(
            ("LD_PRELOAD=/var", "LD_PRELOAD=./mokka-node/var"),
            ("MOKKA_MOCKFS_ROOT=/var", "MOKKA_MOCKFS_ROOT=$PWD/mokka-node/var"),
            ("/var/lib/nvml-mock/driver/usr/local/lib/mokka-ib/bin/ibstat", "ibstat"),
        ),
        why="node paths: under the daemon's node root (the mockfs root absolute, as it must "
        "be); the staged copy exists only with the image's tools, so the machine's own ibstat, "
        "which the doc allows",
        shows="CA 'mlx5_0'",
    ),
    "LD_LIBRARY_PATH=/run/nvidia/driver/usr/lib64 /run/nvidia/driver/usr/bin/nvidia-smi -L": Run(
        rewrite=(("/run/nvidia/driver", "./mokka-node/run/nvidia/driver"),),
        why="a node path: under the daemon's node root",
        shows="GPU 0: NVIDIA H100 80GB HBM3",
    ),
    "curl -s localhost:9091/readyz | python3 -m json.tool": Run(
        rewrite=(("9091", "{port}"),),
        why="the port kubectl port-forward gives: the shared daemon's own",
        shows='"status": "ready"',
    ),
    "curl -s localhost:9091/metrics "
    "| grep -E '^mokka_(simulator_ready|stage_healthy|source_error)'": Run(
        rewrite=(("9091", "{port}"),),
        why="the port kubectl port-forward gives: the shared daemon's own",
        shows='mokka_simulator_ready{simulator="gpudriver"} 1',
    ),
    # Repository tools.
    ".venv/bin/python -m bench --list": Run(cwd="repo", shows="cold_warm"),
    ".venv/bin/python bench/cold_warm.py --help": Run(cwd="repo", shows="--rounds"),
    # The chart, rendered: `helm install|upgrade` of ./helm/mokka as `helm template`.
    "helm install mokka ./helm/mokka -n mokka-system --set nodeAgent.profile=h100": Run(
        cwd="repo",
        rewrite=(("helm install", "{helm} template"),),
        why="no cluster: rendered with helm template and the same flags",
        shows="kind: DaemonSet",
    ),
    "helm install mokka ./helm/mokka --namespace mokka-system --set nodeAgent.profile=h100": Run(
        cwd="repo",
        rewrite=(("helm install", "{helm} template"),),
        why="no cluster: rendered with helm template and the same flags",
        shows="kind: DaemonSet",
    ),
    "helm install mokka ./helm/mokka --namespace mokka-system --create-namespace "
    "--set 'nodeSelector.mokka\\.io/gpu=null' --set-string nodeSelector.pool=gpu-sim": Run(
        cwd="repo",
        rewrite=(("helm install", "{helm} template"),),
        why="no cluster: rendered with helm template and the same flags",
        shows="pool: gpu-sim",
    ),
    "helm install mokka ./helm/mokka --namespace mokka-system --create-namespace "
    "--set nodeSelector=null": Run(
        cwd="repo",
        rewrite=(("helm install", "{helm} template"),),
        why="no cluster: rendered with helm template and the same flags",
        shows="kind: DaemonSet",
    ),
    "helm upgrade --install mokka ./helm/mokka -n mokka-system "
    "--set-file nodeAgent.customProfile=./my-profile.yaml": Run(
        cwd="repo",
        rewrite=(("helm upgrade --install", "{helm} template"), ("./my-profile.yaml", "{profile}")),
        why="no cluster: rendered with helm template; ./my-profile.yaml: the built-in h100 profile",
        shows="kind: DaemonSet",
    ),
    "helm upgrade mokka ./helm/mokka -n mokka-system --reuse-values "
    "--set nodeAgent.profile=b200": Run(
        cwd="repo",
        rewrite=(("helm upgrade", "{helm} template"), (" --reuse-values", "")),
        why="no release to reuse: rendered with helm template and the other flags",
        shows="b200",
    ),
    "helm upgrade mokka ./helm/mokka -n mokka-system --reuse-values "
    "--set nodeAgent.logLevel=debug --set nodeAgent.logFormat=json": Run(
        cwd="repo",
        rewrite=(("helm upgrade", "{helm} template"), (" --reuse-values", "")),
        why="no release to reuse: rendered with helm template and the other flags",
        shows="--log-format=json",
    ),
}

#: Commands that are not run, each with why.  Keys are ``DocCommand.text``.
NOT_RUN: dict[str, NotRun] = {
    "./scripts/daemon": NotRun(
        "the long-running daemon on ./mokka-node and port 9091 of the checkout: the shared "
        "daemon is the same `mokka daemon` with the real nvidia-smi on a temporary directory"
    ),
    "./scripts/test": NotRun("the test suite itself"),
    "./scripts/kind-load --cluster mokka": ENGINE,
    "podman build -f Containerfile -t ghcr.io/mokka/mokka:0.1.0 .": ENGINE,
    "podman save --format docker-archive -o mokka-image.tar ghcr.io/mokka/mokka:0.1.0": ENGINE,
    "podman build -f Containerfile --build-arg NVIDIA_CONTAINER_TOOLKIT_VERSION=1.18.0-1 "
    "--build-arg NVIDIA_SMI_VERSION=535.309.01-0+deb12u1 --build-arg RDMA_CORE_VERSION=44.0-2 "
    "-t mokka:dev .": ENGINE,
    "printf 'FROM ghcr.io/mokka/mokka:0.1.0\\n"
    "COPY nvidia-imex-linux-x86_64-580.105.08-archive.tar.xz /imex/\\n' "
    "| podman build -t localhost/mokka-imex-archive:580.105.08 -f - .": IMEX_ARCHIVE,
    "sha256sum nvidia-imex-linux-x86_64-580.105.08-archive.tar.xz": IMEX_ARCHIVE,
    "mokka daemon --profile gb200 --imex-archive-dir ./imex --imex-archive-sha256 "
    "\"$(sha256sum ./imex/nvidia-imex-*-archive.tar.xz | cut -d' ' -f1)\"": IMEX_ARCHIVE,
    "podman run --rm --device nvidia.com/gpu=1:2 IMAGE nvidia-smi -L": NotRun(
        "an image with nvidia-smi's libraries and a node with a MIG layout: "
        "tests/test_mig_containers.py runs it with the image it builds"
    ),
    "helm test mokka -n mokka-system": CLUSTER,
    "helm uninstall mokka -n mokka-system": CLUSTER,
    "helm uninstall nvdp -n nvidia-device-plugin": CLUSTER,
    "helm install nvdp nvdp/nvidia-device-plugin --version 0.17.4 -n nvidia-device-plugin "
    "--create-namespace --set nvidiaDriverRoot=/var/lib/nvml-mock/driver": CLUSTER,
    "helm install nvdp nvdp/nvidia-device-plugin -n nvidia-device-plugin --create-namespace "
    "--set nvidiaDriverRoot=/var/lib/nvml-mock/driver --set gfd.enabled=true": CLUSTER,
    "helm install gpu-operator nvidia/gpu-operator -n gpu-operator --create-namespace "
    "--set driver.enabled=false --set toolkit.enabled=false": CLUSTER,
    "helm install nvidia-dra-driver-gpu nvidia/nvidia-dra-driver-gpu -n nvidia-dra-driver-gpu "
    "--create-namespace --set nvidiaDriverRoot=/var/lib/nvml-mock/driver": CLUSTER,
    "/var/lib/nvml-mock/driver/usr/bin/ibv_devinfo -v": FULL_IB,
    "/var/lib/nvml-mock/driver/usr/bin/ibv_devices": FULL_IB,
    'LD_PRELOAD="/var/lib/nvml-mock/driver/usr/local/lib/libibshim.so '
    '/var/lib/nvml-mock/driver/usr/local/lib/libmockfs.so" '
    "MOKKA_MOCKFS_ROOT=/var/lib/nvml-mock/ib ibv_devinfo": FULL_IB,
    "ls /var/run/cdi/ && cat /etc/containerd/conf.d/50-mokka.toml": NotRun(
        "the drop-in exists only on a node with containerd (tests/test_cri_containerd.py "
        "checks it against containerd's own config dump)"
    ),
    ".venv/bin/python -m tests.fidelity_support": NotRun(
        "the comparison tests/test_fidelity.py makes, every capture (tens of seconds)"
    ),
    ".venv/bin/python -m tests.fidelity_support gb200": NotRun(
        "the comparison tests/test_fidelity.py makes for the gb200 capture"
    ),
    ".venv/bin/python -m tests.nvml_fuzz_support --configs 100000 --seed 7 --jobs 2": NotRun(
        "a long fuzz campaign; tests/test_nvml_fuzz.py runs a short one"
    ),
    ".venv/bin/python -m tests.mockfs_fuzz_support --paths 20000 --seed 5": NotRun(
        "a long fuzz campaign; tests/test_mockfs_fuzz.py runs a short one"
    ),
    ".venv/bin/python -m tests.ibshim_fuzz_support --trees 3000 --seed 11": NotRun(
        "a long fuzz campaign; tests/test_ibshim_fuzz.py runs a short one"
    ),
    'perf stat -e task-clock -p "$PID" -- sleep 60': BENCHMARK,
    "ROOT=$PWD/mokka-node": NotRun(
        "sets a variable for the next commands of docs/consumers.md's device plugin run"
    ),
    "DRIVER=$ROOT/run/nvidia/driver": NotRun(
        "sets a variable for the next commands of docs/consumers.md's device plugin run"
    ),
}

#: Whole families, matched against the full command text.
NOT_RUN_FAMILIES: tuple[tuple[re.Pattern[str], NotRun], ...] = (
    (re.compile(r"(POD=\$\()?kubectl\s.*", re.S), CLUSTER),
    (re.compile(r"(kind|k3s|minikube)\s.*"), CLUSTER),
    (re.compile(r"(TMPDIR=\S+ )?\.venv/bin/python (-m bench|bench/\w+\.py)\b.*", re.S), BENCHMARK),
    (
        re.compile(r"(rm|rmdir|umount|sed -i|systemctl|for f in)\s.*", re.S),
        HOST_EDIT,
    ),
    (
        re.compile(r"(nvidia-device-plugin|nvidia-ctk|sudo LD_LIBRARY_PATH=)\S*\s.*", re.S),
        NotRun(
            "a consumer run on a node as root (tests/test_device_plugin_real.py and "
            "tests/test_cri_cdi.py run them against a staged root)"
        ),
    ),
    (
        re.compile(r"(cat > \w+\.json <<|pod=\$\(crictl|ctr=\$\(crictl|crictl)\s*.*", re.S),
        NotRun(
            "a CRI pod on a containerd the machine runs as root (tests/test_cri_containers_real.py "
            "runs the same pod)"
        ),
    ),
)


def classify(command: DocCommand) -> Run | NotRun | None:
    if command.text in RUN:
        return RUN[command.text]
    if command.text in NOT_RUN:
        return NOT_RUN[command.text]
    for pattern, treatment in NOT_RUN_FAMILIES:
        if pattern.fullmatch(command.text):
            return treatment
    return None


PLACEHOLDER = re.compile(r"\{(port|node|topology|profile|helm)\}")


def fill(text: str, values: dict[str, str]) -> str:
    """The known placeholders filled in; a command's own braces (a jsonpath) stay."""
    return PLACEHOLDER.sub(lambda match: values[match.group(1)], text)


def rewritten(text: str, run: Run, values: dict[str, str]) -> str:
    """``text`` with ``run``'s rewrites applied, then the placeholders filled in."""
    for old, new in run.rewrite:
        assert old in text, f"rewrite {old!r} does not occur in {text!r}"
        text = text.replace(old, new)
    return fill(text, values)
