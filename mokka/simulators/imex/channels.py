"""IMEX channel device nodes and the fabric-imex-mgmt capability file.

With IMEX on, the real driver exposes one character device per IMEX channel,
``/dev/nvidia-caps-imex-channels/channel<i>`` (major: the dynamic
``nvidia-caps-imex-channels`` major, minor: the channel number), and the
procfs capability file the IMEX daemon checks before it manages the fabric.
The DRA driver hands a ComputeDomain's channel to its pods by device path,
so these must be real character devices with the major the ``/proc/devices``
overlay announces.
"""

from __future__ import annotations

from mokka.layout import DRIVER_DEV, DRIVER_PROC
from mokka.noderoot import CharDevice, File

#: Directory of the channel nodes in the driver root.
CHANNEL_DIR = f"{DRIVER_DEV}/nvidia-caps-imex-channels"
#: The capability file the IMEX daemon reads (``nvidia-imex`` refuses to run
#: fabric management without it).
CAPABILITY_FILE = f"{DRIVER_PROC}/capabilities/fabric-imex-mgmt"
#: Its content on a real host: minor 512 of ``nvidia-caps``, mode 0666 (438),
#: the driver does not modify the device file.
CAPABILITY_TEXT = "DeviceFileMinor: 512\nDeviceFileMode: 438\nDeviceFileModify: 0\n"
#: Mode of every channel node: world read/write, as the driver creates them
#: (access is controlled by which channels a container is given).
CHANNEL_MODE = 0o666


def channel_path(index: int) -> str:
    return f"{CHANNEL_DIR}/channel{index}"


def channel_artifacts(count: int, major: int) -> list[CharDevice]:
    """``channel0`` .. ``channel<count-1>``, char ``<major>:<i>``."""
    return [CharDevice(channel_path(i), major, i, CHANNEL_MODE) for i in range(count)]


def capability_artifact() -> File:
    return File(CAPABILITY_FILE, CAPABILITY_TEXT, 0o444)
