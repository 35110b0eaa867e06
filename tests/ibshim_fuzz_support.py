"""Damaged InfiniBand trees for the verbs shim (``tests/test_ibshim_fuzz.py``).

``damage`` copies a staged IB tree (its ``sys`` part: the shim reads nothing
else) and breaks it in seeded random ways: files emptied, over-long,
non-numeric, non-UTF-8, missing, replaced by a directory, a dangling or
looping link or a FIFO; odd directory entries (port 0, port 300, a thousand
P_Keys, ``uverbs-1``, ``uverbs99999999999``); an ``ibdev`` naming ``..``
or a path; the class directories gone.  ``run_tool`` runs the real
``ibv_devinfo``/``ibv_devices`` on such a tree through the shims built with
AddressSanitizer and UBSan and reports how it ended.

A longer campaign by hand (it stages its own tree)::

    .venv/bin/python -m tests.ibshim_fuzz_support --trees 2000 --seed 3
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

if __package__ in (None, ""):  # run as a script: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.mockfs_fuzz_support import libasan
from tests.nvml_fuzz_support import SANITIZE, SANITIZER_ENV
from tests.nvml_support import compiler, load_target

CLASSES = ("sys/class/infiniband", "sys/class/infiniband_verbs", "sys/class/infiniband_mad")
COMMANDS = (("ibv_devinfo",), ("ibv_devinfo", "-v"), ("ibv_devices",),
            ("ibv_devinfo", "-d", "mlx5_0", "-i", "1"))
#: A tool that has not finished after this long is hung (a FIFO, a loop).
TIMEOUT = 20
#: Attributes libibverbs reads itself (through libmockfs.so), not the shim:
#: a FIFO there blocks libibverbs, as it would on a host's sysfs.
LIBIBVERBS_READS = ("board_id",)

JUNK = (b"", b"\n", b" ", b"abc", b"0x", b"-1", b"-", b"99999999999999999999999",
        b"0x10000", b"0xffffffffffffffffff", b"\xff\xfe\xfd", b": ACTIVE", b"4", b"4:",
        b"1: CA\0junk", b"400 Gb/sec (", b"400 Gb/sec (4294967296X NDR)", b"(99X XDRXDRXDR)",
        b"fe80::1", b"fe80:0000:0000:0000:0000:0000:0000",
        b"zzzz:0000:0000:0000:0000:0000:0000:0000",
        b"a088:c203:0012:34567", b"a088:c203:0012", b"Ethernet", b"RoCE v2", b"010", b"08",
        b"\t5", b"1e9", b"65536", b"0xffff", b"4294967297")


def _files(tree: Path) -> list[Path]:
    found = []
    for cls in CLASSES:
        base = tree / cls
        if base.is_dir():
            for dirpath, _, filenames in os.walk(base):
                found.extend(Path(dirpath) / f for f in filenames)
    return sorted(found)


def _dirs(tree: Path, name: str) -> list[Path]:
    return sorted(p for p in (tree / "sys/class/infiniband").glob(f"*/{name}") if p.is_dir())


def _replace(path: Path) -> None:
    """Remove whatever is at ``path`` (file, link, FIFO or tree)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


Damage = Callable[[random.Random, Path], str]


def _content(rng: random.Random, tree: Path) -> str:
    path = rng.choice(_files(tree))
    data = rng.choice(JUNK)
    _replace(path)
    path.write_bytes(data)
    return f"{path.relative_to(tree)} = {data[:40]!r}"


def _overlong(rng: random.Random, tree: Path) -> str:
    path = rng.choice(_files(tree))
    size = rng.choice((63, 64, 65, 127, 128, 129, 4095, 4096, 4097, 200_000))
    data = rng.choice((b"9", b"a", b"f", b"\xff", b"4: ACTIVE ")) * size
    _replace(path)
    path.write_bytes(data[:size])
    return f"{path.relative_to(tree)} = {size} bytes"


def _special(rng: random.Random, tree: Path) -> str:
    path = rng.choice(_files(tree))
    kinds = ["missing", "directory", "dangling", "loop", "zero", "absolute"]
    if path.name not in LIBIBVERBS_READS:
        kinds.append("fifo")
    kind = rng.choice(kinds)
    _replace(path)
    if kind == "directory":
        path.mkdir()
        (path / "x").write_text("1\n")
    elif kind == "dangling":
        path.symlink_to("no-such-file")
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "absolute":
        path.symlink_to("/etc/passwd")
    return f"{path.relative_to(tree)}: {kind}"


def _entries(rng: random.Random, tree: Path) -> str:
    which = rng.choice(("ports", "gids", "pkeys", "uverbs", "counters"))
    if which == "ports":
        dirs = _dirs(tree, "ports")
        if not dirs:
            return "no ports"
        ports = rng.choice(dirs)
        name = rng.choice(("0", "2", "255", "256", "300", "abc", "-1", "01", "1x"))
        if not (ports / name).is_dir():
            _replace(ports / name)
        source = next(iter(sorted(ports.iterdir())), None)
        if source is not None and source.is_dir() and rng.random() < 0.5:
            shutil.copytree(source, ports / name, symlinks=True, dirs_exist_ok=True)
        else:
            (ports / name).mkdir(exist_ok=True)
        return f"{ports.relative_to(tree)}/{name}"
    if which in ("gids", "pkeys"):
        tables = sorted((tree / "sys/class/infiniband").glob(f"*/ports/*/{which}"))
        if not tables:
            return f"no {which}"
        table = rng.choice(tables)
        count = rng.choice((1, 2, 200, 1000))
        start = rng.choice((0, 1, 65535, 4294967295))
        for i in range(count):
            _replace(table / str(start + i))
            (table / str(start + i)).write_bytes(rng.choice(JUNK))
        return f"{table.relative_to(tree)}: {count} entries from {start}"
    if which == "uverbs":
        verbs = tree / "sys/class/infiniband_verbs"
        if not verbs.is_dir():
            return "no verbs class"
        name = rng.choice(("uverbs", "uverbs-1", "uverbs99999999999", "uverbs 1", "uverbs+2",
                           "uverbs2147483648", "uverbs9223372036854775807", "uverbs007"))
        if not (verbs / name).is_dir():
            _replace(verbs / name)
            (verbs / name).mkdir()
        _replace(verbs / name / "ibdev")
        ibdev = rng.choice((b"mlx5_0", b"..", b".", b"", b"../../../etc", b"mlx5_0/ports",
                            b"x" * 80, b"mlx5_\xff", b"mlx5_0\nmlx5_1"))
        (verbs / name / "ibdev").write_bytes(ibdev)
        return f"{name} -> {ibdev[:20]!r}"
    counters = sorted((tree / "sys/class/infiniband").glob("*/ports/*/counters"))
    if counters:
        shutil.rmtree(rng.choice(counters))
    return "counters removed"


def _structure(rng: random.Random, tree: Path) -> str:
    what = rng.choice(("abi", "class", "verbs", "device", "node"))
    if what == "abi":
        _replace(tree / "sys/class/infiniband_verbs/abi_version")
    elif what == "class":
        _replace(tree / rng.choice(CLASSES))
    elif what == "verbs":
        for entry in sorted((tree / "sys/class/infiniband_verbs").glob("uverbs*")):
            if rng.random() < 0.5:
                _replace(entry)
    elif what == "device":
        hcas = sorted((tree / "sys/class/infiniband").glob("mlx5_*"))
        if hcas:
            _replace(rng.choice(hcas) / "device")
    else:
        hcas = sorted((tree / "sys/class/infiniband").glob("mlx5_*"))
        if hcas:
            _replace(rng.choice(hcas))
    return f"structure: {what}"


DAMAGES: dict[str, Damage] = {"content": _content, "overlong": _overlong, "special": _special,
                              "entries": _entries, "structure": _structure}


def damage(rng: random.Random, source: Path, dest: Path) -> list[str]:
    """Copy ``source``'s ``sys`` tree to ``dest`` and break it; what was done."""
    shutil.copytree(source / "sys", dest / "sys", symlinks=True)
    done = []
    for _ in range(rng.choice((1, 1, 2, 3, 4))):
        name = rng.choice(sorted(DAMAGES))
        if not _files(dest):
            break
        done.append(f"{name}: {DAMAGES[name](rng, dest)}")
    return done


# --------------------------------------------------------------------------
# Running the tools
# --------------------------------------------------------------------------


def build_sanitized(out: Path) -> tuple[Path, Path]:
    """``libibshim.so`` and ``libmockfs.so`` with ASan and UBSan."""
    (ibshim,) = load_target("ibshim").build(out, compiler(), extra_cflags=SANITIZE)
    (mockfs,) = load_target("mockfs").build(out, compiler(), extra_cflags=SANITIZE)
    return ibshim, mockfs


@attrs.frozen(kw_only=True)
class Run:
    """How one tool run ended."""

    argv: tuple[str, ...]
    returncode: int | None  # None: killed after its time limit
    stdout: str
    stderr: str

    def problem(self) -> str | None:
        if self.returncode is None:
            return f"{' '.join(self.argv)}: did not finish (hung)"
        if self.returncode < 0:
            return f"{' '.join(self.argv)}: killed by signal {-self.returncode}"
        if "Sanitizer" in self.stderr or "runtime error:" in self.stderr:
            return f"{' '.join(self.argv)}: sanitizer report:\n{self.stderr[-3000:]}"
        # Any exit status is an answer: the tools report a query the
        # damaged tree cannot satisfy ("Failed to query port 1 props") so.
        return None


def run_tool(argv: Sequence[str], shims: tuple[Path, Path], root: Path,
             timeout: float = TIMEOUT) -> Run:
    """``argv`` with the sanitized shims preloaded and ``root`` as the mock root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "MOKKA_"))}
    env.update(SANITIZER_ENV)
    # ibv_devinfo's own allocations are not ours to judge; the shims'
    # memory errors are what ASan is here for.
    env["ASAN_OPTIONS"] += ":detect_leaks=0"
    env["LD_PRELOAD"] = f"{libasan()} {shims[0]} {shims[1]}"
    env["MOKKA_MOCKFS_ROOT"] = str(root)
    try:
        result = subprocess.run(list(argv), env=env, capture_output=True, text=True,
                                errors="replace", timeout=timeout, check=False)
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode(errors="replace") if expired.stdout else ""
        return Run(argv=tuple(argv), returncode=None, stdout=out, stderr="")
    return Run(argv=tuple(argv), returncode=result.returncode, stdout=result.stdout,
               stderr=result.stderr)


def campaign(tools: dict[str, str], shims: tuple[Path, Path], source: Path, work: Path,
             seed: int, trees: int) -> tuple[int, list[str]]:
    """Damage ``trees`` copies of ``source`` and run every command on each;
    (runs, problems).  A tree with a problem is kept in ``work``."""
    rng = random.Random(seed)
    problems: list[str] = []
    runs = 0
    for n in range(trees):
        tree = work / f"tree-{n:05d}"
        done = damage(rng, source, tree)
        found = []
        for command in COMMANDS:
            result = run_tool([tools[command[0]], *command[1:]], shims, tree)
            runs += 1
            problem = result.problem()
            if problem:
                found.append(f"tree {n} ({'; '.join(done)}): {problem}")
        problems.extend(found)
        if not found:
            shutil.rmtree(tree)
    return runs, problems


def main(argv: Sequence[str] | None = None) -> int:
    import trio

    from mokka import layout
    from mokka.noderoot.host import Host
    from tests.ib_support import stage, state_of

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="work directory (default: a temp dir)")
    args = parser.parse_args(argv)
    tools = {name: shutil.which(name) for name in ("ibv_devinfo", "ibv_devices")}
    if not all(tools.values()):
        raise SystemExit("ibv_devinfo and ibv_devices are needed (./scripts/install-system-deps)")
    with tempfile.TemporaryDirectory(prefix="mokka-ibshim-fuzz-") as scratch:
        work = args.keep or Path(scratch)
        node = work / "node"
        node.mkdir(parents=True, exist_ok=True)

        async def stage_tree():
            sim = await stage(node, state_of("gb200"), mode="sysfs")
            return sim

        sim = trio.run(stage_tree)
        shims = build_sanitized(work / "build")
        source = node / layout.IB_ROOT.lstrip("/")
        runs, problems = campaign(tools, shims, source, work / "trees", args.seed, args.trees)
        trio.run(sim.discard, Host(node))
        for problem in problems:
            print(problem)
        print(f"{args.trees} damaged trees (seed {args.seed}): {runs} runs, "
              f"{len(problems)} problems")
        return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
