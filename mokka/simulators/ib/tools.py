"""Wrappers in the driver tree that run the real IB tools against the mock tree.

``<driver root>/usr/bin/ibstat`` (and ``ibstatus``, and in ``full`` mode
``ibv_devinfo`` and ``ibv_devices``) is a small ``/bin/sh`` script: it
preloads the filesystem shim (and, for verbs tools, the verbs shim) and
execs the real tool.  It owns no logic of its own, so what it prints is
exactly what the real tool makes of the mock tree.  Everything is found
relative to the script, so it works wherever the state root is (a local
node root, the host's ``/var/lib/nvml-mock``, ``/run/nvidia/driver``):

* the tool: the image's copy staged beside the shims
  (``<driver root>/usr/local/lib/mokka-ib/bin``, see ``bundle.py``) when the
  image has one, else the machine's installed tool (Debian's path);
* shims: ``<driver root>/usr/local/lib/`` (``libmockfs.so`` is staged there
  by ``pcibus``, ``libibshim.so`` by ``ib`` in ``full`` mode), preloaded by
  file name with that directory first on ``LD_LIBRARY_PATH``, because ld.so
  splits ``LD_PRELOAD`` at spaces and a node root may have one in its path;
* the IB tree: ``$MOKKA_IB_ROOT`` when set, else ``<driver root>/../ib``
  (``mokka.layout.IB_ROOT`` beside the driver root), else the node path
  ``/var/lib/nvml-mock/ib`` itself (the driver root reached through a bind
  mount on ``/run/nvidia/driver`` has no ``../ib``).

A machine's tool that is not installed gets a message naming the Debian
package, and exit code 127 like a shell's "not found".
``MOKKA_MOCKFS_PREFIXES`` is set to the IB prefixes only, so the wrapped
tool still sees the machine's own PCI bus.
"""

from __future__ import annotations

import posixpath

import attrs

from mokka import layout, native
from mokka.noderoot import Artifact, File
from mokka.simulators.ib.bundle import STAGED_BIN

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
_VERBS_PRELOADS = (native.IBSHIM_LIBRARY, native.MOCKFS_LIBRARY)
IBV_DEVINFO = Tool("ibv_devinfo", "/usr/bin/ibv_devinfo", "ibverbs-utils", _VERBS_PRELOADS)
IBV_DEVICES = Tool("ibv_devices", "/usr/bin/ibv_devices", "ibverbs-utils", _VERBS_PRELOADS)

#: Tools per mode.
SYSFS_TOOLS = (IBSTAT, IBSTATUS)
FULL_TOOLS = (*SYSFS_TOOLS, IBV_DEVINFO, IBV_DEVICES)

#: The tools that speak management datagrams: libibumad's traffic goes to
#: the node's mock-ib daemon through ``libumadshim.so`` (staged in every mode
#: but ``off``, with the daemon that answers).
_MAD_PRELOADS = (native.UMADSHIM_LIBRARY, native.MOCKFS_LIBRARY)
MAD_TOOLS = tuple(
    Tool(name, f"/usr/sbin/{name}", "infiniband-diags", _MAD_PRELOADS)
    for name in (
        "sminfo", "smpquery", "perfquery", "ibping", "ibnetdiscover", "iblinkinfo",
        "ibaddr", "ibtracert", "ibqueryerrors", "ibroute", "ibportstate", "ibsysstat",
    )
)

#: Paths the script spells relative to its own directory (``$here``, the
#: driver tree's ``usr/bin``), so they hold wherever the tree is reached.
_TO_LOCAL_LIB = posixpath.relpath(layout.DRIVER_LOCAL_LIB, layout.DRIVER_BIN)
_TO_STAGED_BIN = posixpath.relpath(STAGED_BIN, layout.DRIVER_BIN)
_TO_IB_ROOT = posixpath.relpath(layout.IB_ROOT, layout.DRIVER_BIN)

#: One shim of the wrapper's preload list: it must exist, then its *file
#: name* is appended.  ld.so splits ``LD_PRELOAD`` at spaces and colons, so
#: a full path under a root such as ``/home/a b/mokka-node`` would not load
#: and the tool would quietly read the machine's own IB classes; a bare
#: name is looked up on ``LD_LIBRARY_PATH``, which splits at colons only.
_PRELOAD = """\
lib=$here/{local_lib}/{library}
if [ ! -f "$lib" ]; then
    echo "{name}: shim $lib is missing (staged by the mokka daemon)" >&2
    exit 1
fi
preload="$preload${{preload:+ }}{library}"
"""

#: The check that the machine has the tool (no image copy staged).
_HOST_TOOL = """\
real={real}
if [ ! -x "$real" ]; then
    echo "{name}: $real is not installed; install the Debian package {package} (this" \\
        "wrapper runs it against the mock InfiniBand tree)" >&2
    exit 127
fi
"""

#: The check that the image's copy is staged (it is, unless someone removed it).
_STAGED_TOOL = """\
real=$here/{staged_bin}/{name}
if [ ! -x "$real" ]; then
    echo "{name}: $real is missing (the mokka daemon stages it from its image)" >&2
    exit 127
fi
"""

_TEMPLATE = """\
#!/bin/sh
# {name} against the mock InfiniBand tree (staged by mokka's ib simulator):
# runs {what} with the IB sysfs classes and
# /dev/infiniband redirected into the tree by LD_PRELOAD shims.
here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd -P) || exit 1
root=${{MOKKA_IB_ROOT:-}}
if [ -z "$root" ]; then
    root=$here/{ib_root}
    # Through a bind mount of the driver root there is no ../ib beside it:
    # take the tree at its node path.
    [ -d "$root/sys/class/infiniband" ] || root={ib_node_path}
fi
{tool_check}if [ ! -d "$root/sys/class/infiniband" ]; then
    echo "{name}: no mock InfiniBand tree at $root (is the ib simulator on? set" \\
        "MOKKA_IB_ROOT to the tree)" >&2
    exit 1
fi
root=$(CDPATH='' cd -- "$root" && pwd -P) || exit 1
preload=
{preloads}libdir=$(CDPATH='' cd -- "$here/{local_lib}" && pwd -P) || exit 1
case $libdir in
    *:*) echo "{name}: $libdir holds a ':', which LD_LIBRARY_PATH cannot name" >&2; exit 1 ;;
esac
# The shims by name, found first on LD_LIBRARY_PATH (see the preload lines).
LD_LIBRARY_PATH="$libdir${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
LD_PRELOAD="$preload${{LD_PRELOAD:+ $LD_PRELOAD}}"
MOKKA_MOCKFS_ROOT=$root
MOKKA_MOCKFS_PREFIXES={prefixes}
export LD_LIBRARY_PATH LD_PRELOAD MOKKA_MOCKFS_ROOT MOKKA_MOCKFS_PREFIXES
exec "$real" "$@"
"""


def wrapper_script(tool: Tool, *, staged: bool = False) -> str:
    """The ``/bin/sh`` text of ``tool``'s wrapper.

    ``staged``: run the image's copy staged in the driver tree (``bundle.py``)
    rather than the machine's installed tool.
    """
    if staged:
        what = f"the image's {tool.name} (staged in the driver tree)"
        check = _STAGED_TOOL.format(name=tool.name, staged_bin=_TO_STAGED_BIN)
    else:
        what = f"the machine's real {tool.real}"
        check = _HOST_TOOL.format(name=tool.name, real=tool.real, package=tool.package)
    preloads = "".join(
        _PRELOAD.format(name=tool.name, library=lib, local_lib=_TO_LOCAL_LIB)
        for lib in tool.preloads
    )
    return _TEMPLATE.format(
        name=tool.name,
        what=what,
        ib_root=_TO_IB_ROOT,
        ib_node_path=layout.IB_ROOT,
        tool_check=check,
        preloads=preloads,
        local_lib=_TO_LOCAL_LIB,
        prefixes=":".join(IB_PREFIXES),
    )


def wrapper_artifacts(tools: tuple[Tool, ...], *, staged: bool = False) -> list[Artifact]:
    """One executable wrapper per tool in ``<driver root>/usr/bin``."""
    return [
        File(f"{layout.DRIVER_BIN}/{t.name}", wrapper_script(t, staged=staged), WRAPPER_MODE)
        for t in tools
    ]
