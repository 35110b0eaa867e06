"""Fuzzing libmockfs.so's path routing: a model of where a path must go, a
generator of random and adversarial paths, and the probe runner.

The model restates the routing rules of ``docs/pcibus.md`` in Python:

* an absolute path whose leading components match a prefix (per component,
  ``*``/``?`` globs, repeated slashes and ``.`` ignored) before any ``..``
  is redirected under the view's root, keeping its spelling; when it holds a
  ``..`` after the prefix, that part is resolved inside the mock tree (links
  followed), ``..`` at the root staying at the root as ``/..`` does on a
  host, so nothing below a prefix can climb out of the mock;
* an absolute path that matches only once normalised lexically (``..``
  before the prefix is complete, anywhere) is redirected in its normalised
  spelling;
* a relative path with a ``..`` is taken from the directory it starts in
  (the working directory): inside a mock root it stays inside that root as
  above, outside it is routed like the absolute path it names;
* anything longer than ``PATH_MAX`` once redirected fails with
  ``ENAMETOOLONG``; everything else passes unchanged.

``expected_target`` gives the path the shim must use (or the errno it must
fail with); the test runs the probe under the shim on the paths and without
it on those targets and compares every answer.
"""

from __future__ import annotations

import argparse
import errno
import fnmatch
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import attrs

if __package__ in (None, ""):  # run as a script: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.nvml_fuzz_support import SANITIZE, SANITIZER_ENV
from tests.nvml_support import compiler, load_target

PROBE_SOURCE = Path(__file__).resolve().parent / "mockfs_fuzz_probe.c"
PATH_MAX = 4096
MAX_LINKS = 40
NULL = b"\x01NULL"

DEFAULT_PREFIXES = (b"/sys/bus/pci", b"/sys/devices/pci*", b"/proc/bus/pci",
                    b"/sys/class/infiniband", b"/sys/class/infiniband_mad",
                    b"/sys/class/infiniband_verbs", b"/dev/infiniband")


@attrs.frozen(kw_only=True)
class View:
    """A mock root as the shim sees it (see ``struct mockfs_view``)."""

    root: bytes  # the directory given, without trailing '/'
    canon: bytes  # its realpath
    strip: int  # leading components the root replaces (0: it stands for "/")
    view_prefix: bytes  # what those components spell ("" or "/sys")
    prefixes: tuple[bytes, ...]
    hidden: tuple[bytes, ...] = ()  # prefixes that fail with ENOENT


def mokka_view(root: Path, prefixes: Sequence[bytes] = DEFAULT_PREFIXES) -> View:
    raw = os.fsencode(root).rstrip(b"/")
    return View(root=raw, canon=os.fsencode(os.path.realpath(root)), strip=0, view_prefix=b"",
                prefixes=tuple(prefixes))


def pci_view(sys_root: Path) -> View:
    raw = os.fsencode(sys_root).rstrip(b"/")
    return View(root=raw, canon=os.fsencode(os.path.realpath(sys_root)), strip=1,
                view_prefix=b"/sys", prefixes=(b"/sys/bus/pci", b"/sys/devices/pci*"),
                hidden=(b"/proc/bus/pci",))


def components(path: bytes) -> list[bytes]:
    return [c for c in path.split(b"/") if c not in (b"", b".")]


def _glob(pattern: bytes, text: bytes) -> bool:
    # Only '*' and '?' are special to the shim: '[' is literal.
    return fnmatch.fnmatchcase(text, pattern.replace(b"[", b"[[]"))


def raw_match(prefix: bytes, path: bytes) -> bool:
    """The prefix's components lead the path, with no '..' among them."""
    want, have = components(prefix), components(path)
    if len(have) < len(want):
        return False
    return all(h != b".." and _glob(w, h) for w, h in zip(want, have, strict=False))


def normalise(path: bytes) -> bytes:
    out: list[bytes] = []
    for c in components(path):
        if c == b"..":
            if out:
                out.pop()
        else:
            out.append(c)
    return b"/" + b"/".join(out)


def _after_components(path: bytes, n: int) -> bytes:
    """``path`` after its first ``n`` components ("." not counted), as written."""
    i = 0
    while n > 0:
        while path[i : i + 1] == b"/":
            i += 1
        end = path.find(b"/", i)
        end = len(path) if end < 0 else end
        if path[i:end] != b".":
            n -= 1
        i = end
    return path[i:]


def resolve_in_root(view: View, root: bytes, tail: bytes) -> bytes | int:
    """``root`` + ``tail`` with everything up to the last '..' resolved
    inside ``root`` (links followed, '..' stopping at the root); the rest is
    kept as written.  An errno when the walk fails, as the kernel's would."""
    parts = tail.split(b"/")
    last = max(i for i, c in enumerate(parts) if c == b"..")
    work = [c for c in parts[: last + 1] if c not in (b"", b".")]
    rest = b"/".join(parts[last + 1 :])
    rest = b"/" + rest if last + 1 < len(parts) else b""
    stack: list[bytes] = []
    links = 0
    while work:
        c = work.pop(0)
        if c == b"..":
            if stack:
                stack.pop()
            continue
        candidate = root + b"/" + b"/".join([*stack, c])
        if len(candidate) + 1 > PATH_MAX:
            return errno.ENAMETOOLONG
        try:
            st = os.lstat(candidate)
        except OSError as error:
            return error.errno
        if os.path.stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                return errno.ELOOP
            target = os.readlink(candidate)
            if target.startswith(b"/"):
                prefix = view.view_prefix
                if prefix and not (target == prefix or target.startswith(prefix + b"/")):
                    return errno.EXDEV
                target = target[len(prefix) :]
                stack = []
            work[:0] = [t for t in target.split(b"/") if t not in (b"", b".")]
            continue
        if not os.path.stat.S_ISDIR(st.st_mode):
            return errno.ENOTDIR
        stack.append(c)
    out = root + (b"/" + b"/".join(stack) if stack else b"") + rest
    if len(out) + 1 > PATH_MAX:
        return errno.ENAMETOOLONG
    return out or b"/"


@attrs.frozen(kw_only=True)
class Route:
    """Where the shim must send a path."""

    kind: str  # "pass", "redirect" or "fail"
    target: bytes = b""  # the path to use (pass: the path itself)
    errno: int = 0  # for "fail"
    view: View | None = None  # for "redirect": the view that took it


def _route_absolute(views: Sequence[View], path: bytes) -> Route | None:
    rules = [(p, v, False) for v in views for p in v.prefixes]
    rules += [(p, v, True) for v in views for p in v.hidden]
    source = path
    hit = next(((v, h) for p, v, h in rules if raw_match(p, path)), None)
    if hit is None and b".." in components(path):
        source = normalise(path)
        if len(source) + 1 > PATH_MAX:
            return Route(kind="fail", errno=errno.ENAMETOOLONG)
        hit = next(((v, h) for p, v, h in rules if raw_match(p, source)), None)
    if hit is None:
        return None
    view, hidden = hit
    if hidden:
        return Route(kind="fail", errno=errno.ENOENT)
    tail = _after_components(source, view.strip)
    if b".." in components(tail):
        out = resolve_in_root(view, view.root, tail)
        if isinstance(out, int):
            return Route(kind="fail", errno=out)
        return Route(kind="redirect", target=out, view=view)
    if len(view.root) + len(tail) + 1 > PATH_MAX:
        return Route(kind="fail", errno=errno.ENAMETOOLONG)
    return Route(kind="redirect", target=(view.root + tail) or b"/", view=view)


def expected_route(views: Sequence[View], path: bytes, cwd: bytes) -> Route:
    """Where ``path`` must go; ``cwd`` is the probe's physical working directory."""
    if path == NULL or not path:
        return Route(kind="pass", target=path)
    if path.startswith(b"/"):
        return _route_absolute(views, path) or Route(kind="pass", target=path)
    if b".." not in components(path):
        return Route(kind="pass", target=path)
    for view in views:
        for root in (view.canon, view.root):
            if cwd == root or cwd.startswith(root + b"/"):
                tail = cwd[len(root) :] + b"/" + path
                out = resolve_in_root(view, view.canon, tail)
                if isinstance(out, int):
                    return Route(kind="fail", errno=out)
                return Route(kind="redirect", target=out, view=view)
    routed = _route_absolute(views, cwd + b"/" + path)
    return routed or Route(kind="pass", target=path)


def unprefix(view: View, resolved: bytes) -> bytes:
    """realpath's answer mapped back to the path the process asked about."""
    for root in (view.canon, view.root):
        if root and (resolved == root or resolved.startswith(root + b"/")):
            return (view.view_prefix + resolved[len(root) :]) or b"/"
    return resolved


# --------------------------------------------------------------------------
# Paths (host directories among them are ones nothing writes to while the
# two probe runs compare, such as /usr and /etc: never /tmp)
# --------------------------------------------------------------------------

WORDS = (b"sys", b"bus", b"pci", b"pcix", b"pci0", b"devices", b"drivers", b"nvidia",
         b"class", b"infiniband", b"infiniband_verbs", b"dev", b"etc", b"passwd",
         b"0000:1a:00.0", b"0000:05:00.0", b"pci0000:00", b"pci0000:80", b"0000:00:05.0",
         b"vendor", b"config", b"driver", b"subsystem", b"resource", b"..", b"..", b".", b"",
         b"x", b"*", b"?", b"\xff\xfe", b"a" * 255, b"a" * 256, b"pci*", b"usr")

ADVERSARIAL = [
    b"/sys/bus/pci/../../etc/passwd",
    *(b"/sys/bus/pci/" + b"../" * k + b"etc/passwd" for k in range(1, 12)),
    *(b"/sys/bus/pci/devices/0000:1a:00.0/" + b"../" * k + b"sys/bus/pci/devices"
      for k in range(1, 14)),
    *(b"/sys/devices/pci0000:00/0000:00:05.0/0000:1a:00.0/subsystem/" + b"../" * k
      + b"etc/passwd" for k in range(1, 12)),
    b"//sys/bus/pci", b"//sys//bus//pci//devices", b"/./sys/./bus/./pci/.", b"/sys/bus/pcix",
    b"/sys/bus/pcix/devices", b"/sys/bus/pc", b"/sys/bus", b"/sys/bus/", b"/sys/bus/pci/",
    b"/x/../sys/bus/pci/devices", b"/usr/../sys/bus/pci/devices", b"/sys/x/../bus/pci",
    b"/sys/class/../bus/pci/devices", b"/sys/bus/../../sys/bus/pci", b"/../sys/bus/pci",
    b"/sys/bus/pci/devices/0000:1a:00.0/..", b"/sys/bus/pci/devices/0000:1a:00.0/../class",
    b"/sys/bus/pci/devices/0000:1a:00.0/vendor/..", b"/sys/bus/pci/devices/nope/..",
    b"/sys/bus/pci/devices/0000:1a:00.0/driver/../../../../../..",
    b"/proc/bus/pci", b"/proc/bus/pci/devices", b"/proc/bus/pcix",
    b"/sys/devices/pci0000:00", b"/sys/devices/pcifoo/../../../etc", b"/sys/devices/platform",
    b"/sys/class/infiniband", b"/sys/class/infiniband/../net", b"/dev/infiniband/../null",
    b"", b"/", b".", b"..", b"sys/bus/pci", b"./sys/bus/pci", b"../sys/bus/pci/devices",
    b"../../../../../../../../sys/bus/pci/devices", b"/etc/passwd", b"/dev/null", b"/usr",
    b"/sys/bus/pci\n", b"/sys/bus/pci/devices/", b"/sys/bus/pci/devices/.",
    b"/sys/bus/pci/devices/0000:1a:00.0/vendor/", NULL,
]


def boundary_paths(view: View) -> list[bytes]:
    """Prefixed paths whose redirected form is PATH_MAX - 1 and PATH_MAX
    bytes, and paths at PATH_MAX themselves, prefixed or not."""
    out = []
    for extra in (-2, -1, 0, 1):
        size = PATH_MAX - 1 - len(view.root) + extra  # the path's own length
        head = b"/sys/bus/pci/devices"
        body = b""
        while len(head) + len(body) < size:
            body += b"/" + b"d" * min(200, size - len(head) - len(body) - 1)
        out.append(head + body)
    for size in (PATH_MAX - 1, PATH_MAX, PATH_MAX + 1):
        for head in (b"/sys/bus/pci", b"/etc"):
            body = b""
            while len(head) + len(body) < size:
                body += b"/" + b"e" * min(200, size - len(head) - len(body) - 1)
            out.append(head + body)
    return out


def random_path(rng: random.Random) -> bytes:
    count = rng.randint(0, 12)
    parts = [rng.choice(WORDS) for _ in range(count)]
    if rng.random() < 0.6 and count >= 3:
        start = rng.choice((b"sys/bus/pci", b"sys/devices/pci0000:00", b"proc/bus/pci",
                            b"sys/class/infiniband", b"sys/bus/pci/devices/0000:1a:00.0"))
        parts = start.split(b"/") + parts
    sep = rng.choice((b"/", b"/", b"/", b"//", b"/./"))
    path = sep.join(parts)
    if rng.random() < 0.85:
        path = rng.choice((b"/", b"//", b"/./")) + path
    if rng.random() < 0.1:
        path += b"/"
    return path[:2000].replace(b"\0", b"")


def paths(seed: int, count: int, view: View) -> list[bytes]:
    rng = random.Random(seed)
    return [*ADVERSARIAL, *boundary_paths(view), *(random_path(rng) for _ in range(count))]


# --------------------------------------------------------------------------
# Running the probe
# --------------------------------------------------------------------------


def probe_cwd(work: Path) -> Path:
    """The probe's working directory: the same for every run of a test
    (relative paths are resolved from it), and nothing else writes there."""
    cwd = work / "cwd"
    (cwd / "sys/bus/pci").mkdir(parents=True, exist_ok=True)
    (work / "lists").mkdir(exist_ok=True)
    return cwd


def run_probe(probe: Path, items: Sequence[bytes], work: Path, env: dict[str, str],
              cwd: Path | bytes | None = None, tag: str = "run") -> dict[tuple[int, str], str]:
    """The probe's answers, by (index, call).  The probe starts in
    ``probe_cwd(work)`` and chdirs to ``cwd`` itself when given (through the
    shim when it is preloaded)."""
    cwd_start = probe_cwd(work)
    listing = work / "lists" / f"{tag}.paths"
    listing.write_bytes(b"".join(p + b"\0" for p in items))
    argv = [str(probe)]
    if cwd is not None:
        argv += ["-C", os.fsdecode(cwd)]
    result = subprocess.run([*argv, str(listing)], env=env, cwd=cwd_start,
                            capture_output=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-4000:]
    assert b"Sanitizer" not in result.stderr, result.stderr.decode(errors="replace")[-4000:]
    answers = {}
    for line in result.stdout.decode().splitlines():
        index, call, outcome = line.split(" ", 2)
        answers[(int(index), call)] = outcome
    return answers


def build_sanitized(out: Path) -> tuple[Path, Path]:
    """The shim and the probe, both built with ASan and UBSan."""
    out.mkdir(parents=True, exist_ok=True)
    (shim,) = load_target("mockfs").build(out, compiler(), extra_cflags=SANITIZE)
    probe = out / "mockfs_fuzz_probe"
    subprocess.run([compiler(), "-std=gnu11", "-O1", *SANITIZE, "-Wall", "-Wextra", "-Werror",
                    str(PROBE_SOURCE), "-o", str(probe)], check=True)
    return shim, probe


def libasan() -> str:
    path = subprocess.run([compiler(), "-print-file-name=libasan.so"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert os.path.isabs(path), f"gcc has no libasan.so ({path!r}): install libasan"
    return path


def environ(shim: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LD_", "MOKKA_MOCKFS", "MOCK_PCI_ROOT"))}
    env.update(SANITIZER_ENV)
    if shim is not None:
        # The sanitizer runtime must come first in the process's libraries.
        env["LD_PRELOAD"] = f"{libasan()} {shim}"
    env.update(extra)
    return env


def tree_inodes(root: Path) -> set[str]:
    """dev:ino of the root and of everything below it."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            st = os.lstat(os.path.join(dirpath, name))
            found.add(f"{st.st_dev}:{st.st_ino}")
    return found


INODE_CALLS = ("stat", "lstat", "fstatat", "statx", "open", "openat", "open-nofollow", "fopen")


def compare(items: Sequence[bytes], views: Sequence[View], cwd: bytes, shimmed: dict,
            plain: dict, inside: set[str]) -> list[str]:
    """Every answer of the shimmed run that is not what the model says."""
    wrong = []
    for i, path in enumerate(items):
        route = expected_route(views, path, cwd)
        calls = sorted({c for (j, c) in shimmed if j == i})
        assert calls, f"no answers for {path!r}"
        for call in calls:
            got = shimmed[(i, call)]
            if route.kind == "fail":
                want = f"err {route.errno}"
            else:
                want = plain[(i, call)]
                if call == "realpath" and route.view is not None and want.startswith("ok "):
                    resolved = bytes.fromhex(want[3:])
                    want = "ok " + unprefix(route.view, resolved).hex()
            if got != want:
                wrong.append(f"{path!r} {call}: got {got}, expected {want} ({route.kind} "
                             f"{route.target[:120]!r})")
            reached = got[3:] if got.startswith("ok ") and call in INODE_CALLS else None
            if route.kind == "redirect" and reached is not None and reached not in inside:
                wrong.append(f"{path!r} {call}: reached {reached}, outside the mock root")
    return wrong


def check(probe: Path, shim: Path, work: Path, items: list[bytes], views: Sequence[View],
          env: dict[str, str], inside: set[str], shim_cwd: Path | None = None,
          plain_cwd: Path | None = None) -> list[str]:
    cwd = os.fsencode(os.path.realpath(plain_cwd or probe_cwd(work)))
    routes = [expected_route(views, p, cwd) for p in items]
    targets = [r.target if r.kind != "fail" else b"/nonexistent" for r in routes]
    shimmed = run_probe(probe, items, work, environ(shim, **env), cwd=shim_cwd, tag="shim")
    plain = run_probe(probe, targets, work, environ(), cwd=plain_cwd, tag="plain")
    return compare(items, views, cwd, shimmed, plain, inside)


def main(argv: Sequence[str] | None = None) -> int:
    import trio

    from mokka import layout
    from mokka.noderoot.host import Host
    from mokka.simulators.pcibus import PcibusSettings, PcibusSimulator
    from tests.test_pcibus import h100_state

    parser = argparse.ArgumentParser(description="libmockfs.so path campaign")
    parser.add_argument("--paths", type=int, default=20000, help="random paths per view")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="work directory (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mokka-mockfs-fuzz-") as scratch:
        work = args.keep or Path(scratch)
        node = work / "node"
        node.mkdir(parents=True, exist_ok=True)
        sim = PcibusSimulator(PcibusSettings(fallback_cpus=8))
        trio.run(sim.stage, Host(node), h100_state())
        root = node / layout.STATE_ROOT.lstrip("/")
        shim, probe = build_sanitized(work / "build")
        wrong: list[str] = []
        view = mokka_view(root)
        items = paths(args.seed, args.paths, view)
        wrong += check(probe, shim, work, items, [view], {"MOKKA_MOCKFS_ROOT": str(root)},
                       tree_inodes(root))
        relative = [p.lstrip(b"/") for p in items if b".." in components(p)]
        wrong += check(probe, shim, work, relative, [view], {"MOKKA_MOCKFS_ROOT": str(root)},
                       tree_inodes(root), shim_cwd=Path("/sys/bus/pci/devices"),
                       plain_cwd=root / "sys/bus/pci/devices")
        pci = pci_view(root / "sys")
        items = paths(args.seed + 1, args.paths, pci)
        wrong += check(probe, shim, work, items, [pci], {"MOCK_PCI_ROOT": str(root / "sys")},
                       tree_inodes(root / "sys"))
        trio.run(sim.discard, Host(node))
        for line in wrong:
            print(line)
        total = 2 * (args.paths + len(ADVERSARIAL)) + len(relative)
        print(f"about {total} paths (seed {args.seed}): {len(wrong)} wrong answers")
        return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
