"""bench/admission.py --deep: what one admission costs the scheduler with a deep queue.

The scheduler's decision path alone, in this process: its book, its intent handling
(`apply_intent`: a create is admitted or queued, with its timeline's reason) and its admission
passes (`admit_queued`, run as the engine runs it after a cycle that freed capacity). The bus and
the store cost the same per admission whatever the queue's depth, and the other phases of
bench/admission.py measure them; here only what grows with depth can show.

For each depth: 250 sim machines of four l40s-48gb each (room for 1,000 one-device launches)
are filled, then `depth` more launches queue behind them, from four tenants whose recent GPU use
is published (fair share on, as accounting makes it, so the order is not simply age). Capacity
is then freed in steps of 100 (placed workloads stop, as their agents would report) and the
queue's next workloads are admitted: admissions per second and scheduler CPU per admission are
measured over those steps, and the cost of queueing a launch over the last 1,000 launches;
each depth is measured five times from a fresh book, and the medians are reported.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

from einsora.common.catalog import Catalog
from einsora.common.schemas import (
    Gpu,
    Inventory,
    SharingLevel,
    TenantUsage,
    WorkloadIntent,
    WorkloadKind,
    WorkloadState,
    utcnow,
)
from einsora.scheduler.admission import admit_queued
from einsora.scheduler.book import Book
from einsora.scheduler.intents import apply_intent
from einsora.scheduler.model import Machine

MACHINES = 250
GPUS_PER_MACHINE = 4
STEP = 100
STEPS = 10
ROUNDS = 5
"""Each depth is measured this many times, from a fresh book; the median is reported."""
TENANTS = {"t-1": 1.0, "t-2": 4.0, "t-3": 9.0, "t-4": 16.0}
"""Each tenant's decayed recent GPU-hours, as accounting publishes them."""


def _book() -> Book:
    book = Book("local", Catalog.load(), community_pool=True, sim_machines=True)
    for i in range(MACHINES):
        machine_id = f"m-{i:04d}"
        inventory = Inventory(
            machine_id=machine_id,
            region="local",
            hostname=machine_id,
            os="linux",
            arch="x86_64",
            cpus=64,
            memory_mib=512 * 1024,
            gpus=[
                Gpu(index=g, uuid=f"{machine_id}-g{g}", model="NVIDIA L40S", memory_mib=46068)
                for g in range(GPUS_PER_MACHINE)
            ],
            drivers=["sim"],
        )
        machine = Machine(machine_id, "local", inventory, generation=1)
        machine.sharing, machine.enrolled = SharingLevel.community, True
        book.add_machine(machine, new=False)
    for tenant, hours in TENANTS.items():
        book.usage[tenant] = TenantUsage(tenant_id=tenant, decayed_gpu_hours=hours)
    return book


def _create(n: int) -> WorkloadIntent:
    tenants = list(TENANTS)
    return WorkloadIntent.model_validate(
        {
            "intent_id": f"i-{n}",
            "action": "create",
            "workload_id": f"w-{n:06d}",
            "tenant_id": tenants[n % len(tenants)],
            "region": "local",
            "kind": WorkloadKind.notebook,
            "class": "l40s-48gb",
            "count": 1,
            "spec": {"image": "jupyter"},
            "at": utcnow() + timedelta(microseconds=n),
        }
    )


def measure(depth: int) -> dict[str, float]:
    """Fill the machines, queue `depth` more, then free and admit in steps."""
    book = _book()
    fill = MACHINES * GPUS_PER_MACHINE
    queue_cpu = 0.0
    for n in range(fill + depth):
        book.begin()
        last = n >= fill + depth - 1000
        start = time.process_time() if last else 0.0
        apply_intent(book, _create(n), f"req-{n}")
        if last:
            queue_cpu += time.process_time() - start
    queued = len(book.queue.get("l40s-48gb", ()))
    assert queued == depth, f"{queued} queued, {depth} expected"
    admitted = 0
    cpu = wall = 0.0
    for _ in range(STEPS):
        running = [w for w in book.workloads.values() if w.state is WorkloadState.scheduled]
        book.begin()
        for workload in running[:STEP]:  # they stop, as their agents would report
            placed = book.row_of(workload)
            assert placed is not None
            book.drop_row(placed[0], workload.workload_id)
            book.transition(workload, WorkloadState.removed, "removed (bench)")
        cpu0, wall0 = time.process_time(), time.perf_counter()
        before = len(book.queue.get("l40s-48gb", ()))
        admit_queued(book)
        cpu += time.process_time() - cpu0
        wall += time.perf_counter() - wall0
        admitted += before - len(book.queue.get("l40s-48gb", ()))
    assert admitted == min(depth, STEP * STEPS), f"{admitted} admitted"
    return {
        "admissions_per_s": admitted / wall,
        "cpu_ms_per_admission": cpu / admitted * 1000,
        "queue_cpu_ms_per_launch": queue_cpu / 1000 * 1000,
    }


def run(
    depths: tuple[int, ...] = (100, 1_000, 5_000, 20_000),
) -> tuple[list[tuple[str, str]], dict[str, float]]:
    """Rows for the table and the figures, the first depth being the shallow case."""
    rows: list[tuple[str, str]] = []
    figures: dict[str, float] = {}
    shallow: dict[str, float] | None = None
    for depth in depths:
        runs = [measure(depth) for _ in range(ROUNDS)]
        got = {name: statistics.median(r[name] for r in runs) for name in runs[0]}
        shallow = shallow or got
        ratio = got["cpu_ms_per_admission"] / shallow["cpu_ms_per_admission"]
        rows.append(
            (
                f"{depth:,} queued",
                f"{got['admissions_per_s']:,.0f} admissions/s, "
                f"{got['cpu_ms_per_admission']:.3f} ms CPU per admission ({ratio:.2f}x shallow), "
                f"{got['queue_cpu_ms_per_launch']:.3f} ms CPU to queue a launch",
            )
        )
        figures[f"deep_{depth}_admissions_per_s"] = round(got["admissions_per_s"], 1)
        figures[f"deep_{depth}_cpu_ms_per_admission"] = round(got["cpu_ms_per_admission"], 4)
        figures[f"deep_{depth}_queue_cpu_ms_per_launch"] = round(got["queue_cpu_ms_per_launch"], 4)
        figures[f"deep_{depth}_cpu_ratio_to_shallow"] = round(ratio, 2)
    return rows, figures
