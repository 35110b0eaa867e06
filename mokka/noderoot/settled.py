"""What an owner's last converge left, and how to tell that nothing has changed since.

The fast path of a pass that changes nothing: ``Host`` keeps one ``Settled``
record per owner and asks it whether the node still holds what it recorded,
before any converge work is set up.  It is a value of its own (not part of
``mokka.noderoot.convergence``, which builds it) because the host keeps it between
calls while a ``Convergence`` lives for one call only.

One level up, ``Activity`` is what one simulator call (a stage, an apply)
asked of the host: the owners it converged, with the ``Settled`` each left,
and every node path it looked at, with its signature then.  The waves keep
it to skip a call whose input and node are both unchanged (the drift check
of a repair pass: no re-render at all), see ``Host.unchanged``.
"""

from __future__ import annotations

import contextvars
import os
import stat
from collections.abc import Callable, Iterable

import attrs

from mokka.noderoot.artifacts import Artifact

#: An entry's ``signature``; ``None``: nothing there.
Signature = tuple[int, ...] | None


@attrs.frozen(eq=False)
class Settled:
    """An owner's converged part of the node, as ``lstat`` saw it right after the converge.

    What makes a pass that changes nothing cost one ``lstat`` per path.
    Asked for the same artifacts again, ``Host.converge`` compares the
    signature of every path placed, every directory above them, every
    copied source (``stat``) and the owner's manifest files with what they
    were (``holds``); when every one is unchanged, the node still is what
    the last converge made it, and there is nothing to resolve, read,
    compare or write.  Inode and change time are in the signature: any
    write, chmod, chown, rename over or delete changes the change time,
    which no one can set back, so an unchanged signature is an unchanged
    entry.  A directory is compared as the same directory (device, inode,
    type and mode, owner: ``_same_directory``), not by its times, which
    change whenever an owner places a file beside ours; a file swapped for
    a link, or removed, changes its own signature.  When anything differs
    the next converge is a full one, which records anew, but still skips
    each path found as it was (``Convergence._still_placed``).
    (On a kernel with coarse timestamps, a write landing within the same
    clock tick as the converge's own, with the same size, keeps every field
    of the signature; kernels with fine-grained change times, 6.13 on, give
    every such write a new one.)
    """

    wanted: list[Artifact]
    #: node path -> (artifact, real path, signature after the converge)
    files: dict[str, tuple[Artifact, str, Signature]]
    #: real directory -> signature
    dirs: dict[str, Signature]
    sources: dict[str, Signature]
    bookkeeping: dict[str, Signature]
    degraded: tuple[str, ...]
    _sweep: tuple[tuple[str, Signature], ...] | None = attrs.field(default=None, init=False)

    def holds(self, wanted: list[Artifact]) -> bool:
        """Whether ``wanted`` is what was converged and nothing it made has changed since.

        ``wanted`` is compared by identity first: a replayed call hands back
        the very list it recorded, and comparing a thousand artifacts field
        by field costs more than the ``lstat`` sweep itself.
        """
        if wanted is not self.wanted and wanted != self.wanted:
            return False
        if self._sweep is None:
            # Built on first use: every lstat'ed path with its signature, in
            # one flat tuple, so the sweep is one tight loop.
            sweep = (*self.bookkeeping.items(),
                     *((real, sig) for _a, real, sig in self.files.values()))
            object.__setattr__(self, "_sweep", sweep)
        return (
            _unchanged(self._sweep, os.lstat)
            and all(_same_directory(path, sig) for path, sig in self.dirs.items())
            and _unchanged(self.sources.items(), os.stat)
        )

    def rewritten(self, path: str) -> None:
        """Take the signature of placed file ``path`` anew: the converging call itself
        rewrote it in place after the converge (``Host.rewrote_in_place``)."""
        entry = self.files.get(path)
        if entry is not None:
            artifact, real, _before = entry
            self.files[path] = (artifact, real, signature(real, os.lstat))
            object.__setattr__(self, "_sweep", None)


#: A looked-at path's recorded state: its signature, or why it has none.
Seen = Signature | str


@attrs.define(eq=False)
class Activity:
    """What one simulator call asked of the host, recorded while it ran (``Host.recording``).

    The call's output is a function of its input (the ``State``) and of
    what it found on the node; both are here, so when the input is the same
    and ``Host.unchanged`` finds every entry as recorded, calling it again
    could only converge the same artifacts onto the same node, which the
    ``Settled`` records already say is a no-op.  Recorded:

    * ``converged``: each owner converged, with the ``Settled`` its last
      converge in the call left (``None``: discarded, nothing held);
    * ``looked_at``: each node path resolved, tested or read outside a
      converge (``resolve``, ``exists``, ``read_bytes``, ``owned``), with
      the signature it had; a caller that reads a file or lists a directory
      it resolved sees new content exactly when the signature changes;
    * ``outside``: each path of the machine *outside* the node root the
      call's outcome depends on (``Host.depends_on``: the mount table, a
      host binary it may copy, a directory it looks for an archive in),
      with its signature, or its content for a pseudo-file;
    * ``opaque``: why the call cannot be replayed at all: it ran a host
      command (its effects and answers are outside the node root), or read
      a pseudo-filesystem (``/proc``, ``/sys``: content changes there
      without any change of signature).
    """

    converged: dict[str, Settled | None] = attrs.field(factory=dict)
    looked_at: dict[tuple[str, bool], Seen] = attrs.field(factory=dict)
    outside: dict[str, Seen] = attrs.field(factory=dict)
    opaque: str | None = None
    #: The call ended: a thread or task it left running records no more.
    closed: bool = False


#: The ``Activity`` of the simulator call running in this context, if one is
#: being recorded.  Trio copies the context into worker threads and spawned
#: tasks, so a call's thread hops are recorded with it.
RECORDING: contextvars.ContextVar[Activity | None] = contextvars.ContextVar(
    "mokka_host_activity", default=None
)


def _unchanged(entries: Iterable[tuple[str, Signature]], stat_fn: Callable[[str], os.stat_result]
               ) -> bool:
    """Whether every path still has its signature: ``signature`` inlined, one loop.

    The drift check of a large node is a thousand of these; the call and
    the ``try`` per path of ``signature`` cost as much as the ``lstat``.
    """
    for path, sig in entries:
        try:
            st = stat_fn(path)
        except OSError:
            if sig is not None:
                return False
            continue
        if sig != (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns,
                   st.st_ctime_ns, st.st_uid, st.st_gid):
            return False
    return True


def _same_directory(path: str, sig: Signature) -> bool:
    """Whether ``path`` is still the very directory ``sig`` recorded, with its mode and owner.

    Its size and times are left out: they change whenever any entry in it
    is added or removed, and the directories an owner places into are
    shared (sibling batches, other simulators fill them in the same pass).
    What matters of a directory for the entries placed in it is that it is
    the same one (device, inode; a link or another directory swapped in
    is neither) with the mode and owner it was given; each entry placed
    in it is compared on its own.
    """
    now = signature(path, os.lstat)
    if now is None or sig is None:
        return now is sig
    return now[:3] == sig[:3] and now[6:] == sig[6:]


def signature(path: str, stat_fn: Callable[[str], os.stat_result]) -> Signature:
    """What identifies an entry's current version: device, inode, type and mode, size,
    owner, times (the change time above all, see ``Settled``)."""
    try:
        st = stat_fn(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
            st.st_uid, st.st_gid)


#: What a looked-at entry that cannot be compared records: its call is never replayed.
UNCOMPARABLE = "cannot be compared"
#: Pseudo-files larger than this are not compared by content (``content_signature``).
CONTENT_LIMIT = 64 * 1024


def content_signature(path: str, stat_fn: Callable[[str], os.stat_result]) -> Seen:
    """``signature`` and the content, for a file whose content changes under an unchanged
    signature (procfs, sysfs: a module registering a device major); ``UNCOMPARABLE`` for
    anything but a small, readable regular file."""
    sig = signature(path, stat_fn)
    if sig is None:
        return None
    if not stat.S_ISREG(sig[2]):
        return UNCOMPARABLE
    try:
        with open(path, "rb") as pseudo_file:
            content = pseudo_file.read(CONTENT_LIMIT + 1)
    except OSError:
        return UNCOMPARABLE
    if len(content) > CONTENT_LIMIT:
        return UNCOMPARABLE
    return f"{sig} {content.hex()}"
