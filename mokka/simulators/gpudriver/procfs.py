"""What the kernel module would show in procfs and sysfs (SURFACES §3).

Files, all read-only like their kernel counterparts (mode 0444):

* ``driver/proc/driver/nvidia/version``: the ``NVRM version`` and ``GCC
  version`` lines.  GFD, the GPU Operator's validator and support scripts
  read the driver version from its first line.
* ``driver/proc/driver/nvidia/params``: the module parameters, one
  ``Key: value`` a line.  libnvidia-container reads ``ModifyDeviceFiles``,
  ``DeviceFileUID``/``GID``/``Mode`` from here to decide whether to create
  device nodes itself.
* ``driver/proc/driver/nvidia/capabilities/mig/{config,monitor}``: the MIG
  capability descriptors that map ``/dev/nvidia-caps/nvidia-cap<N>``, and
  ``capabilities/gpu<G>/mig/gi<I>/access`` (and ``ci<C>/access``) for
  each instance of a GPU's MIG layout (``mig_caps``).
* ``driver/proc/driver/nvidia-caps/mig-minors``: every MIG capability's
  minor, which the toolkit and the device plugin look MIG devices up in
  (while a GPU's MIG mode is on).
* ``var/lib/nvml-mock/sys/module/nvidia/version``: the loaded module's
  version, as ``/sys/module/nvidia/version`` holds it (driver version and a
  newline), beside the pcibus fake sysfs.

Every byte is a pure function of the state and the machine architecture, so
staging again writes nothing.
"""

from __future__ import annotations

import platform

from mokka import layout
from mokka.noderoot import Artifact, File
from mokka.simulators.gpudriver import mig_caps
from mokka.simulators.gpudriver.devices import MIG_CAPS
from mokka.state.model import State

#: Kernel-owned files are read-only for everyone.
PROC_MODE = 0o444

#: The module's build date in the version banner.  A real module prints when
#: it was compiled; a constant keeps the file identical across restarts (so
#: restaging is a no-op) and nothing parses the date.
BUILD_DATE = "Thu Jan  1 00:00:00 UTC 2026"
#: The compiler line of a module built on Debian bookworm, as SURFACES §3 fixes it.
GCC_LINE = "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)"

#: Module parameters, in the order the real driver prints them.  The first
#: five lines are the ones the earlier mock wrote (with its ``NVreg_``
#: spellings kept for scripts written against it); the rest are the real
#: driver's unprefixed keys, which libnvidia-container and the toolkit parse.
PARAMS: tuple[tuple[str, str], ...] = (
    ("EnableMSI", "1"),
    ("NVreg_DeviceFileGID", "0"),
    ("NVreg_DeviceFileMode", "438"),
    ("NVreg_DeviceFileUID", "0"),
    ("NVreg_ModifyDeviceFiles", "1"),
    ("ResmanDebugLevel", "4294967295"),
    ("RmLogonRC", "1"),
    ("ModifyDeviceFiles", "1"),
    ("DeviceFileUID", "0"),
    ("DeviceFileGID", "0"),
    ("DeviceFileMode", "438"),
    ("InitializeSystemMemoryAllocations", "1"),
    ("UsePageAttributeTable", "4294967295"),
    ("EnablePCIeGen3", "0"),
    ("MemoryPoolSize", "0"),
    ("KMallocHeapMaxSize", "0"),
    ("VMallocHeapMaxSize", "0"),
    ("IgnoreMMIOCheck", "0"),
    ("TCEBypassMode", "0"),
    ("EnableStreamMemOPs", "0"),
    ("EnableUserNUMAManagement", "1"),
    ("NvLinkDisable", "0"),
    ("RmProfilingAdminOnly", "1"),
    ("PreserveVideoMemoryAllocations", "0"),
    ("EnableS0ixPowerManagement", "0"),
    ("S0ixPowerManagementVideoMemoryThreshold", "256"),
    ("DynamicPowerManagement", "3"),
    ("DynamicPowerManagementVideoMemoryThreshold", "200"),
    ("RegisterPCIDriver", "1"),
    ("EnablePCIERelaxedOrderingMode", "0"),
    ("EnableResizableBar", "0"),
    ("EnableGpuFirmware", "18"),
    ("EnableGpuFirmwareLogs", "2"),
    ("RmNvlinkBandwidthLinkCount", "0"),
    ("EnableDbgBreakpoint", "0"),
    ("OpenRmEnableUnsupportedGpus", "1"),
    ("DmaRemapPeerMmio", "1"),
    ("ImexChannelCount", "2048"),
    ("CreateImexChannel0", "0"),
    ("GrdmaPciTopoCheckOverride", "0"),
    ("RegistryDwords", '""'),
    ("RegistryDwordsPerDevice", '""'),
    ("RmMsg", '""'),
    ("GpuBlacklist", '""'),
    ("TemporaryFilePath", '""'),
    ("ExcludedGpus", '""'),
)

#: MIG capability descriptors: ``DeviceFileMode`` is the node's mode in decimal.
_MIG_CAP_NAMES = {1: "config", 2: "monitor"}

#: Node path of the sysfs module version (beside the pcibus fake sysfs).
SYS_MODULE_VERSION = f"{layout.SYS_ROOT}/module/nvidia/version"


def render_version(driver_version: str, machine: str | None = None) -> str:
    """``/proc/driver/nvidia/version`` for ``driver_version`` on this machine.

    The architecture is the machine's own (``x86_64``, ``aarch64``), as a
    module built for it would print; two spaces around the version are the
    real banner's spacing, which parsers split on.
    """
    arch = machine or platform.machine()
    return (
        f"NVRM version: NVIDIA UNIX {arch} Kernel Module  {driver_version}  {BUILD_DATE}\n"
        f"{GCC_LINE}\n"
    )


def render_params() -> str:
    """``/proc/driver/nvidia/params``: one ``Key: value`` a line."""
    return "".join(f"{key}: {value}\n" for key, value in PARAMS)


def render_capability(minor: int, mode: int) -> str:
    """A capability descriptor (``capabilities/mig/config`` and friends)."""
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def procfs_artifacts(state: State, machine: str | None = None) -> list[Artifact]:
    """The procfs and sysfs files of the kernel module for ``state``."""
    proc = layout.DRIVER_PROC
    driver_version = state.system.driver_version
    artifacts: list[Artifact] = [
        File(f"{proc}/version", render_version(driver_version, machine), PROC_MODE),
        File(f"{proc}/params", render_params(), PROC_MODE),
    ]
    artifacts += [
        File(
            f"{proc}/capabilities/mig/{_MIG_CAP_NAMES[minor]}",
            render_capability(minor, mode),
            PROC_MODE,
        )
        for minor, mode in MIG_CAPS.items()
    ]
    artifacts += [
        File(f"{proc}/capabilities/{cap.proc_path}",
             render_capability(cap.minor, mig_caps.ACCESS_MODE), PROC_MODE)
        for cap in mig_caps.capabilities(state)
    ]
    if any(mig_caps.enabled(gpu) for gpu in state.gpus):
        # only read to find a MIG device's minors: staged while there can be one
        artifacts.append(File(f"{layout.DRIVER_ROOT}/proc/driver/nvidia-caps/mig-minors",
                              mig_caps.render_minors(state), PROC_MODE))
    artifacts.append(File(SYS_MODULE_VERSION, f"{driver_version}\n", PROC_MODE))
    return artifacts
