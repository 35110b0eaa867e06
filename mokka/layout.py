"""Node paths every simulator agrees on (SURFACES §1), in one place.

All are host-absolute node paths; ``Host.resolve`` maps them under the node
root.  The layout stays compatible with the earlier mock (consumers are
configured with these paths: the device plugin's ``--driver-root-ctr-path``,
GFD's ``--nvidia-driver-root``, the DRA driver's ``nvidiaDriverRoot``).
"""

from __future__ import annotations

from pathlib import Path

#: Node root of a local run (``mokka`` with no flags; ``mokka ctl`` and
#: ``fabricmanager-ctl`` without ``--root`` or ``MOKKA_ROOT``): a directory in
#: the current working directory, so a laptop run never needs root.  Not a
#: node path: kept here, not with the daemon's settings, so that those
#: commands find it without importing the settings.
LOCAL_ROOT = Path("mokka-node")
#: Mokka's own bookkeeping (manifests, backups).  Kept apart from the
#: simulators' state root so that consumers mounting that tree never see it.
MOKKA_STATE_DIR = "/var/lib/mokka"
#: Where ``Host`` keeps each owner's manifest, by these names: ``<owner>.json``
#: (the snapshot), ``<owner>.journal`` (what a converge noted since) and
#: ``<owner>.json.tmp`` (a snapshot being written, which a kill can leave).
MOKKA_MANIFESTS = f"{MOKKA_STATE_DIR}/manifests"
SNAPSHOT_SUFFIX = ".json"
JOURNAL_SUFFIX = ".journal"
SNAPSHOT_TMP_SUFFIX = ".json.tmp"
#: Root of everything the simulators stage.
STATE_ROOT = "/var/lib/nvml-mock"
#: The driver root consumers are pointed at.
DRIVER_ROOT = f"{STATE_ROOT}/driver"
DRIVER_DEV = f"{DRIVER_ROOT}/dev"
DRIVER_LIB = f"{DRIVER_ROOT}/usr/lib64"
DRIVER_BIN = f"{DRIVER_ROOT}/usr/bin"
DRIVER_LOCAL_LIB = f"{DRIVER_ROOT}/usr/local/lib"
DRIVER_PROC = f"{DRIVER_ROOT}/proc/driver/nvidia"
#: Engine config directory: the mock NVML library reads ``config.yaml`` here.
#: It stays a real directory (CDI bind-mounts it whole) so atomic renames
#: inside it remain visible in containers.
CONFIG_DIR = f"{DRIVER_ROOT}/config"
ENGINE_CONFIG = f"{CONFIG_DIR}/config.yaml"
DRIVER_TOPOLOGY = f"{CONFIG_DIR}/topology.yaml"
OVERRIDES = f"{CONFIG_DIR}/overrides.yaml"
#: Who holds each GPU (the workload simulator, from the kubelet), read by
#: the library beside the engine config.
WORKLOAD_CONFIG = f"{CONFIG_DIR}/workload.yaml"
#: The change notice: an 8-byte counter the daemon bumps in place after it
#: renamed a new engine config or workload file into place; the library maps
#: it and re-reads on the next call (docs/engine-config.md, "Change notice").
CONFIG_GENERATION = f"{CONFIG_DIR}/generation"
#: Fake sysfs (pcibus).
SYS_ROOT = f"{STATE_ROOT}/sys"
#: Mock InfiniBand tree (ib): stands for ``/`` under ``libmockfs.so``, so it
#: holds ``sys/class/infiniband*`` and ``dev/infiniband`` below it.
IB_ROOT = f"{STATE_ROOT}/ib"
#: Topology overlay for NRI-injected containers (nvlink).
TOPOLOGY_OVERLAY = f"{STATE_ROOT}/topology/topology.yaml"
#: /proc/devices overlay (imex).
IMEX_PROC_DEVICES = f"{STATE_ROOT}/imex/proc-devices"
#: Fabric manager readiness marker directory and file.
FABRIC_STATE_DIR = f"{STATE_ROOT}/fabric-state"
FABRIC_READY_MARKER = f"{FABRIC_STATE_DIR}/fabricmanager.ready"
#: The same marker mirrored beside the engine config, which is what the mock
#: NVML library reads.  A path from the config directory to ``fabric-state``
#: would need ``..``, and ``..`` at the top of a bind mount (the driver root
#: published at ``/run/nvidia/driver``, or mounted alone into a container such
#: as the DRA kubelet plugin) leaves the mount: through it, GPUs would stay
#: "In Progress" forever.  The config directory travels with the driver root.
FABRIC_READY_MIRROR = f"{CONFIG_DIR}/fabricmanager.ready"
#: Node-local download cache (imex archives).
CACHE_DIR = f"{STATE_ROOT}/cache"
#: Where the driver tree is published (gpudriver Apply).
RUN_DRIVER = "/run/nvidia/driver"
#: CDI spec directory (cri Apply).
CDI_DIR = "/var/run/cdi"
#: NFD local feature directory (pcibus Apply).
NFD_FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
#: The node's kernel log (kernellog).
KMSG = "/dev/kmsg"

#: Character major of ``nvidia-caps``: the MIG capability nodes under
#: ``/dev/nvidia-caps`` (gpudriver) and the name the ``/proc/devices``
#: overlay announces (imex) must agree, so both take it from the one
#: ``--nvidia-caps-major`` flag, whose default this is.  Dynamic on real
#: hosts; 236 is the value SURFACES records.
NVIDIA_CAPS_MAJOR = 236


def temp_name(real: str) -> str:
    """Where a new entry for ``real`` is written before it is renamed over it (beside it).

    One name for every writer under the root (a converge's batch, ``mokka
    ctl``'s rewrite of its recorded file): removing a recorded path also
    removes a temp file of it that a killed writer left.
    """
    directory, _, name = real.rpartition("/")
    return f"{directory}/.{name}.mokka-tmp"
