"""containerd's runtime setup: drop-in, NRI, restart (SURFACES §6.2).

The procedure, once the toolkit is installed (``toolkit.py``):

1. Run the *installed* ``nvidia-ctk runtime configure`` against the host's
   files.  It writes the runtime part of our drop-in
   (``<configDir>/50-mokka.toml``: the ``nvidia`` runtime as default, its
   ``BinaryName``, ``enable_cdi``) and adds an ``imports`` glob for the
   drop-in directory to containerd's main config.  It runs through the
   ``host_exec`` prefix (``chroot <root>`` by default), so every path it
   reads, writes and *records* is a host path: the ``imports`` line must
   say ``/etc/containerd/conf.d/*.toml`` on the host, never
   ``/host/etc/...``.
2. With NRI on, add ``[plugins."io.containerd.nri.v1.nri"]`` (enabled,
   with its socket) to the same drop-in; containerd 1.7 ships NRI off.
   Then lay every plugin table of the drop-in over the main config's table
   of the same plugin (``merge_plugins``): before containerd 2.1 an imported
   table replaces the main config's whole table, so a drop-in carrying only
   our keys would drop the node's own CRI settings.  The result is written
   back as TOML (``tomlwriter``).
3. Restart containerd through the host's systemd when the drop-in's
   content changed, and once at daemon start; never on an unchanged
   reconcile.  ``restartMode: none`` only logs that a restart is pending.

The drop-in belongs to the manifest owner ``cri-runtime``: it is claimed
(written with a placeholder) *before* ``nvidia-ctk`` overwrites it, so the
manifest records it as ours and revoke removes it instead of mistaking
``nvidia-ctk``'s output for a file someone else left there.  The
``imports`` line in the main config stays after revoke: it names a
directory glob, harmless once our file is gone, and other drop-ins may
rely on it.

Leave-alone cases (the node stays as it is, the simulator stays ready and
says why): no containerd binary on the host's PATH (CRI-O, k3s/rke2 with
an embedded containerd), or a toolkit file at a package path that we did
not create (another installer prepared the node).
"""

from __future__ import annotations

import logging
import subprocess
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mokka.errors import CommandError, HostPathError
from mokka.host import File, Host
from mokka.simulators.base import Readiness
from mokka.simulators.cri import tomlwriter, toolkit
from mokka.simulators.cri.settings import CriSettings

logger = logging.getLogger(__name__)

#: Manifest owner of the drop-in.
OWNER = "cri-runtime"
#: Where containerd is looked for under the node root (the host's PATH
#: directories a distribution or an installer puts it in).
CONTAINERD_PATHS = ("/usr/bin/containerd", "/usr/local/bin/containerd", "/usr/sbin/containerd")
#: The runtime name containerd gets, and the default it becomes.
RUNTIME_NAME = "nvidia"
#: Written before ``nvidia-ctk`` runs, so the manifest owns the path (see above).
PLACEHOLDER = b"# mokka: nvidia-ctk is writing this drop-in\n"

#: The CRI plugin's name in containerd's config version 2 (1.x) and 3 (2.x);
#: ``nvidia-ctk`` picks the one the main config's version calls for.
_CRI_PLUGINS = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")
_NRI = "io.containerd.nri.v1.nri"


#: Says who wrote the drop-in and why it repeats the main config's settings.
DROPIN_HEADER = (
    "# Written by mokka (cri simulator): nvidia-ctk's runtime settings over this node's\n"
    "# own plugin settings from the main config (before containerd 2.1 an imported\n"
    "# plugin table replaces the main config's whole table), plus NRI.  Removed at teardown.\n"
)


def nri_settings(socket_path: str) -> dict[str, Any]:
    """The NRI plugin table: enabled, on ``socket_path``."""
    return {"disable": False, "socket_path": socket_path}


def merge_plugins(main: Mapping[str, Any], dropin: dict[str, Any]) -> dict[str, Any]:
    """The drop-in with each of its plugin tables laid over the main config's.

    Before containerd 2.1 a plugin table in an imported file *replaces* the
    main config's table of the same plugin: a drop-in holding only
    ``enable_cdi`` and the ``nvidia`` runtime would silently drop the node's
    own CRI settings (``SystemdCgroup``, the sandbox image, CNI directories,
    registry mirrors).  Repeating them under ours keeps the merged result
    what the node had plus what we add, whatever containerd version merges
    it.  Our keys win.
    """
    ours = dict(dropin.get("plugins", {}))
    theirs = main.get("plugins", {}) if isinstance(main.get("plugins"), Mapping) else {}
    for name, table in ours.items():
        if isinstance(table, Mapping) and isinstance(theirs.get(name), Mapping):
            ours[name] = _deep_merge(theirs[name], table)
    return {**dropin, "plugins": ours} if ours else dict(dropin)


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` laid onto ``base`` table by table; values (arrays too) replace, never append."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _has_runtime(doc: dict) -> bool:
    """Whether ``nvidia-ctk`` wrote the ``nvidia`` runtime entry (a sanity check on its output).

    Catches a toolkit that silently wrote nothing useful (wrong flags for its
    version, a config version it did not expect) before containerd is
    restarted onto it.
    """
    plugins = doc.get("plugins", {})
    return any(
        RUNTIME_NAME in plugins.get(name, {}).get("containerd", {}).get("runtimes", {})
        for name in _CRI_PLUGINS
    )


@attrs.define(eq=False)
class RuntimeSetup:
    """State of the runtime setup across reconciles (one per daemon process)."""

    settings: CriSettings
    #: The drop-in content this process last wrote; None before the first
    #: successful configure, so the first apply always runs ``nvidia-ctk``
    #: (an upgraded image may ship a toolkit that writes something else).
    _written: bytes | None = None
    #: Whether this process has had its start-up restart.
    _restarted: bool = False
    #: Why containerd is not serving after our restart, while it is not.
    _down: str | None = None
    #: The last leave-alone reason logged, so it is logged once, not per pass.
    _left_alone: str | None = None

    # ---- decisions ------------------------------------------------------

    def leave_alone_reason(self, host: Host) -> str | None:
        """Why this node's runtime must not be touched, or None."""
        if not any(host.exists(p) for p in CONTAINERD_PATHS):
            return (
                f"no containerd on the host's PATH (looked for {', '.join(CONTAINERD_PATHS)}); "
                "leaving the container runtime alone (CRI-O, or an embedded containerd like "
                "k3s/rke2): CDI specs are still published"
            )
        foreign = toolkit.foreign_files(host)
        if foreign:
            return (
                f"toolkit files not installed by mokka at {', '.join(foreign)}: another "
                "installer prepared this node's container runtime; leaving it alone"
            )
        return None

    # ---- apply ----------------------------------------------------------

    def install(self, host: Host) -> Readiness | None:
        """Install the toolkit when the runtime is to be configured (blocking).

        Returns the final readiness when there is nothing more to do (off,
        left alone, toolkit missing), None when ``configure`` should follow.
        Runs before the CDI specs are published, so the specs may name the
        installed ldcache hook.
        """
        if not self.settings.container_runtime:
            self._withdraw_stale(host)
            return Readiness.ok("container runtime setup is off (--container-runtime off)")
        reason = self.leave_alone_reason(host)
        if reason is not None:
            if reason != self._left_alone:
                logger.warning("%s", reason)
                self._left_alone = reason
            return Readiness.ok(reason)
        self._left_alone = None
        try:
            toolkit.install(host, self.settings.toolkit_dir)
        except toolkit.ToolkitUnavailable as exc:
            logger.error("cannot set up the container runtime: %s", exc)
            return Readiness.not_ready(f"cannot set up the container runtime: {exc}")
        return None

    def configure(self, host: Host) -> Readiness:
        """Write the drop-in if needed and restart containerd if it changed (blocking)."""
        dropin = self.settings.dropin
        on_disk = self._read_owned(host, dropin)
        if self._written is not None and on_disk == self._written:
            # Unchanged reconcile: no nvidia-ctk run, no restart.  Only a
            # containerd we left down is looked at again.
            if self._down is not None:
                self._check_active(host)
            return self._readiness()
        try:
            final = self._write_dropin(host, dropin)
        except (CommandError, HostPathError, OSError) as exc:
            # Not raised: the specs are published and useful without
            # containerd's runtime entry; the next reconcile tries again.
            self._written = None
            logger.error("containerd drop-in not written: %s", exc)
            return Readiness.not_ready(str(exc))
        changed = final != on_disk
        self._written = final
        if changed or not self._restarted:
            why = "drop-in changed" if changed else "daemon start"
            self._restart(host, why)
            self._restarted = True
        return self._readiness()

    def _readiness(self) -> Readiness:
        if self._down is not None:
            return Readiness.not_ready(self._down)
        if self.settings.restart_mode == "none":
            return Readiness.ok(
                f"containerd configured by {self.settings.dropin}; restart pending "
                "(--restart-mode none: restart containerd on the node to activate it)"
            )
        return Readiness.ok(f"containerd configured by {self.settings.dropin}")

    def _read_owned(self, host: Host, path: str) -> bytes | None:
        """The drop-in's bytes if it is ours (per the manifest), else None.

        A file of someone else's at our name is never taken for our last
        write: it does not count as "unchanged", so the next configure
        backs it up (converge) and writes ours.
        """
        if path not in host.owned(OWNER):
            return None
        try:
            return host.read_bytes(path)
        except (OSError, HostPathError):
            return None

    def _write_dropin(self, host: Host, dropin: str) -> bytes:
        """Claim the drop-in, let ``nvidia-ctk`` write it, add NRI, converge the result."""
        if dropin not in host.owned(OWNER):
            host.converge(OWNER, [File(dropin, PLACEHOLDER, 0o644)])
        result = self._run(host, self.ctk_argv(host))
        if result.returncode != 0:
            raise CommandError(
                f"nvidia-ctk runtime configure failed (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()}"
            )
        written = host.read_bytes(dropin)
        if written == PLACEHOLDER:
            raise CommandError(f"nvidia-ctk runtime configure did not write {dropin}")
        doc = _parse(dropin, written)
        if not _has_runtime(doc):
            raise CommandError(
                f"{dropin}: nvidia-ctk wrote no '{RUNTIME_NAME}' runtime entry; expected "
                f"[plugins.\"{_CRI_PLUGINS[0]}\".containerd.runtimes.{RUNTIME_NAME}]"
            )
        if self.settings.nri:
            doc.setdefault("plugins", {})[_NRI] = nri_settings(self.settings.nri_socket)
        doc = merge_plugins(self._main_config(host), doc)
        text = DROPIN_HEADER + tomlwriter.dumps(doc)
        final = text.encode()
        report = host.converge(OWNER, [File(dropin, final, 0o644)])
        if report.changed:
            logger.info("containerd drop-in %s written", dropin)
        return final

    def _main_config(self, host: Host) -> Mapping[str, Any]:
        """containerd's main config as parsed, or empty when absent or unreadable."""
        path = self.settings.containerd_config
        try:
            return tomllib.loads(host.read_text(path))
        except (OSError, HostPathError, UnicodeDecodeError):
            return {}
        except tomllib.TOMLDecodeError as exc:
            logger.warning("%s is not valid TOML (%s): not merging its plugin settings", path, exc)
            return {}

    def ctk_argv(self, host: Host) -> list[str]:
        """The ``nvidia-ctk runtime configure`` command, as run on the host."""
        s = self.settings
        return [
            *self._host_exec(host),
            toolkit.NVIDIA_CTK,
            "runtime",
            "configure",
            "--runtime=containerd",
            "--config-source=file",
            f"--config={s.containerd_config}",
            f"--drop-in-config={s.dropin}",
            f"--nvidia-runtime-name={RUNTIME_NAME}",
            f"--nvidia-runtime-path={toolkit.RUNTIME_BINARY}",
            "--nvidia-set-as-default",
            "--cdi.enabled",
        ]

    def _host_exec(self, host: Host) -> list[str]:
        """The ``host_exec`` prefix with ``{root}`` filled in."""
        return [part.replace("{root}", str(host.root)) for part in self.settings.host_exec]

    # ---- containerd -----------------------------------------------------

    def _restart(self, host: Host, why: str) -> None:
        """Restart containerd (blocking until systemd says it is up), then check it."""
        if self.settings.restart_mode == "none":
            logger.warning(
                "containerd restart pending (%s): --restart-mode none, restart containerd on "
                "the node to activate %s",
                why,
                self.settings.dropin,
            )
            return
        logger.info("restarting containerd (%s)", why)
        try:
            result = self._run(host, [*self.settings.systemctl, "restart", "containerd"])
        except CommandError as exc:
            self._down = f"could not restart containerd: {exc}"
            return
        if result.returncode != 0:
            logger.error("systemctl restart containerd failed: %s", result.stderr.strip())
        self._check_active(host)

    def _check_active(self, host: Host) -> None:
        """Is containerd serving?  Sets or clears the not-ready reason."""
        try:
            result = self._run(host, [*self.settings.systemctl, "is-active", "containerd"])
            state = result.stdout.strip() or result.stderr.strip()
            active = result.returncode == 0 and state == "active"
        except CommandError as exc:
            state, active = str(exc), False
        if active:
            if self._down is not None:
                logger.info("containerd is active again")
            self._down = None
            return
        self._down = (
            f"containerd did not come back after restart (systemctl is-active containerd: "
            f"{state or 'no answer'}); see `journalctl -u containerd` on the node"
        )
        logger.error("%s", self._down)

    def _run(self, host: Host, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """A host command through ``Host.run`` (tests inject a recording runner there)."""
        return host.run(list(argv), timeout=self.settings.command_timeout)

    # ---- revoke ---------------------------------------------------------

    def revoke(self, host: Host) -> None:
        """Remove the drop-in and queue a containerd restart (blocking).

        Works from a fresh process too (the manifest says whether a drop-in
        is ours).  The toolkit stays: see ``toolkit.py``.
        """
        self._written = None
        self._restarted = False
        self._down = None
        self._withdraw_stale(host)

    def _withdraw_stale(self, host: Host) -> None:
        """Remove our drop-in if the manifest records one, and queue a restart."""
        if not host.owned(OWNER):
            return
        host.discard(OWNER)
        logger.info("containerd drop-in %s removed", self.settings.dropin)
        if self.settings.restart_mode == "none":
            logger.warning(
                "containerd restart pending: restart it on the node to drop the nvidia runtime"
            )
            return
        # --no-block: teardown must not wait for containerd, and the daemon's
        # own pod may be among what the restart touches.
        try:
            argv = [*self.settings.systemctl, "restart", "--no-block", "containerd"]
            result = self._run(host, argv)
        except CommandError as exc:
            logger.error("could not queue a containerd restart: %s", exc)
            return
        if result.returncode != 0:
            logger.error("could not queue a containerd restart: %s", result.stderr.strip())
        else:
            logger.info("containerd restart queued")


def _parse(path: str, written: bytes) -> dict:
    """The drop-in as TOML, or a ``CommandError`` naming it (never a half-parsed write)."""
    try:
        return tomllib.loads(written.decode())
    except UnicodeDecodeError as exc:
        raise CommandError(f"{path}: not UTF-8 text after nvidia-ctk ran: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CommandError(f"{path}: not valid TOML after nvidia-ctk ran: {exc}") from exc
