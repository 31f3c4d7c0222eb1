"""Free capacity: what a workload's class asks of a machine, what fits, and the best fit.

A GPU class asks for `count` whole devices of that model and memory (never shared); a CPU class
asks for `cpus * count` cores and `memory_mib * count` MiB. GPU workloads book only their
devices. The rule that chooses among fitting machines is best fit (ADR-0003): the machine left
with the fewest free devices of the class (or the fewest free cores), so whole machines stay
free for large requests.

Only what a machine's owner lends is given (its `lend`: some GPUs by uuid, at most so many
cores and so much memory in total, the owner's own workloads included); the rest stays the
owner's. Free capacity is counted within the lend, so a narrowed machine is filed smaller.

`CapacityIndex` keeps placeable machines bucketed by free capacity, so a placement among a
thousand machines looks at a handful of them, not all.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from weakref import WeakKeyDictionary

from einsora.common.catalog import Accelerator, Catalog, MachineClass
from einsora.common.schemas import Inventory, WorkloadKind
from einsora.scheduler.model import Machine, Workload

CPU_POOL = "cpu"
"""Every CPU class draws on the same cores and memory, so they queue together."""


@dataclass(frozen=True)
class Demand:
    """What one workload asks of one machine."""

    class_name: str
    count: int
    gpu: bool
    cpus: float = 0.0
    memory_mib: int = 0
    runtime: str | None = None
    """An endpoint runtime the machine must offer (`Inventory.runtimes`); None: any machine."""

    @classmethod
    def of(cls, machine_class: MachineClass, count: int, runtime: str | None = None) -> Demand:
        if machine_class.accelerator is Accelerator.cpu:
            return cls(
                machine_class.name,
                count,
                gpu=False,
                cpus=machine_class.cpus * count,
                memory_mib=machine_class.memory_mib * count,
                runtime=runtime,
            )
        return cls(machine_class.name, count, gpu=True, runtime=runtime)

    def without_runtime(self) -> Demand:
        return replace(self, runtime=None)

    @property
    def pool(self) -> str:
        """Workloads of one pool compete for the same resources and queue together."""
        return self.class_name if self.gpu else CPU_POOL


_CHECKED_RUNTIMES = frozenset({"llamacpp", "vllm", "mlx"})
"""Runtimes a machine must offer. A `command` endpoint needs only a driver that runs it."""


def runtime_needed(workload: Workload) -> str | None:
    """The endpoint runtime a machine must offer to run `workload` (None: any machine)."""
    if workload.kind is not WorkloadKind.endpoint:
        return None
    runtime = workload.spec.get("runtime")
    return runtime if isinstance(runtime, str) and runtime in _CHECKED_RUNTIMES else None


_DEMANDS: WeakKeyDictionary[Catalog, dict[tuple[str, int, str | None], Demand]]
_DEMANDS = WeakKeyDictionary()
"""Demands made, per catalog: admission asks for one at every attempt, and a class's size
never changes within a catalog (a class it lacks is asked again: it may be derived later)."""


def demand_of(catalog: Catalog, workload: Workload, class_name: str | None = None) -> Demand | None:
    """What `workload` asks of one machine, as its class (or `class_name`, a fallback step's)
    says; None: a class the catalog lacks."""
    key = (class_name or workload.class_name, workload.count, runtime_needed(workload))
    made = _DEMANDS.get(catalog)
    if made is None:
        made = _DEMANDS[catalog] = {}
    demand = made.get(key)
    if demand is None:
        machine_class = catalog.get(key[0])
        if machine_class is None:
            return None
        demand = made[key] = Demand.of(machine_class, key[1], key[2])
    return demand


@dataclass(frozen=True)
class Grant:
    """What a machine gives a workload: devices by uuid, or cores and memory."""

    machine_id: str
    gpus: tuple[str, ...] = ()
    cpus: float = 0.0
    memory_mib: int = 0


def gpus_by_class(inventory: Inventory, catalog: Catalog) -> dict[str, list[str]]:
    """A machine's healthy GPUs by the catalog classes they serve, in device order.

    The catalog's one match (`Catalog.devices_by_class`), the one `/v1/classes` offers by, so
    the scheduler can place every class the api lists. A device may serve several classes.
    """
    return catalog.devices_by_class(inventory)


def lent_gpus_by_class(machine: Machine) -> dict[str, list[str]]:
    """`machine.gpus_by_class` narrowed to the GPUs its owner lends."""
    if machine.lend is None or machine.lend.gpus is None:
        return machine.gpus_by_class
    return {
        class_name: [uuid for uuid in uuids if machine.lends_gpu(uuid)]
        for class_name, uuids in machine.gpus_by_class.items()
    }


def free_gpus(machine: Machine, class_name: str) -> list[str]:
    booked = machine.booked_gpus()
    return [uuid for uuid in machine.lent_gpus_by_class.get(class_name, []) if uuid not in booked]


def free_cpus(machine: Machine) -> float:
    """Lent cores not booked (below zero while a narrowing waits for guests to leave)."""
    return machine.lent_cpus - machine.used_cpus()


def free_memory_mib(machine: Machine) -> int:
    return machine.lent_memory_mib - machine.used_memory_mib()


def serves(machine: Machine, demand: Demand) -> bool:
    """Whether `machine` offers the endpoint runtime `demand` needs (if it needs one)."""
    return demand.runtime is None or demand.runtime in machine.inventory.runtimes


def fit(machine: Machine, demand: Demand) -> Grant | None:
    """What `machine` would give `demand` now, or None when it does not fit."""
    if not serves(machine, demand):
        return None
    if demand.gpu:
        free = free_gpus(machine, demand.class_name)
        if len(free) < demand.count:
            return None
        return Grant(machine.machine_id, gpus=tuple(free[: demand.count]))
    if free_cpus(machine) < demand.cpus or free_memory_mib(machine) < demand.memory_mib:
        return None
    return Grant(machine.machine_id, cpus=demand.cpus, memory_mib=demand.memory_mib)


def holds_emptied(machine: Machine, demand: Demand, *, lent: bool = True) -> bool:
    """Whether `machine`, emptied, would hold `demand`: within its lend, or (`lent` False) with
    all of its inventory."""
    if not serves(machine, demand):
        return False
    if demand.gpu:
        devices = machine.lent_gpus_by_class if lent else machine.gpus_by_class
        return len(devices.get(demand.class_name, [])) >= demand.count
    cpus = machine.lent_cpus if lent else machine.inventory.cpus
    memory_mib = machine.lent_memory_mib if lent else machine.inventory.memory_mib
    return cpus >= demand.cpus and memory_mib >= demand.memory_mib


def could_ever_fit(machines: Iterable[Machine], demand: Demand, *, lent: bool = True) -> bool:
    """Whether some machine of the region, emptied, would hold `demand` (see `holds_emptied`)."""
    return any(holds_emptied(machine, demand, lent=lent) for machine in machines)


class CapacityIndex:
    """Placeable machines by free capacity, for best-fit lookups in a few steps."""

    def __init__(self) -> None:
        # class -> free device count -> machine ids (a dict as an ordered set)
        self._gpu: dict[str, dict[int, dict[str, None]]] = {}
        self._gpu_at: dict[str, dict[str, int]] = {}
        # (free cores, free MiB, machine id), sorted
        self._cpu: list[tuple[float, int, str]] = []
        self._cpu_at: dict[str, tuple[float, int, str]] = {}

    def update(self, machine: Machine) -> None:
        """Re-file `machine` after its rows, inventory or liveness changed."""
        self.remove(machine.machine_id)
        if not machine.placeable:
            return
        booked = machine.booked_gpus()
        at: dict[str, int] = {}
        for class_name, uuids in machine.lent_gpus_by_class.items():
            free = sum(1 for uuid in uuids if uuid not in booked)
            at[class_name] = free
            buckets = self._gpu.setdefault(class_name, {})
            buckets.setdefault(free, {})[machine.machine_id] = None
        self._gpu_at[machine.machine_id] = at
        entry = (free_cpus(machine), free_memory_mib(machine), machine.machine_id)
        bisect.insort(self._cpu, entry)
        self._cpu_at[machine.machine_id] = entry

    def remove(self, machine_id: str) -> None:
        for class_name, free in self._gpu_at.pop(machine_id, {}).items():
            buckets = self._gpu[class_name]
            bucket = buckets[free]
            del bucket[machine_id]
            if not bucket:
                del buckets[free]
        entry = self._cpu_at.pop(machine_id, None)
        if entry is not None:
            i = bisect.bisect_left(self._cpu, entry)
            del self._cpu[i]

    def best_fit(self, demand: Demand, allowed: Callable[[str], bool] | None = None) -> str | None:
        """The placeable machine that `demand` fits most tightly, or None.

        `allowed` filters machines (the trust filter); the first allowed one in best-fit order
        wins.
        """
        if demand.gpu:
            buckets = self._gpu.get(demand.class_name, {})
            for free in sorted(buckets):
                if free >= demand.count:
                    for machine_id in buckets[free]:
                        if allowed is None or allowed(machine_id):
                            return machine_id
            return None
        i = bisect.bisect_left(self._cpu, (demand.cpus, -1, ""))
        for cpus, memory_mib, machine_id in self._cpu[i:]:
            fits = cpus >= demand.cpus and memory_mib >= demand.memory_mib
            if fits and (allowed is None or allowed(machine_id)):
                return machine_id
        return None

    def free_devices(self, machine_id: str, class_name: str) -> int:
        return self._gpu_at.get(machine_id, {}).get(class_name, 0)
