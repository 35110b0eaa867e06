"""Wrappers in the driver tree that run the real IB tools against the mock tree.

``<driver root>/usr/bin/ibstat`` (and ``ibstatus``, and in ``full`` mode
``ibv_devinfo``) is a small ``/bin/sh`` script: it preloads the filesystem
shim (and, for verbs tools, the verbs shim) and execs the machine's real
tool.  It owns no logic of its own, so what it prints is exactly what the
real tool makes of the mock tree.  Everything is found relative to the
script, so it works wherever the state root is (a local node root, the
host's ``/var/lib/nvml-mock``):

* shims: ``<driver root>/usr/local/lib/`` (``libmockfs.so`` is staged there
  by ``pcibus``, ``libibshim.so`` by ``ib`` in ``full`` mode);
* the IB tree: ``<driver root>/../ib`` (``mokka.layout.IB_ROOT``), or
  ``$MOKKA_IB_ROOT`` when set.

The real tools are not shipped: a machine without them gets a message
naming the Debian package, and exit code 127 like a shell's "not found".
``MOKKA_MOCKFS_PREFIXES`` is set to the IB prefixes only, so the wrapped
tool still sees the machine's own PCI bus.
"""

from __future__ import annotations

import attrs

from mokka import layout, native
from mokka.host import Artifact, File

#: The prefixes the wrappers redirect: the IB classes and device nodes.
IB_PREFIXES = (
    "/sys/class/infiniband",
    "/sys/class/infiniband_mad",
    "/sys/class/infiniband_verbs",
    "/dev/infiniband",
)

WRAPPER_MODE = 0o755


@attrs.frozen
class Tool:
    """A real tool the driver tree wraps."""

    name: str
    #: where the machine has it (Debian's path)
    real: str
    #: the Debian package that provides it, for the "not installed" message
    package: str
    #: the shims it runs under, file names in ``DRIVER_LOCAL_LIB``, first one first
    preloads: tuple[str, ...]


IBSTAT = Tool("ibstat", "/usr/sbin/ibstat", "infiniband-diags", (native.MOCKFS_LIBRARY,))
IBSTATUS = Tool("ibstatus", "/usr/sbin/ibstatus", "infiniband-diags", (native.MOCKFS_LIBRARY,))
IBV_DEVINFO = Tool(
    "ibv_devinfo",
    "/usr/bin/ibv_devinfo",
    "ibverbs-utils",
    (native.IBSHIM_LIBRARY, native.MOCKFS_LIBRARY),
)

#: Tools per mode.
SYSFS_TOOLS = (IBSTAT, IBSTATUS)
FULL_TOOLS = (*SYSFS_TOOLS, IBV_DEVINFO)

#: One shim of the wrapper's preload list: it must exist, then it is appended.
_PRELOAD = """\
lib=$here/../local/lib/{library}
if [ ! -f "$lib" ]; then
    echo "{name}: shim $lib is missing (staged by the mokka daemon)" >&2
    exit 1
fi
preload="$preload${{preload:+ }}$lib"
"""

_TEMPLATE = """\
#!/bin/sh
# {name} against the mock InfiniBand tree (staged by mokka's ib simulator):
# runs the machine's real {real} with the IB sysfs classes and
# /dev/infiniband redirected into the tree by LD_PRELOAD shims.
here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd -P) || exit 1
root=${{MOKKA_IB_ROOT:-$here/../../../ib}}
real={real}
if [ ! -x "$real" ]; then
    echo "{name}: $real is not installed; install the Debian package {package} (this" \\
        "wrapper runs it against the mock InfiniBand tree)" >&2
    exit 127
fi
if [ ! -d "$root/sys/class/infiniband" ]; then
    echo "{name}: no mock InfiniBand tree at $root (is the ib simulator on? set" \\
        "MOKKA_IB_ROOT to the tree)" >&2
    exit 1
fi
root=$(CDPATH='' cd -- "$root" && pwd -P) || exit 1
preload=
{preloads}LD_PRELOAD="$preload${{LD_PRELOAD:+ $LD_PRELOAD}}"
MOKKA_MOCKFS_ROOT=$root
MOKKA_MOCKFS_PREFIXES={prefixes}
export LD_PRELOAD MOKKA_MOCKFS_ROOT MOKKA_MOCKFS_PREFIXES
exec "$real" "$@"
"""


def wrapper_script(tool: Tool) -> str:
    """The ``/bin/sh`` text of ``tool``'s wrapper."""
    return _TEMPLATE.format(
        name=tool.name,
        real=tool.real,
        package=tool.package,
        preloads="".join(_PRELOAD.format(name=tool.name, library=lib) for lib in tool.preloads),
        prefixes=":".join(IB_PREFIXES),
    )


def wrapper_artifacts(tools: tuple[Tool, ...]) -> list[Artifact]:
    """One executable wrapper per tool in ``<driver root>/usr/bin``."""
    return [File(f"{layout.DRIVER_BIN}/{t.name}", wrapper_script(t), WRAPPER_MODE) for t in tools]
