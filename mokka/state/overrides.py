"""The runtime overrides file: failure injection and metric pins, changed live.

```yaml
version: 1
all: {thermal: {temperature_gpu_c: 70}}          # merged into every device
devices:
  "0": {failure: {mode: ecc_uncorrectable, after_calls: 1, xid: {code: 79}}}
  "GPU-0a1b…": {utilization: {gpu: 90}}          # by per-node UUID
```

Compilation merges ``profile device < all < devices[index] < devices[uuid]``
(``mokka.state.compile``).  Parsing is strict: every key must be one the
schema (``mokka.state.override_schema``) knows, and identity fields are
refused, so a typo is an error at write time rather than a silent no-op.

Writers (``mokka ctl``, tests) go through ``update_overrides``: an exclusive
``flock`` on the sibling ``overrides.yaml.lock``, read, change, validate the
whole result, then write a temp file and rename it over the old one (mode
0644).  Readers never lock: a rename is atomic, so they see the old file or
the new one, never half of either.  The daemon calls ``reset_file`` at start:
runtime state does not survive a pod restart.

The file and its lock usually sit under the node root, where anyone who can
write the config directory could plant a symlink in their place.  Neither
is ever followed there: the lock is opened with ``O_NOFOLLOW`` always (it is
a file only Mokka creates), and given the ``root`` the path lies beneath,
the file, the lock and every directory on the way to them are reached from
the root without following any link (``mokka.state.reader.open_parent``).
Under the root, ``mokka ctl`` records both in the manifests of
``MANIFEST_OWNERS`` through ``Host`` before creating them, so
``mokka cleanup`` removes them after a killed daemon.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

from mokka.errors import MokkaError
from mokka.lazylogger import LazyLogger
from mokka.state import checks
from mokka.state.checks import Problems, sub
from mokka.state.override_schema import check_patch
from mokka.state.reader import load_yaml, open_parent, read_input

logger = LazyLogger(__name__)

TOP_LEVEL_KEYS = ("version", "all", "devices")
#: Digits a device index key may have: far more than any GPU count, far
#: fewer than ``int``'s limit on converting text.
_MAX_INDEX_DIGITS = 32
#: Readable by every user (``mokka ctl status``, a person inspecting the node),
#: writable only by its owner: changes go through ``update_overrides``.
FILE_MODE = 0o644
#: libyaml's emitter when available: ``mokka ctl`` rewrites the whole file per change.
_Dumper: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
#: The ``Host`` manifest owners under which ``mokka ctl`` records the file
#: and its lock (and, shared, the directories above them) before creating
#: them; the daemon discards both when it resets the file.
MANIFEST_OWNERS = ("runtime-overrides", "runtime-overrides-lock")
#: Seconds ``reset_file`` waits for the lock before resetting without it: a
#: process that holds the lock and never lets go must not stall the daemon's
#: start or teardown (a writer holds it for milliseconds).
RESET_LOCK_TIMEOUT = 2.0
#: Tells whoever opens the file by hand that it is generated and short-lived.
HEADER = (
    "# Runtime overrides of the mock GPUs, written by `mokka ctl` (edits are validated there).\n"
    "# A restart of the node agent resets this file.\n"
)


@attrs.frozen(kw_only=True)
class Overrides:
    """A validated overrides document.

    Device keys are normalized (``device_key``), so ``0``, ``"0"`` and
    ``"00"`` are one key and a UUID is one key in any case.  The patches
    themselves are stored as written: they are merged into the device config
    by the compiler, and the schema has already vouched for them.
    """

    #: always 1: ``from_mapping`` refuses any other version
    version: int = 1
    #: merged into every device
    all: Mapping[str, Any] = attrs.field(factory=dict)
    #: per device: key ``"<index>"`` or a GPU UUID (``GPU-`` + lower-case hex)
    devices: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    #: the path it was read from, for messages; not part of equality, so the
    #: same content read from two places compares equal
    source: str = attrs.field(default="", eq=False)

    @classmethod
    def from_mapping(cls, doc: Any, *, source: str) -> Overrides:
        """Validate ``yaml.safe_load`` output; an empty document is an empty overrides."""
        if doc is None:
            return cls(source=source)
        p = Problems(source)
        top = checks.as_mapping(p, "(document)", doc)
        p.raise_if_any()
        assert top is not None
        top = checks.normalize_numbers(top)
        checks.check_keys(p, "", top, TOP_LEVEL_KEYS)
        version = checks.require(p, "", top, "version", "1")
        if version is not None and (isinstance(version, bool) or version != 1):
            p.add("version", f"{checks.found(version)} is not supported, expected 1")
        all_patch: dict[str, Any] = {}
        if top.get("all") is not None:
            all_patch = checks.as_mapping(p, "all", top["all"]) or {}
            check_patch(p, "all", all_patch)
        devices: dict[str, dict[str, Any]] = {}
        raw_devices = top.get("devices")
        if raw_devices is not None:
            for key, patch in (checks.as_mapping(p, "devices", raw_devices) or {}).items():
                norm = device_key(key)
                path = sub("devices", str(key))
                if norm is None:
                    p.add(path, f"{checks.found(key)} is not a GPU index or a GPU UUID "
                          "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
                    continue
                if norm in devices:
                    p.add(path, f"{key!r} names the same GPU as another key")
                    continue
                # ``"0":`` with nothing below it (left after an edit) is an empty patch
                patch_map = checks.as_mapping(p, path, patch) if patch is not None else {}
                if patch_map is None:
                    continue
                check_patch(p, path, patch_map)
                devices[norm] = patch_map
        p.raise_if_any()
        return cls(version=1, all=all_patch, devices=devices, source=source)

    @property
    def empty(self) -> bool:
        """No patch with any content: the same node as having no overrides file.

        ``compile.content_hash`` hashes an empty document like a missing one,
        so ``mokka ctl reset`` brings back the very hash (and generation) the
        node had before the first edit, and the source publishes nothing new.
        """
        return not self.all and not any(self.devices.values())

    def to_mapping(self) -> dict[str, Any]:
        """The canonical document (what ``write_overrides`` writes, what hashing reads).

        A deep copy: ``update_overrides`` hands it to the caller's ``change``,
        which edits it in place, and this frozen value must not change with it.
        """
        doc: dict[str, Any] = {"version": self.version}
        if self.all:
            doc["all"] = checks.deep_merge({}, self.all)
        if self.devices:
            doc["devices"] = {k: checks.deep_merge({}, v) for k, v in self.devices.items()}
        return doc

    def layers_for(self, index: int, uuid: str) -> list[tuple[str, Mapping[str, Any]]]:
        """The patches that apply to one GPU, weakest first, each with its label.

        A UUID key beats an index key: the UUID names one GPU on one node
        for good, while an index names whichever GPU sits in that slot.  The
        label (``devices.0``) places an Xid entry for its stable id.
        """
        layers: list[tuple[str, Mapping[str, Any]]] = []
        if self.all:
            layers.append(("all", self.all))
        for key in (str(index), device_key(uuid)):
            if self.devices.get(key):
                layers.append((f"devices.{key}", self.devices[key]))
        return layers


def device_key(key: Any) -> str | None:
    """Normalize a ``devices`` key: an index (``0``, ``"0"``) or a GPU UUID; ``None`` if neither.

    YAML gives an unquoted ``0:`` as an int and a quoted one as a string;
    both become ``"0"``.  UUIDs become lower-case hex after ``GPU-``, the
    spelling ``mokka.state.identity`` produces, so a pasted upper-case UUID
    still matches its GPU.
    """
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return str(key)
    if isinstance(key, str):
        # ASCII digits only: ``str.isdigit`` also says yes to ``"²"``, which
        # ``int`` refuses; and a key of thousands of digits is no index
        # either (``int`` refuses those too, beyond its 4300-digit limit).
        if key.isascii() and key.isdigit() and len(key) <= _MAX_INDEX_DIGITS:
            return str(int(key))
        if checks.GPU_UUID_RE.fullmatch(key):
            return "GPU-" + key[4:].lower()
    return None


def parse_overrides(text: str, *, source: str) -> Overrides:
    """Parse and validate an overrides file's text; ``SpecError`` lists every problem."""
    return Overrides.from_mapping(load_yaml(text, source), source=source)


def load_overrides(path: Path, *, root: Path | None = None) -> Overrides | None:
    """The overrides at ``path``; ``None`` when the file does not exist (not an error).

    ``root``: the path is beneath that node root, so a symlink there is
    refused rather than followed (it could lead to any file on the host).
    """
    text = read_input(path, "the overrides file", optional=True, root=root)
    return None if text is None else parse_overrides(text, source=str(path))


def lock_path(path: Path) -> Path:
    """The sibling lock file, ``overrides.yaml.lock``.

    Not the overrides file itself: every write replaces that file by a
    rename, so two writers could hold locks on two different inodes.
    """
    return path.with_name(path.name + ".lock")


def open_lock(path: Path, *, root: Path | None = None) -> int:
    """A descriptor of ``<path>.lock``, created if missing, never through a symlink.

    ``O_NOFOLLOW``: a planted ``overrides.yaml.lock`` symlink would otherwise
    make every writer (and the daemon, at start and at teardown) create a
    file wherever it points.  ``O_NONBLOCK`` and the ``fstat`` check: a FIFO
    or a device in its place is refused, not opened for good.  Refusals are
    ``OSError``s naming the lock file, as any failure to open it would be.
    ``root``: no directory on the way from it is followed either.
    """
    lpath = lock_path(path)
    # CLOEXEC: a lock must not outlive this process in a child it spawns
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    dir_fd: int | None = None
    try:
        dir_fd, name = open_parent(lpath, root)
        fd = os.open(name, flags, FILE_MODE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link, expected the lock file Mokka creates "
                          "(no link is followed: it could lead outside the node root)",
                          str(lpath)) from None
        raise
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file, expected the lock file Mokka creates",
                      str(lpath))
    return fd


def _flock(fd: int, timeout: float | None) -> bool:
    """Take the exclusive lock; ``False`` when ``timeout`` seconds passed first."""
    if timeout is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


@contextlib.contextmanager
def locked(
    path: Path, *, timeout: float | None = None, root: Path | None = None
) -> Iterator[bool]:
    """Hold the exclusive ``flock`` on ``<path>.lock`` (blocking until it is ours).

    ``reset_file`` unlinks the lock file while holding it; a writer that was
    waiting then holds a lock on an unlinked inode, so it checks that the
    path still names its inode and retries otherwise.  With ``timeout``,
    yields ``False`` (without the lock) once that many seconds passed.
    ``root``: see ``open_lock``.
    """
    lpath = lock_path(path)
    while True:
        fd = open_lock(path, root=root)
        try:
            held_lock = _flock(fd, timeout)
            if not held_lock:
                logger.warning("%s: still locked after %ss, going on without the lock",
                               lpath, timeout)
                break
            held = os.fstat(fd)
            try:
                current = _lstat_beneath(lpath, root)
            except FileNotFoundError:
                current = None
            same = current is not None and (current.st_dev, current.st_ino) == (
                held.st_dev, held.st_ino)
            if same:
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield held_lock
    finally:
        os.close(fd)


@contextlib.contextmanager
def records_locked(
    path: Path, *, timeout: float | None = None, root: Path | None = None
) -> Iterator[bool]:
    """Hold the exclusive ``flock`` on the directory ``path`` sits in (blocking until it is ours).

    One process at a time changes Mokka's records of the file and its lock.
    ``mokka ctl`` records the lock file (owner ``MANIFEST_OWNERS[1]``)
    before it exists, so that converge cannot run under the lock file's
    own ``flock``: two calls at once compacted that owner's manifest at
    once, and one failed (the other had renamed its temp snapshot away).
    The daemon holds this while it resets the file and discards both
    owners at start, so a reset never interleaves with a change either.
    The directory is the daemon's, never replaced by a writer, so unlike
    ``locked`` the lock needs no re-check.  A missing directory yields
    ``False`` at once: nothing is written there to keep apart.  ``timeout``
    and ``root`` as for ``locked``; no link beneath ``root`` is followed.
    """
    try:
        fd, _ = open_parent(path, root)
        if fd is None:
            fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    if fd is None:
        yield False
        return
    try:
        held = _flock(fd, timeout)
        if not held:
            logger.warning("%s: still locked after %ss, going on without the lock",
                           path.parent, timeout)
        yield held
    finally:
        os.close(fd)


def write_overrides(path: Path, overrides: Overrides) -> None:
    """Atomically replace ``path`` (temp file in the same directory, then rename).

    The caller holds the lock (``locked``); ``update_overrides`` does.  The
    temp file sits in the same directory because a rename is atomic only
    within one filesystem, and it starts with a dot so a listing of the
    config directory does not show it.  Readers (the daemon's file source,
    ``mokka ctl status``) only ever see a complete old or new file.
    """
    # imported here: ``tempfile`` imports ``random``, a cost every ``mokka ctl``
    # call would pay, and under a node root the file is written through ``Host``
    import tempfile

    text = render(overrides)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            # mkstemp creates the file 0600; other users' readers need FILE_MODE
            os.fchmod(f.fileno(), FILE_MODE)
            # No fsync: the rename alone makes the switch atomic for readers, and
            # the file is runtime state that a restart resets anyway.
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def render(overrides: Overrides) -> str:
    """The file's text: the header, then the canonical document."""
    return HEADER + yaml.dump(overrides.to_mapping(), Dumper=_Dumper, sort_keys=False,
                              default_flow_style=False)


def require_config_dir(path: Path) -> None:
    """Refuse ``path`` when the directory it would sit in is missing (``MokkaError``).

    Not something to create: a missing driver config directory almost always
    means a wrong ``--root`` or an agent that has not staged the node yet,
    and a file written there would never be read by the daemon or the
    library.  Readers (``mokka ctl status``) refuse the same way, so "no
    overrides" is only ever said of a node that could have some.
    """
    if not path.parent.is_dir():
        raise MokkaError(
            f"{path.parent}: no such directory, expected the node's driver config directory "
            "(is the node agent running with this root?)"
        )


def update_overrides(
    path: Path,
    change: Callable[[dict[str, Any]], dict[str, Any] | None],
    *,
    root: Path | None = None,
    store: Callable[[str], None] | None = None,
) -> Overrides:
    """Read-modify-write under the lock; ``change`` edits the document or returns a new one.

    The whole result is validated before anything is written (``SpecError``
    leaves the file as it was).  No update is lost to a concurrent writer.
    ``root``: the node root the file lies beneath (see the module docstring);
    ``store`` writes the new text instead of ``write_overrides`` (``mokka ctl``
    passes ``Host``'s converge, which records the file before creating it).

    A missing config directory is a ``MokkaError`` (``require_config_dir``).
    """
    require_config_dir(path)
    with locked(path, root=root):
        current = load_overrides(path, root=root) or Overrides(source=str(path))
        doc = current.to_mapping()
        result = change(doc)
        doc = doc if result is None else result
        new = Overrides.from_mapping(doc, source=str(path))
        if store is None:
            write_overrides(path, new)
        else:
            store(render(new))
        return new


def _lstat_beneath(path: Path, root: Path | None) -> os.stat_result:
    """``lstat`` of ``path``, reached without following links beneath ``root`` (if given)."""
    dir_fd, name = open_parent(path, root)
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    finally:
        if dir_fd is not None:
            os.close(dir_fd)


def _unlink_beneath(path: Path, root: Path | None) -> bool:
    """Remove the entry at ``path`` (a link itself, never its target); ``False`` if absent."""
    try:
        dir_fd, name = open_parent(path, root)
    except FileNotFoundError:
        return False
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return False
    finally:
        if dir_fd is not None:
            os.close(dir_fd)


def reset_file(path: Path, *, root: Path | None = None) -> bool:
    """Remove the runtime content (the file and its lock file); ``True`` if there was a file.

    The daemon calls this at start: a pod restart resets runtime state, as a
    driver reload resets a real GPU's.  A missing directory is fine (nothing
    to reset yet).  ``root``: the node root the file lies beneath; no link
    on the way is followed (a directory swapped for one is an ``OSError``).
    A lock held for longer than ``RESET_LOCK_TIMEOUT`` is not waited for.
    """
    if not path.parent.is_dir():
        return False
    lpath = lock_path(path)
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(_lstat_beneath(lpath, root).st_mode):
            # Not a lock Mokka made (a planted symlink, say): it goes, unfollowed,
            # like any runtime state, and a real lock file takes its place.
            _unlink_beneath(lpath, root)
    with locked(path, timeout=RESET_LOCK_TIMEOUT, root=root):
        removed = _unlink_beneath(path, root)
        # unlink the lock while holding it: waiters notice and re-open (see ``locked``)
        _unlink_beneath(lpath, root)
    if removed:
        logger.info("reset runtime overrides %s", path)
    return removed
