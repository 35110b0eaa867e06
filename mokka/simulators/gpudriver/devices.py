"""The driver's character device nodes under ``driver/dev`` (SURFACES §3).

Majors and minors follow the real driver so that consumers which compare
them (the device plugin maps ``/dev/nvidia<minor>`` to a GPU by NVML's minor
number; the container toolkit looks nodes up by major:minor) see what they
would on a GPU host:

=============================  ==========================  ======
node                           device                      mode
=============================  ==========================  ======
``nvidia<minor>``              195:<minor> (0..253)        0666
``nvidiactl``                  195:255                     0666
``nvidia-modeset``             195:254                     0666
``nvidia-uvm``                 <uvm major>:0               0666
``nvidia-uvm-tools``           <uvm major>:1               0666
``nvidia-caps/nvidia-cap1``    <caps major>:1 (MIG config)  0400
``nvidia-caps/nvidia-cap2``    <caps major>:2 (MIG monitor) 0444
=============================  ==========================  ======

The capability nodes keep the real driver's modes (``DeviceFileMode`` 256
and 292 in ``proc/driver/nvidia/capabilities/mig/*``): MIG configuration is
root-only on a real host, monitoring is world-readable.  Each GPU and
compute instance of a GPU's MIG layout has its own ``nvidia-cap<N>`` node
too (0444), numbered as the driver numbers them (``mig_caps``).
"""

from __future__ import annotations

from mokka import layout
from mokka.errors import SpecError
from mokka.noderoot import Artifact, CharDevice
from mokka.simulators.gpudriver import mig_caps
from mokka.simulators.gpudriver.settings import GpuDriverSettings
from mokka.state.model import State
from mokka.state.profile_devices import MAX_GPU_MINOR  # the two above it: modeset, ctl

#: The NVIDIA driver's static character major (``NV_MAJOR_DEVICE_NUMBER``).
NVIDIA_MAJOR = 195
#: Minors the driver reserves for its control and modeset nodes.
CTL_MINOR = 255
MODESET_MINOR = 254
#: ``nvidia-cap<N>`` minors and modes: 1 is MIG config, 2 is MIG monitor.
MIG_CAPS = {1: 0o400, 2: 0o444}

DEVICE_MODE = 0o666


def gpu_node(minor: int) -> str:
    """Node path of the GPU with NVML minor number ``minor``."""
    return f"{layout.DRIVER_DEV}/nvidia{minor}"


def device_artifacts(state: State, settings: GpuDriverSettings) -> list[Artifact]:
    """Every device node the driver tree holds for ``state``.

    GPUs are keyed by their NVML minor (the profile's ``minor_number``), not
    by index: on real H100 nodes the minor follows bus order, which the
    index need not.
    """
    _check_minors(state)
    dev = layout.DRIVER_DEV
    artifacts: list[Artifact] = [
        CharDevice(gpu_node(gpu.minor), NVIDIA_MAJOR, gpu.minor, DEVICE_MODE)
        for gpu in sorted(state.gpus, key=lambda g: g.minor)
    ]
    artifacts += [
        CharDevice(f"{dev}/nvidiactl", NVIDIA_MAJOR, CTL_MINOR, DEVICE_MODE),
        CharDevice(f"{dev}/nvidia-modeset", NVIDIA_MAJOR, MODESET_MINOR, DEVICE_MODE),
        CharDevice(f"{dev}/nvidia-uvm", settings.uvm_major, 0, DEVICE_MODE),
        CharDevice(f"{dev}/nvidia-uvm-tools", settings.uvm_major, 1, DEVICE_MODE),
    ]
    artifacts += [
        CharDevice(f"{dev}/nvidia-caps/nvidia-cap{minor}", settings.caps_major, minor, mode)
        for minor, mode in MIG_CAPS.items()
    ]
    artifacts += [
        CharDevice(mig_caps.cap_node(cap.minor), settings.caps_major, cap.minor,
                   mig_caps.ACCESS_MODE)
        for cap in mig_caps.capabilities(state)
    ]
    return artifacts


def _check_minors(state: State) -> None:
    """``SpecError`` for a GPU whose minor is a control node's (or out of range).

    ``/dev/nvidia254`` as 195:254 would be ``nvidia-modeset`` under another
    name: a container given that GPU would get the modeset device, and the
    device cgroup rule for one is the rule for the other.
    """
    reserved = {MODESET_MINOR: "nvidia-modeset", CTL_MINOR: "nvidiactl"}
    problems = []
    for gpu in state.gpus:
        where = f"{state.profile_name}: devices[index={gpu.index}].minor_number"
        if gpu.minor in reserved:
            problems.append(
                f"{where}: {gpu.minor} is {reserved[gpu.minor]}'s minor, "
                f"expected 0..{MAX_GPU_MINOR}"
            )
        elif not 0 <= gpu.minor <= MAX_GPU_MINOR:
            problems.append(f"{where}: {gpu.minor}, expected 0..{MAX_GPU_MINOR}")
    if problems:
        raise SpecError(problems)
