"""The head-of-line rule (ADR-0030): a queued workload holds back only what it could use itself.

A property test over random machines, owners, sharing, lends, quotas, recent use and queues
checks the rule from first principles (the trust matrix and the machines' sizes, not the
admission code's own sets): no workload waits while a machine it may use has room for it and
nothing ahead of it in its order could use that machine. Then the cases a person meets: another
tenant's launch is not held behind a workload it could never share a machine with, a waiting
workload that leaves lets what it held back go at once, and "how many are ahead" counts only
those that go first.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from hypothesis import given, settings
from hypothesis import strategies as st

from einsora.common.catalog import Catalog
from einsora.common.schemas import (
    Gpu,
    Inventory,
    Lend,
    SharingLevel,
    TenantQuota,
    TenantUsage,
    WorkloadIntent,
    WorkloadKind,
    WorkloadState,
    utcnow,
)
from einsora.scheduler.admission import admit, admit_queued
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import (
    Demand,
    demand_of,
    free_cpus,
    free_gpus,
    free_memory_mib,
    holds_emptied,
)
from einsora.scheduler.intents import apply_intent
from einsora.scheduler.model import Machine, Workload
from einsora.scheduler.trust import may_run

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim, StartScheduler

CATALOG = Catalog.load()
TENANTS = ("t-a", "t-b", "t-c")
CLASSES = ("l40s-48gb", "cpu-2c-4g", "cpu-4c-16g")
NOW = utcnow()


def _machine(
    machine_id: str,
    owner: str,
    *,
    gpus: int = 0,
    cpus: int = 8,
    memory_gib: int = 32,
    sharing: SharingLevel = SharingLevel.private,
    guests: frozenset[str] = frozenset(),
    lend: Lend | None = None,
) -> Machine:
    inventory = Inventory(
        machine_id=machine_id,
        region="local",
        hostname=machine_id,
        os="linux",
        arch="x86_64",
        cpus=cpus,
        memory_mib=memory_gib * 1024,
        gpus=[
            Gpu(index=i, uuid=f"{machine_id}-g{i}", model="NVIDIA L40S", memory_mib=46068)
            for i in range(gpus)
        ],
        drivers=["sim"],
    )
    machine = Machine(machine_id, "local", inventory, generation=1)
    machine.owner_tenant, machine.sharing, machine.guests = owner, sharing, guests
    machine.lend, machine.enrolled = lend, True
    return machine


def _book(*machines: Machine) -> Book:
    book = Book("local", CATALOG, community_pool=True, sim_machines=True)
    for machine in machines:
        book.add_machine(machine, new=False)
    return book


def _workload(n: int, tenant: str, class_name: str, count: int = 1, age_s: float = 0) -> Workload:
    return Workload(
        workload_id=f"w-{n:03d}",
        tenant_id=tenant,
        region="local",
        kind=WorkloadKind.notebook,
        class_name=class_name,
        count=count,
        spec={},
        state=WorkloadState.pending,
        access_token="token",
        created_at=NOW - timedelta(seconds=age_s),
        pending_since=NOW - timedelta(seconds=age_s),
    )


def _launch(book: Book, workload: Workload) -> None:
    book.add_workload(workload)
    demand = demand_of(CATALOG, workload)
    assert demand is not None
    admit(book, workload, demand)


# --- the property ---------------------------------------------------------------------------


def _may_use(book: Book, machine: Machine, workload: Workload, demand: Demand) -> bool:
    """From first principles: the trust matrix, and the machine's size within its lend."""
    return (
        not machine.revoked
        and may_run(
            machine,
            workload.tenant_id,
            None,
            True,
            workload.user_id,
            sim_machines=True,
            kind=workload.kind,
            spec=workload.spec,
        )
        and holds_emptied(machine, demand)
    )


def _has_room(machine: Machine, demand: Demand) -> bool:
    if demand.gpu:
        return len(free_gpus(machine, demand.class_name)) >= demand.count
    return free_cpus(machine) >= demand.cpus and free_memory_mib(machine) >= demand.memory_mib


def _within_quota(book: Book, workload: Workload, demand: Demand) -> bool:
    quota = book.quotas.get(workload.tenant_id)
    if quota is None or not demand.gpu:
        return True
    used = sum(
        len(row.gpus)
        for machine in book.machines.values()
        for row in machine.rows.values()
        if book.workloads[row.workload_id].tenant_id == workload.tenant_id
    )
    return used + demand.count <= quota.max_gpus.get(demand.class_name, 10**6)


def _ahead(book: Book, one: Workload, other: Workload, pool: str) -> bool:
    """Whether `one` comes before `other` in the pool's order (ADR-0014)."""

    def key(w: Workload) -> tuple[object, ...]:
        age = (w.created_at, w.workload_id)  # its queue key while it waited (a launch here)
        if pool != "cpu" and book.usage:
            usage = book.usage.get(w.tenant_id)
            return (usage.decayed_gpu_hours if usage else 0.0, *age)
        return age

    return key(one) < key(other)


def _violations(book: Book) -> list[str]:
    queued = [w for w in book.workloads.values() if w.state is WorkloadState.queued]
    found = []
    for waiting in queued:
        demand = demand_of(CATALOG, waiting)
        assert demand is not None
        if not _within_quota(book, waiting, demand):
            continue
        for machine in book.machines.values():
            if not (_may_use(book, machine, waiting, demand) and _has_room(machine, demand)):
                continue
            wanted = any(
                _ahead(book, other, waiting, demand.pool)
                and (d := demand_of(CATALOG, other)) is not None
                and d.pool == demand.pool
                and _within_quota(book, other, d)
                and _may_use(book, machine, other, d)
                for other in queued
            )
            if not wanted:
                found.append(f"{waiting.workload_id} waits, yet {machine.machine_id} has room")
    return found


def _overtaken(book: Book, placed: list[Workload]) -> list[str]:
    """Workloads just placed on a machine that one still waiting ahead of them may use (the
    other half of the rule: no stream of later workloads starves an earlier one)."""
    queued = [w for w in book.workloads.values() if w.state is WorkloadState.queued]
    found = []
    for workload in placed:
        demand = demand_of(CATALOG, workload)
        machine = book.machines[workload.machine_id or ""]
        for other in queued:
            d = demand_of(CATALOG, other)
            if (
                d is not None
                and d.pool == demand.pool  # type: ignore[union-attr]
                and _ahead(book, other, workload, d.pool)
                and _within_quota(book, other, d)
                and _may_use(book, machine, other, d)
            ):
                found.append(f"{workload.workload_id} overtook {other.workload_id}")
    return found


def _scheduled(book: Book) -> set[str]:
    return {w.workload_id for w in book.workloads.values() if w.state is WorkloadState.scheduled}


def _overbooked(book: Book) -> list[str]:
    return [
        m.machine_id
        for m in book.machines.values()
        if free_cpus(m) < 0
        or free_memory_mib(m) < 0
        or len(m.booked_gpus()) > len(m.inventory.gpus)
    ]


machines_st = st.lists(
    st.tuples(
        st.sampled_from(TENANTS),  # owner
        st.integers(0, 4),  # gpus
        st.sampled_from((4, 8, 16)),  # cpus
        st.sampled_from((8, 16, 64)),  # memory GiB
        st.sampled_from(tuple(SharingLevel)),
        st.frozensets(st.sampled_from(TENANTS), max_size=2),  # invited tenants
        st.booleans(),  # lends less than all
    ),
    min_size=1,
    max_size=5,
)
launches_st = st.lists(
    st.tuples(
        st.sampled_from(TENANTS),
        st.sampled_from(CLASSES),
        st.integers(1, 3),  # count
        st.integers(0, 1000),  # age
    ),
    min_size=1,
    max_size=24,
)


@settings(max_examples=300, deadline=None)
@given(
    machines=machines_st,
    launches=launches_st,
    quotas=st.dictionaries(st.sampled_from(TENANTS), st.integers(0, 3), max_size=2),
    usage=st.dictionaries(st.sampled_from(TENANTS), st.floats(0, 50), max_size=3),
    leave=st.lists(st.integers(0, 23), max_size=6),
)
def test_no_workload_waits_while_a_machine_it_may_use_has_room_nobody_ahead_wants(
    machines: list[tuple[str, int, int, int, SharingLevel, frozenset[str], bool]],
    launches: list[tuple[str, str, int, int]],
    quotas: dict[str, int],
    usage: dict[str, float],
    leave: list[int],
) -> None:
    built = []
    for i, (owner, gpus, cpus, memory, sharing, guests, narrow) in enumerate(machines):
        lend = None
        if narrow:
            lend = Lend(cpus=cpus / 2, memory_mib=memory * 512, gpus=[f"m{i}-g0"] if gpus else [])
        built.append(
            _machine(
                f"m{i}",
                owner,
                gpus=gpus,
                cpus=cpus,
                memory_gib=memory,
                sharing=sharing,
                guests=guests,
                lend=lend,
            )
        )
    book = _book(*built)
    for tenant, cap in quotas.items():
        book.quotas[tenant] = TenantQuota(tenant_id=tenant, max_gpus={"l40s-48gb": cap})
    for tenant, hours in usage.items():
        book.usage[tenant] = TenantUsage(tenant_id=tenant, decayed_gpu_hours=hours)
    workloads = []
    for n, (tenant, class_name, count, age) in enumerate(launches):
        workload = _workload(n, tenant, class_name, count, age)
        workloads.append(workload)
        _launch(book, workload)
        assert _violations(book) == [], f"after launch {n}"
        if workload.state is WorkloadState.scheduled:
            assert _overtaken(book, [workload]) == []
    # Some leave: a waiting one is removed, a placed one stops (its agent said so).
    for i in leave:
        if i >= len(workloads):
            continue
        gone = workloads[i]
        if gone.state is WorkloadState.queued:
            book.dequeue(gone)
            gone.state = WorkloadState.removed
        elif (placed := book.row_of(gone)) is not None:
            book.drop_row(placed[0], gone.workload_id)
            gone.state = WorkloadState.removed
        if book.changes.capacity_freed:  # what the engine does after each cycle
            before = _scheduled(book)
            admit_queued(book)
            book.changes.capacity_freed = False
            now = [book.workloads[i] for i in _scheduled(book) - before]
            assert _overtaken(book, now) == []
        assert _violations(book) == [], f"after {gone.workload_id} left"
    assert _overbooked(book) == []


# --- the cases ------------------------------------------------------------------------------


def test_another_tenants_launch_is_not_held_behind_one_that_could_never_use_its_machine() -> None:
    busy = _machine("m-a", "t-a", cpus=4, memory_gib=16)  # only t-a's
    idle = _machine("m-b", "t-b", cpus=16, memory_gib=64)  # only t-b's
    book = _book(busy, idle)
    _launch(book, first := _workload(1, "t-a", "cpu-4c-16g", age_s=30))
    assert first.machine_id == "m-a"
    _launch(book, waiting := _workload(2, "t-a", "cpu-4c-16g", age_s=20))
    assert waiting.state is WorkloadState.queued  # only m-a would take it, and m-a is full
    _launch(book, other := _workload(3, "t-b", "cpu-2c-4g", age_s=10))
    # Before ADR-0030 it waited behind t-a's workload, on t-b's own idle machine.
    assert (other.state, other.machine_id) == (WorkloadState.scheduled, "m-b")


def test_a_waiting_workload_that_leaves_lets_what_it_held_back_go_at_once() -> None:
    book = _book(_machine("m-1", "t-a", cpus=4, memory_gib=16))
    _launch(book, small := _workload(1, "t-a", "cpu-2c-4g", age_s=30))
    _launch(book, big := _workload(2, "t-a", "cpu-4c-16g", age_s=20))
    _launch(book, later := _workload(3, "t-a", "cpu-2c-4g", age_s=10))
    assert small.machine_id == "m-1"
    assert big.state is WorkloadState.queued
    # It would fit beside `small`, but `big` came first and waits for m-1 (no starving).
    assert later.state is WorkloadState.queued
    assert "1 workload ahead" in later.reason
    book.begin()
    apply_intent(book, _remove_intent(big), "req-remove")
    assert book.changes.capacity_freed  # the engine admits the queue again this cycle
    admit_queued(book)
    assert (later.state, later.machine_id) == (WorkloadState.scheduled, "m-1")


def test_a_workload_its_quota_holds_is_not_counted_ahead() -> None:
    book = _book(_machine("m-1", "t-b", gpus=1, sharing=SharingLevel.community))
    book.quotas["t-a"] = TenantQuota(tenant_id="t-a", max_gpus={"l40s-48gb": 0})
    _launch(book, holder := _workload(1, "t-b", "l40s-48gb", age_s=40))
    _launch(book, over := _workload(2, "t-a", "l40s-48gb", age_s=30))
    _launch(book, waiting := _workload(3, "t-c", "l40s-48gb", age_s=20))
    assert holder.machine_id == "m-1"
    assert over.reason.startswith("quota: 0 of 0 l40s-48gb")
    assert "none ahead" in waiting.reason  # the one ahead is held by its quota: it blocks no one
    _launch(book, behind := _workload(4, "t-b", "l40s-48gb", age_s=10))
    assert "1 workload ahead" in behind.reason


def test_a_deep_queue_is_decided_by_groups_and_placed_in_order() -> None:
    book = _book(*(_machine(f"m{i}", "t-a", gpus=4) for i in range(5)))
    book.usage["t-a"] = TenantUsage(tenant_id="t-a", decayed_gpu_hours=3.0)
    queued = [_workload(n, "t-a", "l40s-48gb", age_s=10_000 - n) for n in range(2_000)]
    for workload in queued:
        _launch(book, workload)
    assert sum(w.state is WorkloadState.scheduled for w in queued) == 20
    assert len(book.queue["l40s-48gb"]) == 1_980
    assert len(book.queue["l40s-48gb"].groups) == 1  # one tenant, one class: one group
    assert "1979 workloads ahead" in queued[-1].reason
    for workload in queued[:20]:
        placed = book.row_of(workload)
        assert placed is not None
        book.drop_row(placed[0], workload.workload_id)
    admit_queued(book)
    assert [w.workload_id for w in queued if w.state is WorkloadState.scheduled][20:] == [
        w.workload_id for w in queued[20:40]
    ]


# --- against a real bus and store: the engine re-admits what a departure released ----------


async def test_on_a_running_scheduler_a_departure_releases_and_other_tenants_go_at_once(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-a", owner="t-a", gpus=0, cpus=4, memory_gib=16)
    await sim.join("m-b", owner="t-b", gpus=0, cpus=16, memory_gib=64)
    await start_scheduler(sqlite_url)
    small = await sim.launch("cpu-2c-4g", tenant_id="t-a")
    await sim.wait_state(small, "scheduled")
    big = await sim.launch("cpu-4c-16g", tenant_id="t-a")
    await sim.wait_state(big, "queued")
    later = await sim.launch("cpu-2c-4g", tenant_id="t-a")
    queued = await sim.wait_state(later, "queued")
    assert "1 workload ahead" in queued.reason  # room beside `small`, but `big` waits for it
    # Another tenant's launch, on its own machine, does not wait behind t-a's.
    other = await sim.launch("cpu-2c-4g", tenant_id="t-b")
    placed = await sim.wait_state(other, "scheduled")
    assert placed.placement is not None
    assert placed.placement.machine == "m-b"
    # `big` leaves the queue: what it held goes in the same cycle, no other event needed.
    await sim.intent("remove", big, "cpu-4c-16g", tenant_id="t-a")
    await sim.wait_state(big, "removed")
    placed = await sim.wait_state(later, "scheduled")
    assert placed.placement is not None
    assert placed.placement.machine == "m-a"


def _remove_intent(workload: Workload) -> WorkloadIntent:
    return WorkloadIntent.model_validate(
        {
            "intent_id": f"i-rm-{workload.workload_id}",
            "action": "remove",
            "workload_id": workload.workload_id,
            "tenant_id": workload.tenant_id,
            "region": "local",
            "kind": workload.kind,
            "class": workload.class_name,
            "count": workload.count,
            "spec": {},
            "at": utcnow(),
        }
    )
