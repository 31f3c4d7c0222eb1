"""The fallback chain as plain functions over the book (ADR-0022): each step type alone, a chain
of three where only the last fits, the chain's timer on an injectable clock, a chain that ends
with nothing and is placed at the right step once room frees, quota and fair share at every
step, and notes that read as sentences."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from einsora.common.catalog import Catalog
from einsora.common.schemas import (
    FallbackStep,
    Gpu,
    Inventory,
    RegionStatus,
    SharingLevel,
    Target,
    TenantQuota,
    TenantUsage,
    WorkloadIntent,
    WorkloadKind,
    WorkloadState,
    utcnow,
)
from einsora.common.testing import ManualClock
from einsora.scheduler import chain as chains
from einsora.scheduler.admission import admit, admit_queued
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import demand_of
from einsora.scheduler.fallback import targets
from einsora.scheduler.intents import apply_intent
from einsora.scheduler.model import Chain, Machine, Workload

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim, StartScheduler

CATALOG = Catalog.load()
MODELS = {"l40s": ("NVIDIA L40S", 46068), "a100": ("NVIDIA A100-SXM4-80GB", 81920)}


def _inventory(machine_id: str, gpus: int = 0, model: str = "l40s", cpus: int = 0) -> Inventory:
    """A GPU machine has one core (no CPU class fits it); a CPU machine 16 by default."""
    name, memory_mib = MODELS[model]
    cpus = cpus or (1 if gpus else 16)
    return Inventory(
        machine_id=machine_id,
        region="local",
        hostname=machine_id,
        os="linux",
        arch="x86_64",
        cpus=cpus,
        memory_mib=64 * 1024,
        gpus=[
            Gpu(index=i, uuid=f"{machine_id}-g{i}", model=name, memory_mib=memory_mib)
            for i in range(gpus)
        ],
        drivers=["sim"],
    )


def _book(*machines: Inventory, clock: ManualClock | None = None) -> Book:
    book = Book("local", CATALOG, community_pool=True, sim_machines=True, clock=clock or utcnow)
    for inventory in machines:
        machine = Machine(inventory.machine_id, "local", inventory, generation=1)
        machine.sharing = SharingLevel.community
        book.add_machine(machine, new=False)
    return book


def _steps(*steps: dict[str, object]) -> list[FallbackStep]:
    return [FallbackStep.model_validate(s) for s in steps]


_n = 0


def _workload(
    class_name: str = "l40s-48gb",
    *steps: dict[str, object],
    count: int = 1,
    after_s: float = 0.0,
    tenant_id: str = "t-1",
    replica: int = 1,
) -> Workload:
    global _n
    _n += 1
    return Workload(
        workload_id=f"w-{_n:04d}",
        tenant_id=tenant_id,
        region="local",
        kind=WorkloadKind.notebook,
        class_name=class_name,
        count=count,
        spec={},
        state=WorkloadState.pending,
        access_token="token",
        created_at=utcnow(),
        pending_since=utcnow() + timedelta(milliseconds=_n),
        chain=Chain(_steps(*steps), after_s=after_s, asked_region="local", replica=replica)
        if steps
        else None,
    )


def _launch(book: Book, workload: Workload) -> Workload:
    book.begin()
    book.add_workload(workload)
    if workload.chain is not None:
        chains.admit(book, workload)
    else:
        demand = demand_of(book.catalog, workload)
        assert demand is not None
        admit(book, workload, demand)
    return workload


def _fill(book: Book, class_name: str, count: int) -> list[Workload]:
    """Plain launches that take `count` devices (or CPU slots) of `class_name`."""
    return [_launch(book, _workload(class_name)) for _ in range(count)]


def _free(book: Book, workload: Workload) -> None:
    """Its agent reported it removed: its devices are free again."""
    placed = book.row_of(workload)
    assert placed is not None
    machine, _ = placed
    book.drop_row(machine, workload.workload_id)
    workload.state = WorkloadState.removed


def _state(workload: Workload) -> WorkloadState:
    """Its state now (read afresh: a decision since the last assert may have moved it)."""
    return workload.state


def _timeline(book: Book, workload: Workload) -> list[tuple[str, str, str]]:
    return [
        (e.event.kind.value, e.event.state.value, e.event.reason)
        for e in book.changes.events
        if e.event.workload_id == workload.workload_id
    ]


def _placement(book: Book, workload: Workload) -> tuple[str, str] | None:
    for e in book.changes.events:
        p = e.event.placement
        if e.event.workload_id == workload.workload_id and p is not None:
            return p.machine, p.placed_class
    return None


# --- each step type on its own --------------------------------------------------------------


def test_a_class_step_places_on_the_next_class_and_says_why() -> None:
    book = _book(_inventory("m-l", gpus=3), _inventory("m-a", gpus=2, model="a100"))
    _fill(book, "l40s-48gb", 3)
    w = _launch(book, _workload("l40s-48gb", {"class": "a100-80gb"}))
    assert w.state is WorkloadState.scheduled
    assert (w.machine_id, w.placed_class) == ("m-a", "a100-80gb")
    assert _placement(book, w) == ("m-a", "a100-80gb")
    assert _timeline(book, w) == [
        ("note", "pending", "l40s-48gb: none free in local (3 of 3 in use); trying a100-80gb"),
        (
            "transition",
            "scheduled",
            "placed on m-a as a100-80gb, fallback step 1 of 1 (best fit: 2 of 2 a100-80gb free)"
            "; driver sim: nothing runs (a simulated machine); given m-a-g0",
        ),
    ]
    # Accounting meters the class it was placed as.
    [metered] = [
        e.event.metered for e in book.changes.events if e.event.workload_id == w.workload_id
    ][-1:]
    assert metered is not None
    assert metered.placed_class == "a100-80gb"
    assert metered.class_name == "l40s-48gb"


def test_a_cpu_class_is_a_step_like_any_other() -> None:
    book = _book(_inventory("m-l", gpus=1), _inventory("m-c", cpus=16))
    _fill(book, "l40s-48gb", 1)
    w = _launch(book, _workload("l40s-48gb", {"class": "cpu-8c-32g"}))
    assert (w.state, w.machine_id, w.placed_class) == (
        WorkloadState.scheduled,
        "m-c",
        "cpu-8c-32g",
    )
    row = book.machines["m-c"].rows[w.workload_id]
    assert (row.gpus, row.cpus, row.memory_mib) == ([], 8, 32 * 1024)


def test_a_machine_step_takes_that_machine_only() -> None:
    book = _book(_inventory("m-1", gpus=1), _inventory("m-2", model="a100", gpus=1))
    book.add_machine(
        Machine("m-3", "local", _inventory("m-3", gpus=2, model="a100"), generation=1), new=False
    )
    book.machines["m-3"].sharing = SharingLevel.community
    _fill(book, "l40s-48gb", 1)
    # a100 anywhere (m-2 or m-3), then a100 on m-3 only: the class step goes first.
    w = _launch(book, _workload("l40s-48gb", {"class": "a100-80gb"}, {"machine": "m-3"}))
    assert w.placed_class == "a100-80gb"
    pinned = _launch(book, _workload("l40s-48gb", {"machine": "m-1"}))
    assert pinned.state is WorkloadState.queued  # m-1's one l40s is taken
    assert "m-1 (l40s-48gb): none free there (1 of 1 in use)" in pinned.reason
    alone = _launch(book, _workload("a100-80gb", {"machine": "m-3"}))
    assert alone.state is WorkloadState.scheduled
    assert alone.machine_id == "m-3"


def test_a_region_step_hands_the_workload_over_and_releases_what_it_held() -> None:
    book = _book(_inventory("m-1", gpus=1))
    _fill(book, "l40s-48gb", 1)
    # The office's scheduler is down: the step is passed over, with the reason.
    book.regions["office"] = RegionStatus(
        region="office", at=utcnow() - timedelta(minutes=5), period_s=5
    )
    w = _launch(book, _workload("l40s-48gb", {"region": "office"}))
    assert w.state is WorkloadState.queued
    assert "region office: region office's scheduler is not reporting" in w.reason
    assert not book.changes.handoffs
    # It comes back: the workload goes on to it, once.
    book.begin()
    book.regions["office"] = RegionStatus(region="office", at=utcnow(), period_s=5)
    chains.region_up(book, "office")
    [handoff] = book.changes.handoffs
    intent = handoff.intent
    assert intent.region == "office"
    assert intent.handover is not None
    assert (intent.handover.step, intent.handover.from_region) == (1, "local")
    assert intent.handover.seq == w.seq
    assert intent.intent_id.startswith("in-")
    assert w.region == "office"
    assert w.workload_id not in book.chained
    assert all(w not in queue for queue in book.queue.values())
    [note] = [e.event for e in book.changes.events if e.event.workload_id == w.workload_id]
    assert note.region == "office"
    assert note.reason == (
        "l40s-48gb: none free in local (1 of 1 in use); trying region office, whose scheduler "
        "takes it from here"
    )


def test_the_next_region_carries_on_from_the_step_and_the_seq() -> None:
    local = _book(_inventory("m-1", gpus=1))
    _fill(local, "l40s-48gb", 1)
    local.regions["office"] = RegionStatus(region="office", at=utcnow(), period_s=5)
    w = _launch(local, _workload("l40s-48gb", {"region": "office"}, {"class": "cpu-2c-4g"}))
    [handoff] = local.changes.handoffs
    office = Book("office", CATALOG, community_pool=True, sim_machines=True)
    m = Machine("m-o", "office", _inventory("m-o", cpus=4), generation=1)
    m.sharing = SharingLevel.community
    office.add_machine(m, new=False)
    office.begin()
    apply_intent(office, handoff.intent, "req-1")
    taken = office.workloads[w.workload_id]
    assert (taken.state, taken.machine_id, taken.placed_class) == (
        WorkloadState.scheduled,
        "m-o",
        "cpu-2c-4g",
    )
    seqs = [e.event.seq for e in office.changes.events]
    assert seqs[0] == w.seq + 1  # its events follow the first region's
    assert [e.event.region for e in office.changes.events] == ["office"] * len(seqs)
    # The same hand-over again changes nothing (the engine drops a seen intent id; the book
    # already holds the workload).
    office.begin()
    apply_intent(office, handoff.intent, "req-1")
    assert not office.changes.events


def test_an_intent_for_a_workload_handed_over_is_passed_on() -> None:
    local = _book(_inventory("m-1", gpus=1))
    _fill(local, "l40s-48gb", 1)
    local.regions["office"] = RegionStatus(region="office", at=utcnow(), period_s=5)
    w = _launch(local, _workload("l40s-48gb", {"region": "office"}))
    local.begin()
    park = WorkloadIntent.model_validate(
        {
            "intent_id": "in-park",
            "action": "park",
            "workload_id": w.workload_id,
            "tenant_id": "t-1",
            "region": "local",
            "kind": "notebook",
            "class": "l40s-48gb",
        }
    )
    apply_intent(local, park, "req-2")
    [passed] = local.changes.handoffs
    assert passed.intent.region == "office"
    assert passed.intent.action.value == "park"
    assert passed.intent.intent_id != "in-park"
    assert passed.intent.forwarded == 1
    assert not local.changes.events  # the first region no longer speaks for it


def test_fewer_replicas_stop_holding_up_the_pool() -> None:
    book = _book(_inventory("m-1", gpus=1))
    [holder] = _fill(book, "l40s-48gb", 1)
    third = _launch(book, _workload("l40s-48gb", {"replicas": 1}, replica=3))
    first = _launch(book, _workload("l40s-48gb", {"replicas": 1}, replica=1))
    behind = _launch(book, _workload("l40s-48gb"))
    assert third.state is first.state is behind.state is WorkloadState.queued
    assert "fewer replicas (1): 1 is enough, so replica 3 waits" in third.reason
    assert "this is replica 1, one of those kept" in first.reason
    book.begin()
    _free(book, holder)
    admit_queued(book)
    # The third replica is older, but it gives way: the first replica goes, and the launch
    # behind holds the pool before the third replica too.
    assert _state(first) is WorkloadState.scheduled
    assert third.state is WorkloadState.queued
    assert behind.state is WorkloadState.queued


def test_model_steps_are_the_gateways_and_no_chain_of_the_scheduler() -> None:
    intent = WorkloadIntent.model_validate(
        {
            "intent_id": "in-x",
            "action": "create",
            "workload_id": "w-x",
            "tenant_id": "t-1",
            "region": "local",
            "kind": "endpoint",
            "class": "l40s-48gb",
            "fallback": [{"model": "small"}],
        }
    )
    book = _book(_inventory("m-1", gpus=1))
    apply_intent(book, intent, None)
    w = book.workloads["w-x"]
    assert w.chain is None
    assert w.state is WorkloadState.scheduled


# --- chains ---------------------------------------------------------------------------------


def test_a_chain_of_three_where_only_the_last_fits() -> None:
    book = _book(
        _inventory("m-l", gpus=1), _inventory("m-a", gpus=1, model="a100"), _inventory("m-c")
    )
    _fill(book, "l40s-48gb", 1)
    _fill(book, "a100-80gb", 1)
    w = _launch(
        book,
        _workload("l40s-48gb", {"class": "a100-80gb"}, {"class": "cpu-4c-16g"}),
    )
    assert (w.machine_id, w.placed_class) == ("m-c", "cpu-4c-16g")
    assert [reason for _, _, reason in _timeline(book, w)] == [
        "l40s-48gb: none free in local (1 of 1 in use); trying a100-80gb",
        "a100-80gb: none free in local (1 of 1 in use); trying cpu-4c-16g",
        "placed on m-c as cpu-4c-16g, fallback step 2 of 2 "
        "(best fit: 16 cores and 64 GiB of 16 cores and 64 GiB free); driver sim: nothing runs "
        "(a simulated machine)",
    ]


def test_fallback_after_s_waits_at_each_step_on_the_books_clock() -> None:
    clock = ManualClock()
    book = _book(_inventory("m-l", gpus=1), _inventory("m-a", gpus=1, model="a100"), clock=clock)
    _fill(book, "l40s-48gb", 1)
    w = _launch(book, _workload("l40s-48gb", {"class": "a100-80gb"}, after_s=60))
    assert w.state is WorkloadState.queued
    assert w.reason == (
        "no step of its fallback chain has room yet: l40s-48gb: none free in local (1 of 1 in "
        "use); it starts on the first of these that frees, in this order, and a100-80gb is "
        f"tried too from {clock.now + timedelta(seconds=60):%H:%M:%S} UTC"
    )
    clock.advance(59)
    book.begin()
    chains.advance(book)
    assert w.state is WorkloadState.queued
    assert not book.changes.events
    clock.advance(1)
    chains.advance(book)
    assert (w.state, w.placed_class) == (WorkloadState.scheduled, "a100-80gb")
    assert next(reason for _, _, reason in _timeline(book, w)) == (
        "l40s-48gb: none free in local (1 of 1 in use); trying a100-80gb"
    )


def test_a_chain_that_ends_with_nothing_is_placed_at_the_first_step_that_frees() -> None:
    book = _book(
        _inventory("m-l", gpus=1), _inventory("m-a", gpus=1, model="a100"), _inventory("m-c")
    )
    [l40s] = _fill(book, "l40s-48gb", 1)
    [a100] = _fill(book, "a100-80gb", 1)
    cpu = _fill(book, "cpu-8c-32g", 2)
    w = _launch(book, _workload("l40s-48gb", {"class": "a100-80gb"}, {"class": "cpu-8c-32g"}))
    assert w.state is WorkloadState.queued
    assert w.reason == (
        "no step of its fallback chain has room: l40s-48gb: none free in local (1 of 1 in "
        "use); a100-80gb: none free in local (1 of 1 in use); cpu-8c-32g: no machine has 8 "
        "cores and 32 GiB free in local; it starts on the first of these that frees, in this "
        "order"
    )
    # A CPU slot and an a100 free in the same cycle: the a100 comes first in the chain.
    book.begin()
    _free(book, cpu[0])
    _free(book, a100)
    admit_queued(book)
    assert (w.state, w.placed_class) == (WorkloadState.scheduled, "a100-80gb")
    assert w.workload_id not in book.chained
    assert all(w not in queue for queue in book.queue.values())
    del l40s


def test_a_chained_workload_keeps_its_turn_in_every_pool_it_waits_in() -> None:
    book = _book(_inventory("m-a", gpus=2, model="a100"), _inventory("m-l", gpus=1))
    _fill(book, "l40s-48gb", 1)
    [a100, _] = _fill(book, "a100-80gb", 2)
    older = _launch(book, _workload("a100-80gb", count=2))  # waits for both a100s
    w = _launch(book, _workload("l40s-48gb", {"class": "a100-80gb"}))
    assert older.state is w.state is WorkloadState.queued
    book.begin()
    _free(book, a100)
    admit_queued(book)
    # One a100 is free, but the older 2-GPU launch is ahead in that pool: strict order holds.
    assert w.state is WorkloadState.queued


# --- quota and fair share at each step ------------------------------------------------------


def test_a_step_past_the_quota_is_passed_over_and_the_note_says_so() -> None:
    book = _book(
        _inventory("m-l", gpus=1), _inventory("m-a", gpus=1, model="a100"), _inventory("m-c")
    )
    _fill(book, "l40s-48gb", 1)
    book.quotas["t-1"] = TenantQuota(tenant_id="t-1", max_gpus={"a100-80gb": 0})
    w = _launch(book, _workload("l40s-48gb", {"class": "a100-80gb"}, {"class": "cpu-2c-4g"}))
    assert w.placed_class == "cpu-2c-4g"
    notes = [reason for kind, _, reason in _timeline(book, w) if kind == "note"]
    assert notes[1] == (
        "a100-80gb: quota: 0 of 0 a100-80gb in use by your tenant; trying cpu-2c-4g"
    )
    assert book.machines["m-a"].rows == {}


def test_fair_share_orders_each_pool_a_chain_waits_in() -> None:
    book = _book(_inventory("m-l", gpus=1), _inventory("m-a", gpus=1, model="a100"))
    book.usage["t-heavy"] = TenantUsage(tenant_id="t-heavy", decayed_gpu_hours=40.0)
    book.usage["t-light"] = TenantUsage(tenant_id="t-light", decayed_gpu_hours=1.0)
    _fill(book, "l40s-48gb", 1)
    [a100] = _fill(book, "a100-80gb", 1)
    heavy = _launch(book, _workload("l40s-48gb", {"class": "a100-80gb"}, tenant_id="t-heavy"))
    light = _launch(book, _workload("l40s-48gb", {"class": "a100-80gb"}, tenant_id="t-light"))
    assert heavy.state is light.state is WorkloadState.queued
    book.begin()
    _free(book, a100)
    admit_queued(book)
    # The heavy tenant asked first; the a100 goes to the tenant with less recent use.
    assert _state(light) is WorkloadState.scheduled
    assert light.placed_class == "a100-80gb"
    assert heavy.state is WorkloadState.queued


def test_a_preempted_workload_that_opted_in_is_placed_again_by_its_chain() -> None:
    book = _book(_inventory("m-l", gpus=1), _inventory("m-a", gpus=1, model="a100"))
    w = _launch(book, _workload("l40s-48gb", {"class": "a100-80gb"}))
    assert w.machine_id == "m-l"
    machine, row = book.row_of(w)  # type: ignore[misc]
    book.begin()
    book.release(machine, row, Target.parked)
    book.transition(w, WorkloadState.preempted, "owner reclaimed the machine (m-l)")
    machine.revoked = True
    book.machine_changed(machine)
    chains.after_eviction(book, w, "preempted from m-l")
    assert (w.state, w.machine_id, w.placed_class) == (
        WorkloadState.scheduled,
        "m-a",
        "a100-80gb",
    )
    assert machine.rows[w.workload_id].target is Target.removed  # its old directory goes
    assert (
        "it opted in to fallback, so it is placed again by its chain" in (_timeline(book, w)[1][2])
    )


def test_the_chain_resolves_into_targets_step_by_step() -> None:
    w = _workload(
        "l40s-48gb",
        {"class": "a100-80gb"},
        {"region": "office"},
        {"model": "small"},
        {"machine": "m-9", "region": "home"},
        {"class": "cpu-2c-4g"},
        {"replicas": 1},
    )
    assert [(t.region, t.class_name, t.machine, t.label()) for t in targets(w)] == [
        ("local", "l40s-48gb", None, "l40s-48gb"),
        ("local", "a100-80gb", None, "a100-80gb"),
        ("office", "a100-80gb", None, "region office"),
        ("home", "a100-80gb", "m-9", "m-9 (a100-80gb)"),
        ("home", "cpu-2c-4g", None, "cpu-2c-4g"),
        ("home", "cpu-2c-4g", None, "fewer replicas (1)"),
    ]


# --- through the service ------------------------------------------------------------------


async def test_a_chains_timer_and_progress_survive_a_restart(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    clock = ManualClock()
    await sim.join("m-l", gpus=1)
    await sim.join("m-a", gpus=1, gpu_class="a100-80gb")
    first = await start_scheduler(sqlite_url, clock=clock)
    holder = await sim.launch()
    await sim.wait_state(holder, "scheduled")
    chained = await sim.launch(fallback=[{"class": "a100-80gb"}], fallback_after_s=60)
    queued = await sim.wait_state(chained, "queued")
    assert "a100-80gb is tried too from" in queued.reason
    await first.stop()
    clock.advance(61)  # its wait at the first step passed while no scheduler ran
    await start_scheduler(sqlite_url, clock=clock)
    placed = await sim.wait_state(chained, "scheduled")
    assert placed.placement is not None
    assert (placed.placement.machine, placed.placement.placed_class) == ("m-a", "a100-80gb")
    assert "l40s-48gb: none free in local (1 of 1 in use); trying a100-80gb" in sim.notes(chained)
    await sim.until(lambda: sim.entry("m-a", chained), what="its desired state")
    assert sim.entry("m-a", chained).class_name == "a100-80gb"  # type: ignore[union-attr]
