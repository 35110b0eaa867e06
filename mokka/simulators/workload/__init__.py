"""workload: GPUs that pods hold look busy.

The kubelet's pod-resources API says which container holds which GPU; the
``workload`` daemon polls it and writes who holds what beside the engine
config, and the mock NVML library turns holders into processes, memory use,
utilization, power and temperature.  See docs/workloads.md.
"""

from __future__ import annotations

import argparse

from mokka.simulators.registry import SimulatorPlugin
from mokka.simulators.workload.settings import WorkloadSettings, add_arguments
from mokka.simulators.workload.simulator import OWNER, WorkloadSimulator

__all__ = ["OWNER", "PLUGIN", "WorkloadSettings", "WorkloadSimulator"]


def _build(args: argparse.Namespace) -> WorkloadSimulator:
    """The plugin's factory: one simulator per daemon, settings from its flags."""
    return WorkloadSimulator(settings=WorkloadSettings.from_args(args))


PLUGIN = SimulatorPlugin(name="workload", add_arguments=add_arguments, build=_build)
