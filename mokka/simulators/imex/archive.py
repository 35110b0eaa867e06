"""The pinned IMEX archive: finding it, verifying it, downloading it, unpacking it.

``nvidia-imex`` and ``nvidia-imex-ctl`` are NVIDIA's binaries; Mokka does not
ship them.  They come from NVIDIA's redistributable archive
(``nvidia-imex-linux-<arch>-<version>-archive.tar.xz``, which keeps them in
``<top>/bin/``), from one of two places:

* a directory (``--imex-archive-dir``) holding the **archive file itself**,
  as the chart's ``imex.binaries.image`` copies it into a shared volume.  The
  archive, not unpacked binaries, so that the same sha256 pin covers both
  delivery paths;
* a download (``--imex-archive-url``) while the ``IMEXDownload`` feature gate
  is on.

Either way the archive's sha256 must equal ``--imex-archive-sha256`` before
anything is unpacked or installed; without a pin nothing is installed at all.
Only the two regular-file members named ``nvidia-imex`` and
``nvidia-imex-ctl`` are read (by name, into memory): member paths from the
archive never reach the filesystem.

Every function here blocks; the simulator runs them in a worker thread.
"""

from __future__ import annotations

import hashlib
import io
import logging
from pathlib import Path

import attrs

from mokka.errors import StageError

logger = logging.getLogger(__name__)

#: Binaries taken from the archive, by file name.
IMEX = "nvidia-imex"
IMEX_CTL = "nvidia-imex-ctl"
#: File name endings recognised as an archive in ``--imex-archive-dir``.
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.xz", ".txz")


class ArchiveError(StageError):
    """An archive is present but unusable: wrong checksum, unreadable, or missing a binary.

    A ``StageError`` (retried), not a ``SpecError``: a corrupted download or
    a volume still being filled can heal without a new desired state.
    """


@attrs.frozen
class ImexBinaries:
    """The two binaries, read from a verified archive."""

    imex: bytes = attrs.field(repr=False)
    imex_ctl: bytes = attrs.field(repr=False)
    #: where the archive came from (path or URL), for logs and readiness
    origin: str
    sha256: str


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def find_in_dir(directory: Path, name: str | None) -> Path | None:
    """The archive in ``directory``: the file called ``name`` when given, else the only archive.

    ``None`` when the directory (or the named file) does not exist or holds no
    archive; more than one candidate without a name is an ``ArchiveError``
    (guessing which one is meant could install the wrong version).
    """
    if not directory.is_dir():
        return None
    if name is not None:
        candidate = directory / name
        return candidate if candidate.is_file() else None
    found = sorted(
        p for p in directory.iterdir() if p.is_file() and p.name.endswith(ARCHIVE_SUFFIXES)
    )
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ArchiveError(
            f"{directory}: several IMEX archives ({names}), expected one, or "
            "--imex-archive-url naming which one to use"
        )
    return found[0] if found else None


def read_verified(path: Path, expected_sha256: str, *, max_bytes: int) -> bytes:
    """The archive's bytes, after checking their sha256 against the pin."""
    size = path.stat().st_size
    if size > max_bytes:
        raise ArchiveError(
            f"{path}: {size} bytes, expected at most {max_bytes} for an IMEX archive"
        )
    data = path.read_bytes()
    verify(data, expected_sha256, str(path))
    return data


def verify(data: bytes, expected_sha256: str, origin: str) -> None:
    actual = sha256_of(data)
    if actual != expected_sha256:
        raise ArchiveError(
            f"{origin}: sha256 {actual}, expected {expected_sha256} (--imex-archive-sha256); "
            "nothing was installed"
        )


def download(url: str, expected_sha256: str, *, timeout: float, max_bytes: int) -> bytes:
    """Fetch ``url`` into memory and verify it; raises ``ArchiveError`` on any failure.

    The whole archive is held in memory until verified, so nothing unverified
    is ever written under the node root and a killed download leaves nothing
    behind.  ``max_bytes`` bounds the memory a wrong URL can take.
    """
    # imported here: urllib.request brings http.client and email, and only a
    # node with the IMEXDownload gate on and an empty cache ever downloads
    import urllib.error
    import urllib.request

    logger.info("downloading IMEX archive %s", url)
    request = urllib.request.Request(url, headers={"User-Agent": "mokka"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            buffer = io.BytesIO()
            while chunk := response.read(1 << 20):
                buffer.write(chunk)
                if buffer.tell() > max_bytes:
                    raise ArchiveError(
                        f"{url}: larger than {max_bytes} bytes, expected an IMEX archive"
                    )
    except (urllib.error.URLError, OSError, ValueError) as exc:
        if isinstance(exc, urllib.error.HTTPError):
            exc.close()  # it holds the response's socket
        raise ArchiveError(f"{url}: download failed: {exc}") from exc
    data = buffer.getvalue()
    verify(data, expected_sha256, url)
    return data


def unpack(data: bytes, origin: str) -> ImexBinaries:
    """Read ``nvidia-imex`` and ``nvidia-imex-ctl`` out of a verified archive.

    Members are matched by their last path component and must be regular
    files, exactly one of each name, wherever the archive keeps them.
    """
    import tarfile  # only a node given an archive unpacks one

    found: dict[str, list[tarfile.TarInfo]] = {IMEX: [], IMEX_CTL: []}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            for member in archive:
                base = member.name.rstrip("/").rsplit("/", 1)[-1]
                if base in found and member.isreg():
                    found[base].append(member)
            for name, members in found.items():
                if len(members) != 1:
                    raise ArchiveError(
                        f"{origin}: {len(members)} regular files named {name!r}, "
                        "expected exactly one in the IMEX archive"
                    )
            contents = {}
            for name, (member,) in found.items():
                stream = archive.extractfile(member)
                assert stream is not None  # isreg() above
                contents[name] = stream.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveError(f"{origin}: not a readable tar.gz/tar.xz archive: {exc}") from exc
    return ImexBinaries(contents[IMEX], contents[IMEX_CTL], origin, sha256_of(data))
