"""The node root: the only way any simulator touches the filesystem.

Everything Mokka writes lives under one directory, the *node root*: ``/host``
inside the DaemonSet pod, ``./mokka-node`` for a local run, a temporary
directory in tests.  Simulators never build paths themselves; they describe
what they want (``File``, ``Symlink``, ``CharDevice``, ``Directory``,
``CopyOf``) and call ``Host.converge(owner, artifacts)``, which

* resolves every path *beneath* the root (see ``Host.resolve``),
* creates or updates only what differs (unchanged files are not rewritten, so
  their mtimes stay, and a second stage is a no-op),
* records every path it created in the owner's **manifest**, persisted under
  the root's state directory before the path is created, so a fresh process
  can ``discard`` what a killed one left behind,
* removes what the owner created earlier but the new set no longer lists
  (convergence downward: 8 → 4 GPUs removes ``nvidia4..7``),
* records a directory another owner created as shared (sibling batches and
  simulators write into the same parents, concurrently), so whichever owner
  is discarded last removes it,
* backs up a pre-existing file it is asked to overwrite and restores it on
  discard, so teardown leaves the node byte for byte as it was found.

The artifact types live in ``mokka.artifacts``, the manifest in
``mokka.manifest`` and one converge call's work in ``mokka.convergence``;
the artifact types are re-exported here, the one module simulators import.
All methods are blocking; simulators call them through
``trio.to_thread.run_sync`` once per batch (one thread hop per surface, not
per file).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import subprocess
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import attrs

from mokka.artifacts import (
    Artifact,
    CharDevice,
    ConvergeReport,
    CopyOf,
    Directory,
    File,
    Symlink,
)
from mokka.convergence import Convergence, rmdir_empty_tree
from mokka.errors import CommandError, HostPathError, MokkaError
from mokka.layout import MOKKA_STATE_DIR as STATE_DIR
from mokka.manifest import Manifest

__all__ = [
    "STATE_DIR",
    "Artifact",
    "CharDevice",
    "CommandRunner",
    "ConvergeReport",
    "CopyOf",
    "Directory",
    "File",
    "Host",
    "SubprocessRunner",
    "Symlink",
]

logger = logging.getLogger(__name__)


#: Bound on symlink hops while resolving a path (Linux uses 40 too).
_MAX_SYMLINKS = 40


# --------------------------------------------------------------------------
# Host commands
# --------------------------------------------------------------------------


class CommandRunner(Protocol):
    """Runs a host command (systemctl, nvidia-ctk); injectable so tests record calls."""

    def run(
        self, argv: Sequence[str], *, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]: ...


@attrs.frozen
class SubprocessRunner:
    """The real runner: a subprocess with captured text output."""

    def run(
        self, argv: Sequence[str], *, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv``; a non-zero exit is returned (callers decide), a failure to run raises.

        ``CommandError`` only when the command could not run at all (missing
        binary, timeout): the caller's readiness reason then says which.
        """
        try:
            return subprocess.run(
                list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CommandError(f"{argv[0]}: {exc}") from exc


# --------------------------------------------------------------------------
# The host
# --------------------------------------------------------------------------


@attrs.define(eq=False)
class Host:
    """The node root plus the command runner; see the module docstring."""

    root: Path = attrs.field(converter=lambda p: Path(p).absolute())
    runner: CommandRunner = attrs.field(factory=SubprocessRunner)
    #: Per-owner locks: converge/discard of one owner never interleave.
    _locks: dict[str, threading.Lock] = attrs.field(factory=dict, init=False)
    _locks_guard: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    #: Guards the shared state directory: created by the first converge in
    #: flight, removed by the last one out when no manifest remains.
    _state_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _state_users: int = attrs.field(default=0, init=False)

    @contextlib.contextmanager
    def _state_in_use(self) -> Iterator[None]:
        with self._state_lock:
            self._state_users += 1
            self._ensure_state_dir()
        try:
            yield
        finally:
            with self._state_lock:
                self._state_users -= 1
                if self._state_users == 0:
                    self._cleanup_state_dir()

    # ---- paths ---------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        """Mokka's bookkeeping directory (manifests, backups) under the root."""
        return self.resolve(STATE_DIR)

    def resolve(self, path: str | os.PathLike[str], *, follow_last: bool = False) -> Path:
        """Map a node path (``/var/run/cdi/x`` or ``var/run/cdi/x``) beneath the root.

        Symlinks met on the way are followed *inside* the root, the way the
        host itself would see them: an absolute target is re-rooted (on a
        real host ``/host/var/run → /run`` means ``/host/run``), a relative
        target is spliced in.  Anything that would climb above the root,
        ``..`` in the request itself, or a relative link like
        ``../../../etc``, raises ``HostPathError``: nothing a profile or a
        planted link says can make the daemon write outside its root.  The
        last component is not followed unless ``follow_last`` (we create,
        replace or remove *that* entry).
        """
        raw = os.fspath(path)
        if "\x00" in raw:
            raise HostPathError(f"{raw!r}: NUL byte in path")
        parts = _components(raw)
        if any(p == ".." for p in parts):
            raise HostPathError(f"{raw}: '..' is not allowed in node paths")
        if not parts:
            return self.root
        resolved: list[str] = []
        pending = list(parts)
        hops = 0
        while pending:
            name = pending.pop(0)
            if name == "..":
                if not resolved:
                    raise HostPathError(f"{raw}: a symlink on the way climbs above the node root")
                resolved.pop()
                continue
            candidate = self.root.joinpath(*resolved, name)
            is_last = not pending
            if is_last and not follow_last:
                resolved.append(name)
                break
            try:
                st = os.lstat(candidate)
            except (FileNotFoundError, NotADirectoryError):
                # Missing, or under a non-directory: the rest is taken as
                # written, and whatever uses the path gets the real error
                # (``exists`` answers False, a write fails with ENOTDIR).
                resolved.append(name)
                resolved.extend(pending)
                break
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > _MAX_SYMLINKS:
                    raise HostPathError(f"{raw}: too many symlinks")
                target = os.readlink(candidate)
                if target.startswith("/"):
                    resolved = []
                pending = _components(target) + pending
                continue
            resolved.append(name)
        result = self.root.joinpath(*resolved)
        # Belt and braces: the walk above never yields a path outside the root.
        if os.path.commonpath([self.root, result]) != str(self.root):
            raise HostPathError(f"{raw}: resolves outside the node root")
        return result

    def exists(self, path: str) -> bool:
        """Whether a node path exists (a dangling link counts); an escaping path does not."""
        try:
            return os.path.lexists(self.resolve(path))
        except HostPathError:
            return False

    def read_bytes(self, path: str) -> bytes:
        """A node file's content, symlinks followed inside the root."""
        return self.resolve(path, follow_last=True).read_bytes()

    def read_text(self, path: str) -> str:
        """A node file's content as UTF-8 text."""
        return self.read_bytes(path).decode()

    # ---- host commands -----------------------------------------------

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess[str]:
        """Run a host command through the injected runner (tests record, the daemon executes)."""
        return self.runner.run(argv, **kwargs)

    # ---- convergence ---------------------------------------------------

    def _lock(self, owner: str) -> threading.Lock:
        """The lock serialising one owner's converges (simulators batch in worker threads)."""
        with self._locks_guard:
            return self._locks.setdefault(owner, threading.Lock())

    def _manifest_dir(self) -> Path:
        """Where every owner's manifest and journal live."""
        return self.resolve(STATE_DIR + "/manifests", follow_last=True)

    def _ensure_state_dir(self) -> None:
        """Create the state directory, remembering which ancestors were ours.

        On an empty root (tests, a local run) ``/var`` and ``/var/lib`` do not
        exist; recording them lets the last discard remove them again, so the
        root ends exactly as it started.
        """
        state = self.state_dir
        if state.is_dir():
            return
        created: list[str] = []
        parts = STATE_DIR.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            rel = "/" + "/".join(parts[:i])
            real = self.resolve(rel, follow_last=True)
            if not real.is_dir():
                real.mkdir(mode=0o755)
                created.append(rel)
        (state / "created-parents.json").write_text(json.dumps(created))

    def _cleanup_state_dir(self) -> None:
        """Remove the state directory (and the ancestors it created) once it records nothing."""
        state = self.state_dir
        manifests = self._manifest_dir()
        if manifests.is_dir() and any(manifests.iterdir()):
            return
        backups = state / "backups"
        if backups.is_dir() and any(p.is_file() for p in backups.rglob("*")):
            return  # a backup still waits to be restored
        marker = state / "created-parents.json"
        created = json.loads(marker.read_text()) if marker.is_file() else []
        marker.unlink(missing_ok=True)
        rmdir_empty_tree(state)
        for rel in sorted(created, key=lambda r: -r.count("/")):
            # OSError: something else now lives there, so it stays.
            with contextlib.suppress(OSError):
                self.resolve(rel, follow_last=True).rmdir()

    def owned(self, owner: str) -> dict[str, str]:
        """The paths ``owner`` currently owns (path → kind), as persisted."""
        with self._lock(owner):
            return dict(Manifest.load(owner, self._manifest_dir()).entries)

    def converge(self, owner: str, artifacts: Iterable[Artifact]) -> ConvergeReport:
        """Make ``owner``'s part of the node exactly ``artifacts``; see the module docstring."""
        _check_owner(owner)
        wanted = list(artifacts)
        with self._lock(owner), self._state_in_use():
            manifest = Manifest.load(owner, self._manifest_dir())
            work = Convergence(self, manifest)
            wanted_paths: set[str] = set()
            try:
                for art in wanted:
                    norm = _norm(art.path)
                    wanted_paths.add(norm)
                    work.put(art, norm)
                work.remove_unwanted(wanted_paths)
            finally:
                # The journal already records what happened; an error leaves
                # it for the next converge (or a fresh process) to fold in.
                manifest.close()
            manifest.compact()
            return work.report()

    def discard(self, owner: str) -> ConvergeReport:
        """Remove everything ``owner`` created (also by an earlier process); restore backups."""
        return self.converge(owner, ())

    def discard_all(self) -> ConvergeReport:
        """Discard every owner with a manifest (``mokka cleanup``).

        Every owner is tried even when one fails (the manual recovery must
        not stop at the first stuck path); the failures are raised together
        afterwards, as one ``HostPathError`` naming each owner.
        """
        directory = self._manifest_dir()
        owners = sorted(
            {p.name.rsplit(".", 1)[0] for p in directory.glob("*.json")}
            | {p.name.rsplit(".", 1)[0] for p in directory.glob("*.journal")}
        ) if directory.is_dir() else []
        removed: list[str] = []
        failures: list[str] = []
        for owner in owners:
            try:
                removed.extend(self.discard(owner).removed)
            except (OSError, MokkaError) as exc:
                logger.warning("could not discard everything of %s: %s", owner, exc)
                failures.append(f"{owner}: {exc}")
        if failures:
            raise HostPathError("; ".join(failures))
        return ConvergeReport(removed=tuple(removed))


def _check_owner(owner: str) -> None:
    """Owner names become manifest file names: no separators, no hidden files."""
    if not owner or "/" in owner or owner.startswith("."):
        raise ValueError(f"invalid owner name {owner!r}")


def _norm(path: str) -> str:
    """One spelling per node path: absolute, no trailing slash, no '.' parts."""
    parts = _components(path)
    if not parts or any(p == ".." for p in parts):
        raise HostPathError(f"{path}: not a valid node path")
    return "/" + "/".join(parts)


def _components(path: str) -> list[str]:
    """The names in a node path or link target, without empty and '.' parts ('..' stays).

    Split by hand rather than with ``PurePosixPath``: POSIX lets a path start
    with exactly two slashes mean something else, so ``PurePosixPath`` keeps
    ``//`` as a root of its own, which ``Path.joinpath`` then takes for the
    host's ``/``.  Under the node root, ``//var`` is ``/var``, like ``///var``.
    """
    return [p for p in path.split("/") if p not in ("", ".")]
