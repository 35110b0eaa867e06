"""What the NRI plugin adds to a container: a pure function of the container and the node.

``adjustment(container, node)`` decides, at ``CreateContainer``, which mock
GPUs a container will see and what it then needs so that programs reading
``/sys`` and ``/proc`` directly (Go programs: the device plugin, GPU feature
discovery, the DRA driver) see what they would see on a real GPU node.  It
never touches the node, never raises and does bounded work whatever the
container carries: the connection calls it for every container on the node,
and a slow or failing decision must not hold up a container creation.

**Which GPUs** (``visible_gpus``), the union of every way of asking:

* a CDI device in a ``cdi.k8s.io/*`` annotation (container or pod) whose
  class is ``gpu`` (``nvidia.com/gpu=1``, ``mokka.nvidia.com/gpu=<uuid>``,
  the device plugin's ``k8s.device-plugin.nvidia.com/gpu=<uuid>``) naming a
  GPU by index, UUID or ``all``;
* ``NVIDIA_VISIBLE_DEVICES`` (what the ``nvidia`` runtime reads): indexes,
  UUIDs, a comma list, ``all``; ``void``, ``none`` and empty mean none;
* ``/dev/nvidia<N>`` device nodes (major 195) in the OCI spec, as a CDI spec
  resolved by containerd leaves them (minor ``N`` is the GPU's minor);
* a bind mount of the host's ``/``, of the driver root or of the published
  driver root (``/run/nvidia/driver``), or of a directory above either: the
  NVIDIA DaemonSets mount these and then see every GPU.

**What they get** (``_gpu_mounts``):

* sysfs: a tmpfs over ``/sys/bus/pci/devices`` holding a bind of each
  visible GPU's staged device directory at ``<bdf>`` (``class``, ``vendor``,
  ``numa_node``, ``resource``, ``config``...), so exactly those GPUs are on
  the bus.  A bind of a directory cannot be a symlink: where the GPU's root
  complex exists on the node's own sysfs (``NodeView.host_pci_roots``), the
  same directory is also bound at its real ``/sys/devices/pci…`` path under
  a tmpfs over that root; a root the node lacks cannot be created inside a
  read-only sysfs (the runtime would fail the container), so it is left out.
  NVSwitches go along with *all* GPUs.
* with ``NodeView.sys_devices`` (``--nri-sys-devices``, off by default),
  the real links instead (``_sys_devices_mounts``): a tmpfs over
  ``/sys/devices`` holding a bind of every directory of the node's own
  ``/sys/devices`` (read at the container's creation: ``NodeDevices``),
  and, for each staged PCI root a visible device sits under, a tmpfs over
  the root holding the chains down to the visible devices (the switch port
  directory and everything below it, from the staged tree) beside the
  node's own entries of that root, if the node has it; ``/sys/bus/pci/devices``
  is then an overlay of the per-function link directories
  (``pci_links``), so each visible device and its port is a link
  ``../../../devices/pci…/<bdf>`` as on a real node.
* the engine config: the config directory at its own path with
  ``MOCK_NVML_CONFIG`` naming the file (as Mokka's CDI spec does), the
  directory again beside each ``libnvidia-ml.so*`` mount the container
  already has (``<lib dir>/../../config``, where the library looks,
  ``native/nvml/locate.c``), and the daemon's socket at
  ``/run/nvidia-persistenced/socket``, which a library with no config beside
  it asks.
* the nvlink topology overlay, at its node path, when the node has one.
* the board's DMI identity (``/sys/devices/virtual/dmi/id``, which
  ``/sys/class/dmi/id`` links to: GPU feature discovery's ``gpu.machine``
  reads ``product_name`` there), when the pcibus tree has one staged and the
  node's own sysfs has that directory to mount over (``NodeView.dmi``); also
  in ambient mode.
* ``/proc/driver/nvidia`` and (IMEX profiles) ``/proc/devices``, only with
  ``NodeView.proc_mounts``: runc refuses every mount inside ``/proc`` but a
  few lxcfs files ("cannot be mounted because it is inside /proc"), which
  would fail the container; see docs/nri.md.

**Ambient mode** (``NodeView.ambient``): every container also gets
``nvidia-smi`` at ``/usr/bin``, the library at ``/usr/lib64`` and the
engine config.  The pod annotation ``mokka.io/nri`` (``on`` / ``off``; a
container annotation of the same key wins) opts a pod in while ambient mode
is off, or out of everything the plugin does.
"""

from __future__ import annotations

import itertools
import posixpath
from collections.abc import Iterable, Mapping

import attrs

from mokka.simulators.nri.model import Adjustment, Container, Device, Mount
from mokka.simulators.nri.pci_links import EMPTY, link_dir

__all__ = [
    "ANNOTATION",
    "ENGINE_CONFIG_ENV",
    "GpuView",
    "NodeDevices",
    "NodeView",
    "SysDevices",
    "adjustment",
    "visible_gpus",
]

#: Pod (or container) annotation: ``on`` opts in to ambient injection,
#: ``off`` opts out of everything the plugin does.
ANNOTATION = "mokka.io/nri"
#: What the mock library reads for its config path (as Mokka's CDI spec sets it).
ENGINE_CONFIG_ENV = "MOCK_NVML_CONFIG"
#: The variable the ``nvidia`` runtime reads.
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
#: Prefix of containerd's CDI device annotations.
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
#: The NVIDIA driver's character major (``/dev/nvidia<N>``, ``nvidiactl``).
NVIDIA_MAJOR = 195
#: ``/dev/nvidiactl`` and ``/dev/nvidia-modeset`` share the major; not GPUs.
_CONTROL_MINORS = frozenset({254, 255})
#: Where the socket goes in a container: what the library asks first.
CONTAINER_SOCKET = "/run/nvidia-persistenced/socket"
CONTAINER_BIN_DIR = "/usr/bin"
CONTAINER_LIB_DIR = "/usr/lib64"
#: Where the kernel publishes DMI; ``/sys/class/dmi/id`` is a link to it.
DMI_DIR = "/sys/devices/virtual/dmi/id"
NVML_SONAME = "libnvidia-ml.so.1"

#: Bounds on what one container may make the policy look at: a hostile or
#: broken spec costs at most this much, then the rest is ignored.  Far above
#: anything real (a node has at most a few dozen GPUs).
MAX_ITEMS = 1024
MAX_VALUE = 64 * 1024

#: Longest ``lowerdir=`` option of the bus overlay: the kernel takes a
#: mount's options in one page (4096 bytes), the other options included.
#: Past it (dozens of functions under a long ``--nri-mount-root``) the bus
#: gets directories instead of links, as with the option off.
MAX_OVERLAY_OPTION = 3072
#: What the overlay's ``lowerdir`` cannot carry in a layer's path.
_OVERLAY_SPECIAL = frozenset(":,\\")

_RO = ("rbind", "ro", "nosuid", "nodev")
_TMPFS = ("nosuid", "nodev", "noexec", "mode=755")
_ALL = "all"
_NONE = frozenset({"", "void", "none"})


@attrs.frozen
class GpuView:
    """One GPU as the policy needs it."""

    index: int
    uuid: str
    minor: int
    #: canonical ``dddd:bb:dd.f``
    bdf: str
    numa_node: int
    #: below the sysfs root: ``devices/<root>/[<bridge>/]<bdf>``
    sysfs_path: str


@attrs.frozen(kw_only=True)
class SysDevices:
    """``--nri-sys-devices``: what a container's own ``/sys/devices`` is made of."""

    #: the node's sysfs as containerd sees it (the sources of its entries)
    node_sysfs: str
    #: the staged per-function link directories (``pci_links.PCI_LINKS``), as
    #: containerd sees them
    links: str
    #: the ``pci<domain>:<bus>`` roots of the staged tree (those whose node
    #: entries ``NodeDevices.roots`` lists, where the node has them too)
    roots: frozenset[str] = frozenset()


@attrs.frozen
class NodeDevices:
    """The directories of the node's own ``/sys/devices``, read at a container's creation."""

    entries: tuple[str, ...] = ()
    #: the directories of each staged root the node has too, by root
    roots: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class NodeView:
    """What the policy needs of one state and the node's paths; built once per state.

    Every path is a *host* path as containerd sees it (the node path under
    ``mount_root``); ``None`` where the node has no such thing now.
    """

    gpus: tuple[GpuView, ...] = ()
    #: NVSwitches' sysfs paths (``devices/...``), injected with all GPUs
    switches: tuple[str, ...] = ()
    #: the staged sysfs tree (standing for ``/sys``)
    sys_root: str
    #: the driver root and its published mirror (a mount of either sees all GPUs)
    driver_roots: tuple[str, ...] = ()
    config_dir: str
    #: where the config directory is mounted in a container (its node path)
    container_config_dir: str
    engine_config: str
    nvml_socket: str | None = None
    nvml_library: str | None = None
    nvidia_smi: str | None = None
    proc_driver: str | None = None
    imex_proc_devices: str | None = None
    #: (host path, container path) of the nvlink topology overlay
    topology: tuple[str, str] | None = None
    #: ``pci<domain>:<bus>`` roots present on the node's real sysfs
    host_pci_roots: frozenset[str] = frozenset()
    #: the staged DMI directory, for ``DMI_DIR``; None where none is staged or
    #: the node's own sysfs has no ``DMI_DIR`` (nothing to mount over: sysfs
    #: is read-only, and the runtime would fail the container)
    dmi: str | None = None
    ambient: bool = False
    proc_mounts: bool = False
    #: ``--nri-sys-devices``; None: off (the bus holds directories, see above)
    sys_devices: SysDevices | None = None

    def by_index(self) -> dict[str, GpuView]:
        return {str(g.index): g for g in self.gpus}


def adjustment(
    container: Container, node: NodeView, devices: NodeDevices | None = None
) -> Adjustment:
    """What ``container`` gets on this node (see the module docstring); never raises.

    ``devices``: the node's ``/sys/devices`` now, for ``node.sys_devices``;
    without it the bus holds directories, as with the option off.
    """
    try:
        return _adjustment(container, node, devices)
    except Exception:  # a policy bug must not fail a container creation
        return Adjustment()


def _adjustment(container: Container, node: NodeView, devices: NodeDevices | None) -> Adjustment:
    choice = _annotation(container)
    if choice == "off":
        return Adjustment()
    gpus = visible_gpus(container, node)
    ambient = node.ambient or choice == "on"
    if not gpus and not ambient:
        return Adjustment()
    mounts: list[Mount] = []
    if gpus:
        mounts += _gpu_mounts(gpus, node, devices, every=len(gpus) == len(node.gpus))
    if ambient:
        mounts += _tool_mounts(node)
    if node.dmi is not None:
        mounts.append(_bind(node.dmi, DMI_DIR))
    mounts += _config_mounts(container, node)
    taken = {m.destination for m in container.mounts}
    unique: dict[str, Mount] = {}
    for mount in mounts:
        if mount.destination not in taken:
            unique.setdefault(mount.destination, mount)
    env = ()
    if _env_value(container.env, ENGINE_CONFIG_ENV) is None:
        env = (f"{ENGINE_CONFIG_ENV}={node.engine_config}",)
    return Adjustment(mounts=tuple(unique.values()), env=env)


def _annotation(container: Container) -> str | None:
    for notes in (container.annotations, container.pod_annotations):
        value = _get(notes, ANNOTATION)
        if isinstance(value, str) and value.strip().lower() in ("on", "off"):
            return value.strip().lower()
    return None


def _get(annotations: object, key: str) -> object:
    return annotations.get(key) if isinstance(annotations, Mapping) else None


def visible_gpus(container: Container, node: NodeView) -> tuple[GpuView, ...]:
    """The node's GPUs ``container`` will see, in index order (see the module docstring)."""
    if not node.gpus:
        return ()
    wanted: set[int] = set()
    every = _mounts_driver(container.mounts, node)
    for names in (_cdi_names(container), _visible_devices(container.env)):
        for name in names:
            if name == _ALL:
                every = True
            else:
                gpu = _lookup(node, name)
                if gpu is not None:
                    wanted.add(gpu.index)
    minors = {g.minor: g.index for g in node.gpus}
    for device in container.devices[:MAX_ITEMS]:
        index = _device_gpu(device, minors)
        if index is not None:
            wanted.add(index)
    if every:
        return node.gpus
    return tuple(g for g in node.gpus if g.index in wanted)


def _lookup(node: NodeView, name: str) -> GpuView | None:
    name = name.strip()
    for gpu in node.gpus:
        if name == str(gpu.index) or name.lower() == gpu.uuid.lower():
            return gpu
    return None


def _cdi_names(container: Container) -> Iterable[str]:
    """Device names of ``<vendor>/gpu=<name>`` entries in the CDI annotations."""
    count = 0
    for notes in (container.annotations, container.pod_annotations):
        if not isinstance(notes, Mapping):
            continue
        for key, value in itertools.islice(notes.items(), MAX_ITEMS):
            if not (isinstance(key, str) and key.startswith(CDI_ANNOTATION_PREFIX)):
                continue
            if not isinstance(value, str) or len(value) > MAX_VALUE:
                continue
            for entry in value.split(",", MAX_ITEMS)[:MAX_ITEMS]:
                count += 1
                if count > MAX_ITEMS:
                    return
                kind, sep, name = entry.strip().partition("=")
                if sep and kind.rpartition("/")[2] == "gpu" and "/" in kind and name:
                    yield name


def _visible_devices(env: Iterable[str]) -> list[str]:
    value = _env_value(env, VISIBLE_DEVICES_ENV)
    if value is None or len(value) > MAX_VALUE:
        return []
    value = value.strip()
    if value.lower() in _NONE:
        return []
    return [item.strip() for item in value.split(",", MAX_ITEMS)[:MAX_ITEMS]]


def _env_value(env: Iterable[str], key: str) -> str | None:
    """The last ``KEY=`` value in ``env`` (the runtime's rule), among the first ``MAX_ITEMS``."""
    found = None
    prefix = key + "="
    for i, entry in enumerate(env):
        if i >= MAX_ITEMS:
            break
        if isinstance(entry, str) and entry.startswith(prefix):
            found = entry[len(prefix):]
    return found


def _device_gpu(device: Device, minors: Mapping[int, int]) -> int | None:
    if not isinstance(device, Device) or device.major != NVIDIA_MAJOR:
        return None
    if device.type not in ("c", "u") or device.minor in _CONTROL_MINORS:
        return None
    return minors.get(device.minor)


def _mounts_driver(mounts: Iterable[Mount], node: NodeView) -> bool:
    """Whether a bind mount brings the host's ``/`` or a driver root (or a parent) in."""
    for i, mount in enumerate(mounts):
        if i >= MAX_ITEMS:
            break
        if not isinstance(mount, Mount) or not _is_bind(mount):
            continue
        source = _normal(mount.source)
        if source is None:
            continue
        for root in node.driver_roots:
            if source == "/" or root == source or root.startswith(source + "/"):
                return True
    return False


def _is_bind(mount: Mount) -> bool:
    return mount.type in ("bind", "rbind") or any(o in ("bind", "rbind") for o in mount.options)


def _normal(path: object) -> str | None:
    if not isinstance(path, str) or not path.startswith("/") or len(path) > 4096:
        return None
    return posixpath.normpath(path).replace("//", "/")


def _bind(source: str, destination: str) -> Mount:
    return Mount(destination=destination, source=source, type="bind", options=_RO)


def _tmpfs(destination: str) -> Mount:
    return Mount(destination=destination, source="tmpfs", type="tmpfs", options=_TMPFS)


def _gpu_mounts(
    gpus: tuple[GpuView, ...], node: NodeView, devices: NodeDevices | None, *, every: bool
) -> list[Mount]:
    """sysfs entries of ``gpus`` (and the switches with all GPUs), proc files, topology."""
    paths = [(g.bdf, g.sysfs_path) for g in gpus]
    if every:
        paths += [(p.rpartition("/")[2], p) for p in node.switches]
    mounts: list[Mount] | None = None
    if node.sys_devices is not None and devices is not None:
        mounts = _sys_devices_mounts(paths, node, node.sys_devices, devices)
    if mounts is None:
        mounts = _bus_directories(paths, node)
    if node.proc_mounts and node.proc_driver is not None:
        mounts.append(_bind(node.proc_driver, "/proc/driver/nvidia"))
    if node.proc_mounts and node.imex_proc_devices is not None:
        mounts.append(_bind(node.imex_proc_devices, "/proc/devices"))
    if node.topology is not None:
        host_path, container_path = node.topology
        mounts.append(_bind(host_path, container_path))
    return mounts


def _bus_directories(paths: list[tuple[str, str]], node: NodeView) -> list[Mount]:
    """The bus as directories, and the real paths under the roots the node has."""
    mounts = [_tmpfs("/sys/bus/pci/devices")]
    mounts += [_bind(f"{node.sys_root}/{path}", f"/sys/bus/pci/devices/{bdf}")
               for bdf, path in paths]
    # Real paths: a tmpfs over each root the node has, then the binds below it.
    roots: dict[str, list[str]] = {}
    for _bdf, path in paths:
        parts = path.split("/")
        if len(parts) >= 3 and parts[0] == "devices" and parts[1] in node.host_pci_roots:
            roots.setdefault(parts[1], []).append(path)
    for root, members in roots.items():
        mounts.append(_tmpfs(f"/sys/devices/{root}"))
        mounts += [_bind(f"{node.sys_root}/{path}", f"/sys/{path}") for path in members]
    return mounts


def _sys_devices_mounts(
    paths: list[tuple[str, str]], node: NodeView, own: SysDevices, devices: NodeDevices
) -> list[Mount] | None:
    """A ``/sys/devices`` of the container's own and the bus as links (module docstring).

    The chain of a device is the top directory below its root (its switch
    port, or the device itself where it hangs off the root), bound whole:
    a device sharing its port's bus with a visible one comes along.  None
    where the overlay's option would be too long or cannot name a layer.
    """
    chains: dict[str, dict[str, None]] = {}
    on_bus: dict[str, None] = {}
    for bdf, path in paths:
        parts = path.split("/")
        if len(parts) < 3 or parts[0] != "devices":
            continue
        chains.setdefault(parts[1], {})[parts[2]] = None
        if len(parts) > 3:
            on_bus[parts[2]] = None  # the port above it, on the bus as on a real node
        on_bus[bdf] = None
    layers = [f"{own.links}/{link_dir(bdf)}" for bdf in sorted(on_bus)]
    layers.append(f"{own.links}/{EMPTY}")
    option = "lowerdir=" + ":".join(layers)
    if len(option) > MAX_OVERLAY_OPTION or any(_OVERLAY_SPECIAL & set(x) for x in layers):
        return None
    mounts = [_tmpfs("/sys/devices")]
    mounts += [_bind(f"{own.node_sysfs}/devices/{name}", f"/sys/devices/{name}")
               for name in devices.entries if name not in chains]
    for root, tops in chains.items():
        mounts.append(_tmpfs(f"/sys/devices/{root}"))
        mounts += [_bind(f"{own.node_sysfs}/devices/{root}/{name}", f"/sys/devices/{root}/{name}")
                   for name in devices.roots.get(root, ()) if name not in tops]
        mounts += [_bind(f"{node.sys_root}/devices/{root}/{top}", f"/sys/devices/{root}/{top}")
                   for top in tops]
    mounts.append(Mount(destination="/sys/bus/pci/devices", source="overlay", type="overlay",
                        options=("ro", "nosuid", "nodev", "noexec", option)))
    return mounts


def _tool_mounts(node: NodeView) -> list[Mount]:
    """Ambient: ``nvidia-smi`` and the library where ``nvidia-smi``'s RPATH finds it."""
    mounts = []
    if node.nvidia_smi is not None:
        mounts.append(_bind(node.nvidia_smi, f"{CONTAINER_BIN_DIR}/nvidia-smi"))
    if node.nvml_library is not None:
        mounts.append(_bind(node.nvml_library, f"{CONTAINER_LIB_DIR}/{NVML_SONAME}"))
    return mounts


def _config_mounts(container: Container, node: NodeView) -> list[Mount]:
    """The config directory at its own path and beside each library mount; the socket."""
    mounts = [_bind(node.config_dir, node.container_config_dir)]
    for i, mount in enumerate(container.mounts):
        if i >= MAX_ITEMS:
            break
        destination = _normal(getattr(mount, "destination", None))
        if destination is None:
            continue
        directory, _, name = destination.rpartition("/")
        if name.startswith("libnvidia-ml.so"):
            beside = posixpath.normpath(f"{directory or '/'}/../../config")
            if beside != node.container_config_dir:
                mounts.append(_bind(node.config_dir, beside))
    if node.nvml_socket is not None:
        mounts.append(_bind(node.nvml_socket, CONTAINER_SOCKET))
    return mounts
