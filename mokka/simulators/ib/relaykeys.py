"""The relay's fabric keys: the file every daemon of a fabric shares.

The fabric's daemons share one secret key (the file
``--ib-relay-key-file``, a Kubernetes Secret on a cluster; ``docs/ib.md``
says how it is provisioned and rotated).  A second key may stand beside the
first while it is rotated; the first signs what this daemon dials.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mokka.errors import SpecError

#: The key file: 1 to ``MAX_KEYS`` keys, one a line, each at least
#: ``MIN_KEY`` bytes (256 bits of a hex or alphanumeric secret).
MIN_KEY = 32
MAX_KEYS = 4
_MAX_KEY_FILE = 4096


def load_keys(path: Path | None) -> tuple[bytes, ...]:
    """The fabric keys in ``path``, first the one that signs what this daemon dials.

    Several keys (one a line) let a key be rotated without a gap: an accepted
    hello may verify under any of them.  Read without blocking (a FIFO at the
    path cannot stall the relay) and never logged; ``SpecError`` with one line
    naming the flag, the file and what was expected.
    """
    expected = (f"expected 1 to {MAX_KEYS} shared keys of at least {MIN_KEY} bytes, "
                "one a line (the fabric's relay key)")
    if path is None:
        raise SpecError(f"--ib-relay-key-file: not given, {expected}: the relay takes no "
                        "peer it cannot authenticate")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SpecError(f"--ib-relay-key-file: {path}: cannot open it ({exc.strerror}), "
                        f"{expected}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SpecError(f"--ib-relay-key-file: {path}: not a regular file, {expected}")
        data = os.read(fd, _MAX_KEY_FILE + 1)
    except OSError as exc:
        raise SpecError(f"--ib-relay-key-file: {path}: cannot read it ({exc.strerror}), "
                        f"{expected}") from None
    finally:
        os.close(fd)
    keys = tuple(line.strip() for line in data.splitlines() if line.strip())
    if len(data) > _MAX_KEY_FILE or not 1 <= len(keys) <= MAX_KEYS or any(
        len(key) < MIN_KEY for key in keys
    ):
        found = (f"over {_MAX_KEY_FILE} bytes" if len(data) > _MAX_KEY_FILE else
                 f"{len(keys)} key(s) of {', '.join(str(len(k)) for k in keys) or 'no'} bytes")
        raise SpecError(f"--ib-relay-key-file: {path}: {found}, {expected}")
    return keys
