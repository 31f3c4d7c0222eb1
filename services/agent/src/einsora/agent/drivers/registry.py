"""The drivers one agent runs workloads with, by name, and which runs a given workload.

A machine may have several (`process`, and `docker` and `libvirt` where their engines answer);
the scheduler names one per workload (`DesiredWorkload.driver`), and a desired state from before
drivers were named gets the agent's default. A record names the driver that wrote it, so a
restarted agent hands it back to the same one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from einsora.agent.drivers.base import Driver


class DriverSet:
    """The agent's drivers by name; `default` runs what names none."""

    def __init__(self, drivers: Iterable[Driver], default: str) -> None:
        self._by_name = {d.name: d for d in drivers}
        if default not in self._by_name:
            raise ValueError(f"the default driver {default} is not among {sorted(self._by_name)}")
        self.default = default

    @property
    def names(self) -> list[str]:
        """Every driver's name, the default first."""
        return [self.default, *sorted(n for n in self._by_name if n != self.default)]

    def __iter__(self) -> Any:
        return iter(self._by_name.values())

    def get(self, name: str | None) -> Driver | None:
        """The driver called `name` (None: the default), or None when this agent has none."""
        return self._by_name.get(name or self.default)

    def of_record(self, record: dict[str, Any]) -> Driver | None:
        """The driver that wrote `record` (records from before drivers were named: the
        default's)."""
        name = record.get("driver")
        return self.get(name if isinstance(name, str) else None)

    def missing(self, name: str | None) -> str:
        """Why a workload naming `name` cannot start here."""
        return (
            f"this machine has no {name} driver (it has {', '.join(self.names)}); its agent "
            "reports which engines it reaches in its inventory"
        )
