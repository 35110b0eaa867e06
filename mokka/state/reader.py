"""The one way an input document gets from disk into Python: bounded, refusing, quick.

Every input the daemon or ``mokka ctl`` reads (the profile, the topology
document, the overrides file, the engine config ``mokka ctl`` checks GPU
targets against) comes through here, because each of them can be hostile:
a ConfigMap anyone with edit rights on it can change, a file a local user
can replace.  Nothing in such a file may stop the daemon, so:

* **Regular files only.**  The path is ``stat``-ed before it is opened and
  anything else (a FIFO, which blocks ``open`` forever; ``/dev/zero``,
  which never ends; a socket, a directory) is refused with a message naming
  the file and what it should have been, without opening it (opening some
  devices does something).  The open itself is ``O_NONBLOCK`` and the
  descriptor is checked again with ``fstat``, so a FIFO swapped in between
  the two still cannot block.
* **No symlinks where the path is ours** (``root``): a file under the node
  root is reached from the root one directory at a time with ``O_NOFOLLOW``
  (``open_parent``), so a planted link, in the file's place or a
  directory's, cannot make the daemon read (and quote in an error, served
  by ``/readyz``) a file outside the root.  Paths an operator names
  (``--profile``) are followed: a ConfigMap volume is a chain of symlinks.
* **A size limit**, ``MAX_INPUT_BYTES``: the largest built-in profile is
  about 8 KiB, so 4 MiB is generous for any real node and still bounded.
* **An expansion budget**, ``MAX_NODES``: YAML aliases let 342 bytes stand
  for a billion values ("billion laughs").  PyYAML builds such a document
  cheaply (an alias is the same Python object again), but every later walk
  (the checks, the merge, the content hash) visits each value once per
  path to it.  ``load_yaml`` measures the document in one pass that visits
  each container once, and refuses a document whose expanded size (every
  value counted once per place it appears) exceeds the budget.

* **A file at rest.**  A writer that rewrites a file in place truncates it
  first and writes after: read in between, the file is empty or a prefix,
  often valid YAML all the same (fewer GPUs, a shorter list).  A read
  whose file changed under it (inode, size or mtime differ before and
  after) is made again, and a file modified within ``READ_SETTLE`` is read
  twice, ``READ_SETTLE`` apart, the second read being the one kept; a file
  that keeps changing is refused after ``READ_TRIES`` reads (its writer's
  next change notice reads it again).  A rename over the file (an editor's
  save, a ConfigMap update, ``mokka ctl``) is never caught half way.

A read that still takes long (a hung network filesystem) runs in a worker
thread the caller may abandon: ``FileSource`` offloads with
``abandon_on_cancel``, so SIGTERM never waits for it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mokka.errors import SpecError

#: Largest input file read, in bytes.  Real profiles are a few KiB; a file
#: this size is a mistake (a wrong path, a pasted archive) or an attack.
MAX_INPUT_BYTES = 4 * 1024 * 1024
#: Largest document, counted after alias expansion: every mapping, list and
#: scalar once per place it appears (a mapping key counts too).  The largest
#: built-in profile has about 1,100; a 256-GPU profile that repeats every
#: device field (some 500 values) for each GPU about 130,000.  Nine levels of
#: nested aliases, nine each, have 387 million.
MAX_NODES = 250_000
#: Deepest nesting of mappings and lists a document may have.  Profiles are
#: about six levels deep; the parsers, the merge and the content hash all
#: recurse, so a deeper document (a pasted blob, a generator gone wrong) is
#: refused here with a message instead of ending in a ``RecursionError``.
MAX_DEPTH = 64
#: Seconds a file modified this recently is given to settle before it is
#: read again (see the module docstring): an in-place write of an input is
#: a few ``write`` calls, well inside it.
READ_SETTLE = 0.02
#: Reads of a file that keeps changing before it is refused.
READ_TRIES = 5
#: Longest piece of input quoted in a message: enough to recognise the
#: mistake, never a payload (messages reach logs and the ``/readyz`` body).
MAX_EXCERPT = 80


def excerpt(text: str, limit: int = MAX_EXCERPT) -> str:
    """``text`` cut to ``limit`` characters (ending in ``...`` when cut)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- files ---------------------------------------------------------------


def open_parent(path: Path, root: Path | None) -> tuple[int | None, str]:
    """``(dir_fd, name)`` for opening ``path`` without following any link beneath ``root``.

    With a ``root``, every directory from ``root`` down to ``path``'s own is
    opened with ``O_NOFOLLOW``: a directory swapped for a symlink after the
    path was resolved (``Host.resolve``) fails with ``ELOOP`` or ``ENOTDIR``
    instead of leading outside the root.  The caller opens, stats or unlinks
    ``name`` relative to ``dir_fd`` (with ``O_NOFOLLOW`` or its equivalent)
    and closes ``dir_fd``.  Without a root, ``(None, str(path))``: the path
    as given, which ``os`` functions take the same way.  A path not beneath
    ``root`` raises ``ValueError`` (a caller's mistake, not the input's).
    """
    if root is None:
        return None, str(path)
    parts = Path(path).relative_to(root).parts
    if not parts:
        raise ValueError(f"{path}: the node root itself, expected a file beneath it")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                dir_fd=fd)
            except OSError as exc:
                # O_DIRECTORY makes a link ENOTDIR rather than ELOOP: say which it is
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise OSError(errno.ELOOP, f"{part}, a directory on the way, is a symbolic link "
                              "or not a directory (no link is followed beneath the node root)",
                              str(path)) from None
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def read_input(
    path: Path, what: str, *, optional: bool = False, root: Path | None = None
) -> str | None:
    """The UTF-8 text of the input file at ``path``; see the module docstring.

    ``what`` names the input in messages (``the profile``, ``the overrides
    file``).  ``optional``: a missing file gives ``None`` (the topology
    document and the overrides file may be absent); otherwise it is a
    ``SpecError`` like every other refusal, each naming the file.  ``root``:
    the path is ours, beneath that node root, and no symlink from the root
    down to the file itself is followed (``open_parent``).
    """
    settled = False  # the last read was of a file just modified: it has had its settle
    for _ in range(READ_TRIES):
        read = _read_once(path, what, optional=optional, root=root)
        if read is None:
            return None
        before, after, data = read
        if before == after:
            if settled or not _modified_within(after, READ_SETTLE):
                return _decode(path, what, data)
            settled = True
        else:
            settled = False  # written during the read: read it whole again
        _settle()
    raise SpecError(f"{path}: changed while being read ({READ_TRIES} tries), expected {what} "
                    "at rest (it is read again at its next change)")


def _settle() -> None:
    """Give a file being written ``READ_SETTLE`` seconds (a worker thread's wait)."""
    time.sleep(READ_SETTLE)


def _modified_within(key: tuple[int, ...], seconds: float) -> bool:
    return time.time_ns() - key[2] < seconds * 1e9


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """What a write or a rename over the file changes: inode, size, mtime, ctime."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read_once(
    path: Path, what: str, *, optional: bool, root: Path | None
) -> tuple[tuple[int, ...], tuple[int, ...], bytes] | None:
    """(identity before, identity after, bytes) of one bounded read; ``None``: no file."""
    nofollow = root is not None
    dir_fd: int | None = None
    try:
        dir_fd, name = open_parent(path, root)
        # Refuse what is not a regular file before opening it at all.
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=not nofollow)
        _check_regular(path, what, st, nofollow=nofollow)
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        fd = os.open(name, flags | (os.O_NOFOLLOW if nofollow else 0), dir_fd=dir_fd)
    except FileNotFoundError:
        if optional:
            return None
        raise SpecError(f"{path}: no such file, expected {what}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and nofollow:
            raise _symlink_error(path, what) from None
        raise SpecError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    try:
        # Again on the descriptor: the path may have been swapped since the stat.
        st = os.fstat(fd)
        _check_regular(path, what, st, nofollow=nofollow)
        _check_size(path, what, st.st_size)
        chunks: list[bytes] = []
        total = 0
        # Read one byte past the limit: a file that grows (or a /proc file
        # whose size says 0) is caught by what was read, not by what fstat said.
        while total <= MAX_INPUT_BYTES:
            chunk = os.read(fd, MAX_INPUT_BYTES + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        _check_size(path, what, total)
        after = os.fstat(fd)
    except OSError as exc:
        raise SpecError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return _identity(st), _identity(after), b"".join(chunks)


def _decode(path: Path, what: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{path}: byte {exc.start} is not UTF-8, expected {what} as UTF-8 text"
        ) from None


def _check_regular(path: Path, what: str, st: os.stat_result, *, nofollow: bool) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISLNK(st.st_mode) and nofollow:
        raise _symlink_error(path, what)
    raise SpecError(f"{path}: {_kind(st.st_mode)}, expected {what} as a regular file")


def _symlink_error(path: Path, what: str) -> SpecError:
    # Also when a directory on the way is the link: ``open_parent`` says ELOOP then.
    return SpecError(f"{path}: a symbolic link, expected {what} as a regular file "
                     "(no link is followed beneath the node root)")


def _check_size(path: Path, what: str, size: int) -> None:
    if size > MAX_INPUT_BYTES:
        raise SpecError(
            f"{path}: larger than {MAX_INPUT_BYTES} bytes, expected {what} of at most "
            f"{MAX_INPUT_BYTES // (1024 * 1024)} MiB"
        )


def _kind(mode: int) -> str:
    """What a non-regular file is, in the words ``ls -l`` users know."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


# ---- YAML ----------------------------------------------------------------


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML (safe, no base-60); syntax errors become ``SpecError`` naming line and column.

    Only the first problem is reported: after a syntax error the parser
    cannot know what the rest of the document was meant to be.  Lines and
    columns are one-based, as editors number them (PyYAML counts from zero).

    Scalars the constructor cannot convert (``2024-13-45`` looks like a
    date, ``!!int abc``, an integer of more than 4300 digits, ``!!float _``,
    ``!!bool ""``) raise plain ``ValueError``s, ``IndexError``s or
    ``KeyError``s inside PyYAML, not ``YAMLError``s; they are input errors
    all the same.  So is a recursive alias (``&a [*a]``), nesting
    deeper than ``MAX_DEPTH`` or a document that expands past ``MAX_NODES``:
    every reader of the result recurses.  PyYAML's own words are cut to
    ``MAX_EXCERPT``: some of them quote the input (an undefined alias's name).
    """
    if len(text) > MAX_INPUT_BYTES:
        # Text that did not come through ``read_input`` (a ``ctl set`` value)
        raise SpecError(f"{source}: larger than {MAX_INPUT_BYTES} characters, expected YAML "
                        f"of at most {MAX_INPUT_BYTES // (1024 * 1024)} MiB")
    # imported here: a process that reads only JSON never loads PyYAML (module docstring)
    import yaml

    from mokka.state.yaml_loader import Loader

    try:
        doc = yaml.load(text, Loader=Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"{source}: {where}not valid YAML ({excerpt(problem)})") from None
    except (ValueError, TypeError, AttributeError, OverflowError, RecursionError,
            LookupError) as exc:
        # No mark here: the constructor raised outside PyYAML's error type.
        raise SpecError(
            f"{source}: not valid YAML (a value cannot be read: {excerpt(str(exc))})"
        ) from None
    problem = shape_problem(doc)
    if problem is not None:
        raise SpecError(f"{source}: {problem}")
    return doc


# ---- JSON ----------------------------------------------------------------

#: Blank lines and whole-line comments before a document (a file's header).
_LEADING_COMMENTS = re.compile(r"(?:[ \t]*(?:#[^\n]*)?\n)*")
#: Text YAML reads otherwise than JSON, or refuses: a control character but
#: tab and line breaks; an escaped surrogate (JSON joins a pair into one
#: character, YAML reads two).  Non-ASCII text is left to YAML altogether:
#: YAML refuses some characters JSON takes (C1 controls, U+FFFE).
_NOT_READ_ALIKE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\\u[dD][89a-fA-F]")
#: A JSON number with a fraction that YAML reads as a float too: YAML 1.1
#: wants a dot and a signed exponent (``1e5``, ``1.5e3`` are strings there).
_YAML_FLOAT = re.compile(r"-?[0-9]+\.[0-9]*(?:[eE][-+][0-9]+)?")


class _ReadOtherwise(Exception):
    """YAML would read this JSON text to a different value: read it as YAML."""


def _yaml_float(text: str) -> float:
    if not _YAML_FLOAT.fullmatch(text):
        raise _ReadOtherwise
    return float(text)


def _yaml_constant(name: str) -> Any:
    raise _ReadOtherwise  # ``NaN``, ``Infinity``: words YAML reads as strings


def json_reading(text: str) -> Any:
    """The value of ``text`` read as a JSON object, when YAML would read the same; else ``None``.

    YAML 1.2 reads a JSON text to the same value, and Mokka's YAML reading
    (``load_yaml``) agrees with it but where this declines: fractions
    without a dot or a signed exponent, ``NaN``/``Infinity``, escaped
    surrogates, control characters, non-ASCII text.  Leading blank lines
    and ``#`` comment lines are skipped, so a JSON document under a comment
    header (the overrides file Mokka writes) is read here too.  A text JSON
    refuses, or nests deeper than its parser goes, is ``None``: the YAML
    reading then reports it.
    """
    # imported here: the profile and topology readers never read JSON
    import json

    body = text[_LEADING_COMMENTS.match(text).end():]  # type: ignore[union-attr]
    if not body.startswith("{") or not body.isascii() or _NOT_READ_ALIKE.search(body):
        return None
    try:
        return json.loads(body, parse_float=_yaml_float, parse_constant=_yaml_constant)
    except (_ReadOtherwise, ValueError, RecursionError):
        return None


def load_json_or_yaml(text: str, source: str) -> Any:
    """``load_yaml``'s value for ``text``, read as JSON when JSON reads it the same.

    The standard library's JSON parser is much cheaper to load and to run
    than PyYAML: a reader that meets only JSON text (``mokka ctl`` reading
    the overrides file it writes) never imports PyYAML.  The result passes
    the same bounds as YAML's (``shape_problem``).
    """
    if len(text) <= MAX_INPUT_BYTES:
        doc = json_reading(text)
        if doc is not None:
            problem = shape_problem(doc)
            if problem is not None:
                raise SpecError(f"{source}: {problem}")
            return doc
    return load_yaml(text, source)


def _children(value: Any) -> list[Any]:
    return list(value.values()) if isinstance(value, Mapping) else list(value)


def shape_problem(doc: Any) -> str | None:
    """Why ``doc`` cannot be walked recursively (a cycle, too deep, too big), or ``None``.

    One depth-first pass that measures each container once, however many
    aliases lead to it: its expanded size and its height (the nesting below
    it) are remembered by identity, so a container met again adds its
    remembered figures instead of being walked again.  The time is linear
    in what the YAML text spells out, not in what it expands to.

    Iterative on purpose: the point is to find what would blow the stack.
    A container met again on the current path is a recursive alias; the
    same container reached along different paths (a plain ``*alias``) is fine.
    """
    if not isinstance(doc, Mapping | list):
        return None
    # id -> (expanded size, height) of every container measured so far
    measured: dict[int, tuple[int, int]] = {}
    on_path: set[int] = set()
    # frames: [container, its children, next child, size so far, height so far]
    stack: list[list[Any]] = [[doc, _children(doc), 0, 1 + _keys(doc), 0]]
    on_path.add(id(doc))
    while stack:
        frame = stack[-1]
        container, children, position = frame[0], frame[1], frame[2]
        if position == len(children):
            stack.pop()
            on_path.discard(id(container))
            measured[id(container)] = (frame[3], frame[4])
            if stack:
                stack[-1][3] += frame[3]
                stack[-1][4] = max(stack[-1][4], frame[4] + 1)
            continue
        frame[2] = position + 1
        child = children[position]
        if not isinstance(child, Mapping | list):
            frame[3] += 1
        elif id(child) in on_path:
            return "a recursive alias (an anchor used inside itself), expected plain data"
        elif id(child) in measured:
            size, height = measured[id(child)]
            if len(stack) + height >= MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels, expected plain data"
            frame[3] += size
            frame[4] = max(frame[4], height + 1)
        elif len(stack) >= MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels, expected plain data"
        else:
            on_path.add(id(child))
            stack.append([child, _children(child), 0, 1 + _keys(child), 0])
            continue
        if frame[3] > MAX_NODES:
            return _too_big()
    if measured[id(doc)][0] > MAX_NODES:
        return _too_big()
    return None


def _keys(value: Any) -> int:
    return len(value) if isinstance(value, Mapping) else 0


def _too_big() -> str:
    return (f"more than {MAX_NODES} values once its aliases are expanded, expected a "
            "document of at most that size (nested aliases multiply: a few lines can "
            "stand for billions of values)")
