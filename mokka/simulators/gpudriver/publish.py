"""Publishing the driver tree at ``/run/nvidia/driver`` (Apply; SURFACES Decision 5).

The GPU Operator's validator and anything configured for a containerised
driver look for the driver at ``/run/nvidia/driver``.  Two ways to put it
there:

* **bind**: ``mount --bind <root>/var/lib/nvml-mock/driver
  <root>/run/nvidia/driver``.  What a real driver container does; the chart
  gives that volume ``mountPropagation: Bidirectional`` so the mount reaches
  the host.  Needs CAP_SYS_ADMIN.
* **symlink**: a relative symlink ``run/nvidia/driver →
  ../../var/lib/nvml-mock/driver``, replaced atomically.  Works anywhere,
  also in a test or local root.

Everything goes through ``Host``: the mountpoint directory or the symlink is
converged under the owner ``gpudriver-publish``, so the manifest records it
(its kind tells a fresh process which mode was in force), and ``mount`` /
``umount`` run through ``Host.run``.  Revoke therefore works after a crash:
the mountpoint is in the manifest and ``/proc/self/mountinfo`` says whether
something is still mounted on it.

All functions here block; the simulator calls them in one thread hop.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path, PurePosixPath

from mokka import layout
from mokka.errors import ApplyError
from mokka.noderoot import MOUNTINFO as NODE_MOUNTINFO
from mokka.noderoot import Directory, Host, Symlink, mounted_on

logger = logging.getLogger(__name__)

#: Manifest owner of the published entry (mountpoint or symlink).
OWNER = "gpudriver-publish"
#: Roots that are a real host's filesystem: the DaemonSet's ``/host`` mount,
#: or ``/`` for a daemon running directly on the node.
REAL_HOST_ROOTS = (Path("/"), Path("/host"))
#: CAP_SYS_ADMIN's bit in the capability sets (linux/capability.h).
_CAP_SYS_ADMIN = 21


def has_cap_sys_admin(status_path: Path = Path("/proc/self/status")) -> bool:
    """Whether this process holds CAP_SYS_ADMIN in its effective set."""
    try:
        for line in status_path.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> _CAP_SYS_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        logger.warning("cannot read capabilities from %s; assuming no CAP_SYS_ADMIN", status_path)
    return False


def resolve_mode(requested: str, root: Path, can_mount: bool) -> str:
    """The publish mode in force: ``bind`` or ``symlink``.

    ``auto`` binds only against a real host root with CAP_SYS_ADMIN: a bind
    mount inside a scratch root (tests, a laptop) would hide nothing useful
    and fail without privileges, while a symlink there serves the same
    paths.
    """
    if requested != "auto":
        return requested
    return "bind" if can_mount and root in REAL_HOST_ROOTS else "symlink"


def symlink_target() -> str:
    """The relative target from ``/run/nvidia`` to the driver root."""
    parent = PurePosixPath(layout.RUN_DRIVER).parent
    return os.path.relpath(layout.DRIVER_ROOT, parent)


#: This process's mount table.
MOUNTINFO = NODE_MOUNTINFO


def is_mountpoint(path: Path, mountinfo: Path = MOUNTINFO) -> bool:
    """Whether something is mounted on ``path`` in this mount namespace (``fsops.mounted_on``)."""
    try:
        return mounted_on(path, mountinfo)
    except OSError as exc:
        raise ApplyError(f"cannot read the mount table {mountinfo}: {exc}") from exc


def published_kind(host: Host) -> str | None:
    """What this node currently publishes, from the manifest: ``bind``, ``symlink`` or None."""
    kind = host.owned(OWNER).get(layout.RUN_DRIVER)
    return {"dir": "bind", "symlink": "symlink"}.get(kind or "")


def _check_unclaimed(host: Host) -> None:
    """Refuse to publish over a ``/run/nvidia/driver`` someone else made.

    A real driver container, or another tool, may own it; mounting over it
    or replacing it would hide that driver from the node.
    """
    if host.exists(layout.RUN_DRIVER) and layout.RUN_DRIVER not in host.owned(OWNER):
        raise ApplyError(
            f"{host.resolve(layout.RUN_DRIVER)} exists and was not created by Mokka "
            "(a real or containerised driver?); refusing to publish over it"
        )


def publish(host: Host, mode: str) -> str:
    """Publish the driver tree in ``mode`` (``bind`` or ``symlink``); idempotent.

    Switching modes first withdraws the old publication.  Returns a short
    description for logs and readiness.
    """
    if not host.exists(layout.DRIVER_ROOT):
        raise ApplyError(
            f"{host.resolve(layout.DRIVER_ROOT)} does not exist: nothing staged to publish"
        )
    current = published_kind(host)
    if current is not None and current != mode:
        logger.info("switching the driver publication from %s to %s", current, mode)
        withdraw(host)
    _check_unclaimed(host)
    if mode == "symlink":
        report = host.converge(OWNER, [Symlink(layout.RUN_DRIVER, symlink_target())])
        if report.changed:
            logger.info("linked %s -> %s", layout.RUN_DRIVER, symlink_target())
        return f"symlink {layout.RUN_DRIVER} -> {symlink_target()}"
    host.converge(OWNER, [Directory(layout.RUN_DRIVER)])
    target = host.resolve(layout.RUN_DRIVER, follow_last=True)
    # The mount lives in the mount table, not in the node's files: a repair
    # pass must look again once someone unmounts it.
    host.depends_on(MOUNTINFO)
    if not is_mountpoint(target):
        source = host.resolve(layout.DRIVER_ROOT, follow_last=True)
        result = host.run(["mount", "--bind", str(source), str(target)])
        if result.returncode != 0:
            raise ApplyError(
                f"mount --bind {source} {target} failed (exit {result.returncode}): "
                f"{result.stderr.strip()}"
            )
        logger.info("bind-mounted %s on %s", source, target)
    return f"bind mount on {layout.RUN_DRIVER}"


def _unmount(host: Host, target: Path) -> None:
    """``umount`` the mountpoint; lazily when a process still holds it open."""
    result = host.run(["umount", str(target)])
    if result.returncode == 0:
        return
    if "busy" in result.stderr.lower():
        logger.warning("%s is busy; detaching it lazily", target)
        result = host.run(["umount", "--lazy", str(target)])
        if result.returncode == 0:
            return
    raise ApplyError(
        f"umount {target} failed (exit {result.returncode}): {result.stderr.strip()}"
    )


def withdraw(host: Host) -> None:
    """Undo ``publish``: unmount if a mount of ours is there, then remove the entry.

    Works from a fresh process: the manifest says the mountpoint is ours,
    the mount table says whether it is still mounted.
    """
    if published_kind(host) == "bind":
        target = host.resolve(layout.RUN_DRIVER, follow_last=True)
        # A mount stacked twice (two applies racing in different processes)
        # needs as many unmounts; the bound keeps a broken table from looping.
        for _ in range(8):
            if not is_mountpoint(target):
                break
            _unmount(host, target)
        else:
            raise ApplyError(f"{target} is still mounted after 8 unmounts")
    host.discard(OWNER)
