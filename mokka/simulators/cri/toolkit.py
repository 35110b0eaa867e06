"""Installing the NVIDIA Container Toolkit the image ships (SURFACES §6.2, first half).

The release is copied into ``/usr/local/nvml-mock/toolkit/`` and linked
from the paths the toolkit's own packages use, so containerd's runtime
entry (``/usr/bin/nvidia-container-runtime``) and the CDI hook path
(``/usr/bin/nvidia-cdi-hook``) mean the same thing on every node.  The
runtime's ``config.toml`` is written here too: CDI mode, default kind
``nvidia.com/gpu``, the spec directories the cri simulator publishes into.

These files have their own manifest owner (``cri-toolkit``) that neither
revoke nor discard removes: containers started with the ``nvidia`` runtime
call ``nvidia-container-runtime`` again for exec, kill and delete, long
after the daemon is gone.  ``mokka cleanup`` (every manifest) or the manual
steps in ``docs/cri.md`` remove them.

Another installer (the distribution's packages, the GPU Operator's toolkit
container) is recognised by a file at one of the package paths that this
owner did not create; the node is then left alone entirely.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import attrs

from mokka.noderoot import Artifact, ConvergeReport, CopyOf, File, Host, Symlink

logger = logging.getLogger(__name__)

#: Manifest owner of the install; never discarded by the daemon (see above).
OWNER = "cri-toolkit"
#: Where the release is installed on the node.
INSTALL_DIR = "/usr/local/nvml-mock/toolkit"
#: The executables the setup needs: the runtime containerd calls, the CLI
#: that writes containerd's drop-in, and the hook the CDI spec names.
REQUIRED = ("nvidia-container-runtime", "nvidia-ctk", "nvidia-cdi-hook")
#: The installed ``nvidia-ctk`` (for the node's own use; the setup runs the
#: image's copy on a scratch directory, see ``runtime.py``).
NVIDIA_CTK = f"{INSTALL_DIR}/nvidia-ctk"
#: The runtime's config, installed beside the binaries and linked from /etc.
CONFIG = f"{INSTALL_DIR}/config.toml"
RUNTIME_CONFIG_LINK = "/etc/nvidia-container-runtime/config.toml"
RUNTIME_BINARY = "/usr/bin/nvidia-container-runtime"

#: Package path → relative link target.  Relative, so the links resolve the
#: same on the host and beneath the pod's ``/host``.
LINKS: dict[str, str] = {
    RUNTIME_BINARY: "../local/nvml-mock/toolkit/nvidia-container-runtime",
    "/usr/bin/nvidia-ctk": "../local/nvml-mock/toolkit/nvidia-ctk",
    "/usr/bin/nvidia-cdi-hook": "../local/nvml-mock/toolkit/nvidia-cdi-hook",
    RUNTIME_CONFIG_LINK: "../../usr/local/nvml-mock/toolkit/config.toml",
}

#: Every path the toolkit's packages install that would tell us another
#: installer owns the node's container runtime setup.
PACKAGE_PATHS: tuple[str, ...] = (
    *LINKS,
    "/usr/bin/nvidia-container-runtime-hook",
    "/usr/bin/nvidia-container-runtime.cdi",
    "/usr/bin/nvidia-container-runtime.legacy",
    "/usr/bin/nvidia-container-cli",
)

#: The runtime's config: CDI mode only.  The runtime turns the
#: ``NVIDIA_VISIBLE_DEVICES`` of a container (set by the device plugin) into
#: CDI devices of ``default-kind`` and injects them from ``spec-dirs``.
CONFIG_TOML = """\
# Written by mokka (cri simulator): the NVIDIA Container Runtime in CDI mode,
# injecting the mock GPUs from the CDI specs mokka publishes.
disable-require = false

[nvidia-container-runtime]
log-level = "info"
mode = "cdi"
runtimes = ["runc", "crun"]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]

[nvidia-container-runtime-hook]
path = "nvidia-container-runtime-hook"
skip-mode-detection = true

[nvidia-ctk]
path = "/usr/bin/nvidia-ctk"
"""


class ToolkitUnavailable(Exception):
    """The image's toolkit directory lacks what the setup needs (an image problem)."""


@attrs.frozen
class Install:
    """The outcome of one install: what converge did, for logs."""

    report: ConvergeReport
    #: the files copied from the image, by installed name
    files: tuple[str, ...]


def foreign_files(host: Host) -> list[str]:
    """Package paths holding something this owner did not create (another installer's)."""
    owned = host.owned(OWNER)
    return [path for path in PACKAGE_PATHS if host.exists(path) and path not in owned]


def artifacts(toolkit_dir: Path) -> list[Artifact]:
    """The install: every regular file of the release, our config, the links.

    Raises ``ToolkitUnavailable`` naming what is missing.
    """
    if not toolkit_dir.is_dir():
        raise ToolkitUnavailable(f"toolkit directory {toolkit_dir} does not exist in the image")
    sources = sorted(p for p in toolkit_dir.iterdir() if p.is_file() and p.name != "config.toml")
    missing = [name for name in REQUIRED if not any(p.name == name for p in sources)]
    if missing:
        raise ToolkitUnavailable(
            f"toolkit directory {toolkit_dir} lacks {', '.join(missing)} "
            f"(expected {', '.join(REQUIRED)})"
        )
    arts: list[Artifact] = []
    for source in sources:
        # Keep the release's own modes (all 0755 in NVIDIA's packages), but
        # never set-id bits on a file we copied.
        mode = stat.S_IMODE(os.stat(source).st_mode) & 0o777
        arts.append(CopyOf(f"{INSTALL_DIR}/{source.name}", source, mode))
    arts.append(File(CONFIG, CONFIG_TOML, 0o644))
    arts.extend(Symlink(path, target) for path, target in LINKS.items())
    return arts


def install(host: Host, toolkit_dir: Path) -> Install:
    """Converge the install (blocking).  Unchanged files are not copied again."""
    arts = artifacts(toolkit_dir)
    report = host.converge(OWNER, arts)
    if report.changed:
        logger.info("NVIDIA Container Toolkit from %s installed in %s", toolkit_dir, INSTALL_DIR)
    files = tuple(a.path for a in arts if isinstance(a, CopyOf))
    return Install(report=report, files=files)
