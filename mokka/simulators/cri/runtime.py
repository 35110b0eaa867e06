"""containerd's runtime setup: drop-in, NRI, the ``imports`` line, restart (SURFACES §6.2).

The procedure, once the toolkit is installed (``toolkit.py``):

1. Read the inputs (``dropin.read_inputs``): the main config and the
   drop-ins containerd imports before ours.
2. Run the image's ``nvidia-ctk runtime configure`` on a *scratch copy* of
   them, in a private temporary directory of the daemon's own.  It writes
   the runtime part of the drop-in there (the ``nvidia`` runtime as
   default, its ``BinaryName``, ``runc``'s options, ``enable_cdi``, in the
   main config's version).  Only that output is used: the real tool also
   rewrites the main config whole (comments dropped, tables reordered),
   and the node's copy must never get that.
3. Compose the drop-in (``dropin.compose``: the node's own settings under
   ours, NRI, the built-in ``runc`` handler) and write it
   (``<configDir>/50-mokka.toml``).
4. Add the one marked ``imports`` line for the drop-in directory to the
   main config (``mainconfig``), unless the directory is imported already.
5. Restart containerd through the host's systemd when the drop-in's
   content changed, and once at daemon start; never on an unchanged
   reconcile.  ``restartMode: none`` only logs that a restart is pending.

Every reconcile reads the inputs again: when they changed (an operator's
edit of ``config.toml`` while the daemon runs, another drop-in added), the
drop-in is computed again, so its copy of the node's settings never goes
stale beyond one resync interval (the repair pass calls apply because the
reads are recorded, see ``mokka.daemon.waves``).

The drop-in belongs to the manifest owner ``cri-runtime``; revoke removes
it and takes the marked line out of the main config again, so a main
config nobody edited meanwhile is back byte for byte.

Leave-alone cases (the node stays as it is, the simulator stays ready and
says why): no containerd binary on the host's PATH (CRI-O, k3s/rke2 with
an embedded containerd), or a toolkit file at a package path that we did
not create (another installer prepared the node).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import attrs

from mokka.errors import CommandError, HostPathError
from mokka.noderoot import File, Host
from mokka.simulators.base import Readiness
from mokka.simulators.cri import dropin as dropin_mod
from mokka.simulators.cri import mainconfig, tomlwriter, toolkit
from mokka.simulators.cri.dropin import RUNTIME_NAME, merge_plugins, nri_settings
from mokka.simulators.cri.settings import CriSettings

logger = logging.getLogger(__name__)

#: Manifest owner of the drop-in.
OWNER = "cri-runtime"
#: Where containerd is looked for under the node root (the host's PATH
#: directories a distribution or an installer puts it in).
CONTAINERD_PATHS = ("/usr/bin/containerd", "/usr/local/bin/containerd", "/usr/sbin/containerd")

__all__ = ["OWNER", "RUNTIME_NAME", "RuntimeSetup", "merge_plugins", "nri_settings"]


@attrs.define(eq=False)
class RuntimeSetup:
    """State of the runtime setup across reconciles (one per daemon process)."""

    settings: CriSettings
    #: The drop-in content this process last wrote; None before the first
    #: successful configure, so the first apply always runs ``nvidia-ctk``
    #: (an upgraded image may ship a toolkit that writes something else).
    _written: bytes | None = None
    #: The inputs the drop-in was last computed from (``dropin.Inputs``);
    #: different inputs on the node mean the drop-in is stale.
    _inputs: dropin_mod.Inputs | None = None
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
            # The real paths looked at: under a local run's root they are not
            # the machine's own, which may well have a containerd.
            root = host.root.as_posix().rstrip("/")
            looked = ", ".join(f"{root}{path}" for path in CONTAINERD_PATHS)
            return (
                f"no containerd on the host's PATH (looked under the node root "
                f"{root or '/'}: {looked}); "
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
        inputs = dropin_mod.read_inputs(host, self.settings)
        if self._written is not None and on_disk == self._written and inputs == self._inputs:
            # Unchanged reconcile: no nvidia-ctk run, no restart.  Only a
            # containerd we left down is looked at again.
            if self._down is not None:
                self._check_active(host)
            return self._readiness()
        try:
            final = self._write_dropin(host, dropin, inputs)
            self._add_import(host)
        except (CommandError, HostPathError, OSError) as exc:
            # Not raised: the specs are published and useful without
            # containerd's runtime entry; the next reconcile tries again.
            self._written = None
            logger.error("containerd drop-in not written: %s", exc)
            return Readiness.not_ready(str(exc))
        changed = final != on_disk
        self._written = final
        # Read again: the imports line just added is no change of the inputs.
        self._inputs = dropin_mod.read_inputs(host, self.settings)
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

    def _write_dropin(self, host: Host, dropin: str, inputs: dropin_mod.Inputs) -> bytes:
        """Run ``nvidia-ctk`` on a scratch copy of the inputs, compose the drop-in, converge it."""
        given, node = dropin_mod.base(inputs, self.settings.containerd_config)
        written = self._run_ctk(host, given)
        if node is None:
            node = dropin_mod.parse(self.settings.containerd_config, given) if given else {}
        doc = dropin_mod.parse(dropin, written, after=" after nvidia-ctk ran")
        if not dropin_mod.has_runtime(doc):
            raise CommandError(
                f"{dropin}: nvidia-ctk wrote no '{RUNTIME_NAME}' runtime entry; expected "
                f"[plugins.\"{dropin_mod.CRI_PLUGINS[2]}\".containerd.runtimes.{RUNTIME_NAME}]"
            )
        doc = dropin_mod.compose(doc, node, self.settings)
        final = (dropin_mod.HEADER + tomlwriter.dumps(doc)).encode()
        artifacts = [File(dropin, final, 0o644)]
        main = self.settings.containerd_config
        if inputs.main is None or main in host.owned(OWNER):
            # A node without a main config gets one holding the import,
            # ours: discard removes it.
            artifacts.append(self._created_main())
        report = host.converge(OWNER, artifacts)
        if report.changed:
            logger.info("containerd drop-in %s written", dropin)
        return final

    def _run_ctk(self, host: Host, main: bytes | None) -> bytes:
        """``nvidia-ctk runtime configure`` on ``main`` in a private scratch directory.

        The daemon's own temporary directory, not the node: the tool's
        rewrite of the main config there is thrown away with it.
        """
        with tempfile.TemporaryDirectory(prefix="mokka-ctk-") as scratch:
            config = Path(scratch, "config.toml")
            output = Path(scratch, "drop-in.toml")
            if main is not None:
                config.write_bytes(main)
            result = self._run(host, self.ctk_argv(config, output))
            if result.returncode != 0:
                raise CommandError(
                    f"nvidia-ctk runtime configure failed (exit {result.returncode}): "
                    f"{(result.stderr or result.stdout).strip()}"
                )
            if not output.is_file():
                raise CommandError(
                    f"nvidia-ctk runtime configure did not write {self.settings.dropin}"
                )
            return output.read_bytes()

    def ctk_argv(self, config: os.PathLike[str] | str, output: os.PathLike[str] | str) -> list[str]:
        """The ``nvidia-ctk runtime configure`` command over a scratch ``config``."""
        return [
            str(self.settings.toolkit_dir / "nvidia-ctk"),
            "runtime",
            "configure",
            "--runtime=containerd",
            "--config-source=file",
            f"--config={config}",
            f"--drop-in-config={output}",
            f"--nvidia-runtime-name={RUNTIME_NAME}",
            f"--nvidia-runtime-path={toolkit.RUNTIME_BINARY}",
            "--nvidia-set-as-default",
            "--cdi.enabled",
        ]

    # ---- the imports line -------------------------------------------------

    def _glob(self) -> str:
        return f"{self.settings.containerd_config_dir.rstrip('/')}/*.toml"

    def _created_main(self) -> File:
        """The main config of a node that had none: only the import (ours, the manifest's)."""
        text = f'version = 2\nimports = ["{self._glob()}"]\n'
        return File(self.settings.containerd_config, text.encode(), 0o644)

    def _add_import(self, host: Host) -> None:
        """Make the main config import the drop-in directory (one marked line, ``mainconfig``)."""
        path = self.settings.containerd_config
        if path in host.owned(OWNER):
            return  # we created it, with the import
        current = host.read_bytes(path)
        try:
            edited = mainconfig.add(current.decode(), self._glob())
        except (UnicodeDecodeError, mainconfig.ImportsUnsupported) as exc:
            raise CommandError(f"cannot import {self._glob()} from {path}: {exc}") from exc
        if edited is not None:
            _rewrite(host.resolve(path, follow_last=True), edited.encode())
            logger.info("%s imports %s now", path, self._glob())

    def _remove_import(self, host: Host) -> None:
        """Take the marked line out of the main config again (if it is still there)."""
        path = self.settings.containerd_config
        if path in host.owned(OWNER):
            return  # we created the whole file: discard removes it
        try:
            current = host.read_bytes(path)
            restored = mainconfig.remove(current.decode())
        except (OSError, HostPathError, UnicodeDecodeError):
            return
        if restored is not None:
            _rewrite(host.resolve(path, follow_last=True), restored.encode())
            logger.info("%s: the imports line mokka added is removed", path)

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
        try:
            self._remove_import(host)
        except OSError as exc:
            logger.error("could not remove the imports line mokka added: %s", exc)
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
    return dropin_mod.parse(path, written, after=" after nvidia-ctk ran")


def _rewrite(real: Path, content: bytes) -> None:
    """Replace a node file that is not ours atomically, keeping its mode and owner.

    A rename, so containerd (or an editor) never reads half a file; the new
    inode gets the old one's mode and owner, so only the content changes.
    """
    st = os.stat(real)
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.mokka-", dir=real.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, st.st_mode & 0o7777)
        os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
