"""Drivers: how the agent runs workloads (`sim` runs nothing, `process` runs local processes)."""

from einsora.agent.drivers.base import Adoption, Driver, Handle, Observation, StartFailed
from einsora.agent.drivers.process import ProcessDriver, ProcessHandle, ProcessOptions
from einsora.agent.drivers.sim import SimDriver, SimHandle, SimOptions

__all__ = [
    "Adoption",
    "Driver",
    "Handle",
    "Observation",
    "ProcessDriver",
    "ProcessHandle",
    "ProcessOptions",
    "SimDriver",
    "SimHandle",
    "SimOptions",
    "StartFailed",
]
