"""Node paths mapped beneath the node root, symlinks followed *inside* it.

Kept apart from ``mokka.noderoot.host`` so that ``mokka.noderoot.convergence`` (one converge
call's filesystem work) and ``mokka.noderoot.host`` (locking, bookkeeping, the public
API) both build on it and neither imports the other's internals: the layers
read one way, ``noderoot`` < ``convergence`` < ``host``.

Resolving a path costs an ``lstat`` per component, and a converge resolves
every parent of every path it places: a thousand files three to six levels
deep are tens of thousands of ``lstat`` calls for the same few hundred
directories.  ``NodeRoot.resolve`` therefore takes an optional *cache* that
one converge call owns: a directory found to be a real directory (or created
by the call) is resolved once, and every later path beneath it starts from
there.  The cache trusts what it saw for the length of one call only.  That
adds no exposure the walk did not already have: the walk checks, then the
write goes through the kernel's own path lookup, so a link planted in a
parent after the check is followed either way; what keeps a profile from
writing outside the root is that no *request* and no link found on the way
may climb out, and both are still checked on every uncached step.  A call
that removes a directory, or retries after one vanished, drops the cache.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from mokka.errors import HostPathError

#: Errors that end a walk as a missing component does (``NodeRoot._walk``).
_WALK_ENDS = (FileNotFoundError, NotADirectoryError, PermissionError)

#: Bound on symlink hops while resolving a path (Linux uses 40 too).
MAX_SYMLINKS = 40

#: A converge call's resolved directories: logical node path (``/var/run``,
#: no leading slash in the key: ``var/run``) -> real components beneath the root.
ResolveCache = dict[str, tuple[str, ...]]


def components(path: str) -> list[str]:
    """The names in a node path or link target, without empty and '.' parts ('..' stays).

    Split by hand rather than with ``PurePosixPath``: POSIX lets a path start
    with exactly two slashes mean something else, so ``PurePosixPath`` keeps
    ``//`` as a root of its own, which ``Path.joinpath`` then takes for the
    host's ``/``.  Under the node root, ``//var`` is ``/var``, like ``///var``.
    """
    return [p for p in path.split("/") if p not in ("", ".")]


def norm(path: str) -> str:
    """One spelling per node path: absolute, no trailing slash, no '.' parts."""
    parts = components(path)
    if not parts or any(p == ".." for p in parts):
        raise HostPathError(f"{path}: not a valid node path")
    return "/" + "/".join(parts)


class NodeRoot:
    """The node root directory and the one way to map node paths beneath it."""

    __slots__ = ("_prefix", "root")

    def __init__(self, root: Path) -> None:
        self.root = root
        #: ``<root>/``: real paths are built by string concatenation, not
        #: ``Path.joinpath``, which costs more than the ``lstat`` it feeds.
        self._prefix = str(root).rstrip("/") + "/"

    def real(self, parts: list[str] | tuple[str, ...]) -> Path:
        """The real path of components beneath the root."""
        return Path(self._prefix + "/".join(parts)) if parts else self.root

    def real_text(self, parts: list[str] | tuple[str, ...]) -> str:
        """``real`` as a string: a converge's hot path builds no ``Path`` per file."""
        return self._prefix + "/".join(parts) if parts else str(self.root)

    def node_path(self, real: str | Path) -> str:
        """A real path beneath the root as its node path (``/`` for the root itself)."""
        text = str(real)
        if text == str(self.root):
            return "/"
        if not text.startswith(self._prefix):
            raise ValueError(f"{real} is not beneath {self.root}")
        return "/" + text[len(self._prefix):]

    def resolve(
        self,
        path: str | os.PathLike[str],
        *,
        follow_last: bool = False,
        cache: ResolveCache | None = None,
    ) -> Path:
        """Map a node path (``/var/run/cdi/x`` or ``var/run/cdi/x``) beneath the root.

        Symlinks met on the way are followed *inside* the root, the way the
        host itself would see them: an absolute target is re-rooted (on a
        real host ``/host/var/run → /run`` means ``/host/run``), a relative
        target is spliced in.  Anything that would climb above the root,
        ``..`` in the request itself, or a relative link like
        ``../../../etc``, raises ``HostPathError``: nothing a profile or a
        planted link says can make the daemon write outside its root.  The
        last component is not followed unless ``follow_last`` (we create,
        replace or remove *that* entry).  A missing component (or one under
        a non-directory, or in a directory we may not search) ends the walk:
        the rest is taken as written, and whatever uses the path gets the
        real error (``exists`` answers False, a write fails with ENOTDIR or
        EACCES, one line each).
        """
        return self.real(self.resolve_parts(path, follow_last=follow_last, cache=cache))

    def resolve_parts(
        self,
        path: str | os.PathLike[str],
        *,
        follow_last: bool = False,
        cache: ResolveCache | None = None,
    ) -> list[str]:
        """``resolve`` as the real components beneath the root (no ``Path`` built)."""
        raw = os.fspath(path)
        if "\x00" in raw:
            raise HostPathError(f"{raw!r}: NUL byte in path")
        parts = components(raw)
        if ".." in parts:
            raise HostPathError(f"{raw}: '..' is not allowed in node paths")
        if not parts:
            return []
        if cache is None:
            cache = {}
        hops = [0]
        if follow_last:
            resolved, _complete = self._directory(raw, parts, cache, hops)
        else:
            resolved, _complete = self._directory(raw, parts[:-1], cache, hops)
            resolved = [*resolved, parts[-1]]
        return resolved

    def _directory(
        self, raw: str, parts: list[str], cache: ResolveCache, hops: list[int]
    ) -> tuple[list[str], bool]:
        """Real components of ``parts`` with every link followed; complete = all found.

        Prefix by prefix, so every directory on the way lands in ``cache``
        and the next path beneath it starts there.
        """
        known = len(parts)
        while known and "/".join(parts[:known]) not in cache:
            known -= 1
        resolved = list(cache["/".join(parts[:known])]) if known else []
        for i in range(known, len(parts)):
            resolved, found = self._walk(raw, resolved, [parts[i]], hops)
            if found is None:
                return [*resolved, *parts[i + 1:]], False
            if found:
                cache["/".join(parts[: i + 1])] = tuple(resolved)
        return resolved, True

    def _walk(
        self, raw: str, resolved: list[str], names: list[str], hops: list[int]
    ) -> tuple[list[str], bool | None]:
        """Walk ``names`` from the real directory ``resolved``, following links.

        Returns the real components and whether the end is a directory
        (``None``: something on the way is missing; the rest is as written).
        """
        pending = names[::-1]  # a stack: the next name last
        resolved = list(resolved)
        is_dir = True
        while pending:
            name = pending.pop()
            if name == "..":
                if not resolved:
                    raise HostPathError(f"{raw}: a symlink on the way climbs above the node root")
                resolved.pop()
                is_dir = True
                continue
            candidate = self._prefix + "/".join(resolved) + ("/" if resolved else "") + name
            try:
                st = os.lstat(candidate)
            except OSError as exc:
                # Missing, under a non-directory, not searchable, or a name too
                # long to exist: the walk ends, and the rest is taken as written.
                if not isinstance(exc, _WALK_ENDS) and exc.errno != errno.ENAMETOOLONG:
                    raise
                return [*resolved, name, *pending[::-1]], None
            if stat.S_ISLNK(st.st_mode):
                hops[0] += 1
                if hops[0] > MAX_SYMLINKS:
                    raise HostPathError(f"{raw}: too many symlinks")
                target = os.readlink(candidate)
                if target.startswith("/"):
                    resolved = []
                pending.extend(components(target)[::-1])
                continue
            resolved.append(name)
            is_dir = stat.S_ISDIR(st.st_mode)
        return resolved, is_dir
