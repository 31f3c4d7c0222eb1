"""Classes, regions and machines from the agents' inventories in KV (the test acts as agents)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from einsora.api.testing import RunningApi, eventually, new_tenant
from einsora.common.bus import bind_bucket, names
from einsora.common.schemas import (
    Gpu,
    GpuHealth,
    Inventory,
    ObservedPhase,
    ObservedState,
    ObservedWorkload,
    SharingLevel,
)
from einsora.common.testing import Bus, enrol

HEARTBEAT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _inventory(machine: str, region: str, cpus: int, gib: int, gpus: list[Gpu]) -> Inventory:
    return Inventory(
        machine_id=machine,
        region=region,
        hostname=machine,
        os="linux",
        arch="x86_64",
        cpus=cpus,
        memory_mib=gib * 1024,
        gpus=gpus,
        drivers=["sim"],
    )


def _mac(machine: str, region: str, gib: int) -> Inventory:
    """A Mac as its agent reports it: the chip, and the chip as one GPU of model Apple Silicon."""
    chip = Gpu(index=0, uuid=f"apple-{machine}", model="Apple Silicon", memory_mib=gib * 1024)
    return _inventory(machine, region, 12, gib, [chip]).model_copy(
        update={"apple_chip": "M3 Pro", "unified_memory_mib": gib * 1024, "arch": "arm64"}
    )


async def _all(api: RunningApi, path: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = {"limit": "5"} | ({"cursor": cursor} if cursor else {})
        page = await api.owner.get(path, params=params)
        assert page.status == 200, page.text
        items.extend(page.body["items"])
        cursor = page.body["next_cursor"]
        if cursor is None:
            return items


async def test_machines_classes_and_regions_follow_the_inventories(
    api: RunningApi, bus: Bus
) -> None:
    kv = bind_bucket(bus.js, names.MACHINES)
    l40s = Gpu(index=0, uuid="GPU-1", model="NVIDIA L40S", memory_mib=46068)
    broken = Gpu(
        index=1,
        uuid="GPU-2",
        model="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        health=GpuHealth.quarantined,
    )
    await kv.put(
        names.inventory_key("m-gpu"), _inventory("m-gpu", "lab", 32, 128, [l40s, broken]).to_bytes()
    )
    await kv.put(names.inventory_key("m-small"), _inventory("m-small", "home", 2, 4, []).to_bytes())
    observed = ObservedState(
        machine_id="m-gpu",
        generation_applied=3,
        heartbeat_at=HEARTBEAT,
        workloads=[
            ObservedWorkload(workload_id="w-a", phase=ObservedPhase.running),
            ObservedWorkload(workload_id="w-b", phase=ObservedPhase.removed),
        ],
    )
    await kv.put(names.observed_key("m-gpu"), observed.to_bytes())
    await kv.put(names.inventory_key("m-junk"), b"{not json")
    # Regions are the enrolments' (the api's), whatever an inventory claims; a machine that is
    # not enrolled is listed, but offers nothing anywhere.
    await enrol(bus.js, "m-gpu", region="lab")
    await enrol(bus.js, "m-small", region="home")
    stray = _inventory("m-stray", "lab", 64, 512, [l40s])
    await kv.put(names.inventory_key("m-stray"), stray.to_bytes())

    async def all_seen() -> bool:
        machines = {m["id"]: m for m in (await api.owner.get("/v1/machines")).body["items"]}
        return (
            len(machines) == 3
            and bool(machines.get("m-gpu", {}).get("heartbeat_at"))
            and all(machines[m]["enrolment"] for m in ("m-gpu", "m-small"))
        )

    await eventually(all_seen)
    machines = {m["id"]: m for m in await _all(api, "/v1/machines")}
    assert (machines["m-stray"]["region"], machines["m-stray"]["enrolment"]) == (None, None)
    assert machines["m-gpu"]["region"] == "lab"
    assert machines["m-gpu"]["workloads"] == 1
    assert machines["m-gpu"]["heartbeat_at"] == "2026-11-29T12:00:00Z"
    assert machines["m-gpu"]["inventory"]["gpus"][0]["model"] == "NVIDIA L40S"
    assert machines["m-small"]["heartbeat_at"] is None
    # Another tenant is not told of a private machine that is not theirs; of one they are a
    # guest of, not what runs there, not even how many (the workload is not theirs).
    other_id, other = await new_tenant(api, "other", "olga")
    assert (await other.get("/v1/machines")).body["items"] == []
    await enrol(bus.js, "m-gpu", region="lab", sharing=SharingLevel.invite_only, guests=(other_id,))

    async def listed_to_them() -> bool:
        theirs = {m["id"]: m for m in (await other.get("/v1/machines")).body["items"]}
        return "m-gpu" in theirs

    await eventually(listed_to_them)
    theirs = {m["id"]: m for m in (await other.get("/v1/machines")).body["items"]}
    assert list(theirs) == ["m-gpu"]
    assert theirs["m-gpu"]["workloads"] == 0

    classes = {c["name"]: c for c in await _all(api, "/v1/classes")}
    assert {"cpu-1c-2g", "cpu-2c-4g", "cpu-4c-16g", "cpu-8c-32g", "l40s-48gb"} <= set(classes)
    assert classes["l40s-48gb"]["regions"] == ["lab"]
    assert classes["l40s-48gb"]["accelerator"] == "nvidia"
    assert classes["h100-80gb"]["regions"] == []  # its only GPU is quarantined
    assert classes["cpu-2c-4g"]["regions"] == ["home", "lab"]
    assert classes["cpu-4c-16g"]["regions"] == ["lab"]
    assert classes["apple-silicon-32gb"]["regions"] == []

    regions = await _all(api, "/v1/regions")
    assert [(r["name"], r["machines"], r["scheduler"]["state"]) for r in regions] == [
        ("home", 1, "unknown"),  # no scheduler runs here (test_fallback.py has some)
        ("lab", 1, "unknown"),
        ("local", 0, "unknown"),
    ]

    await kv.delete(names.inventory_key("m-small"))

    async def gone() -> bool:
        machines = {m["id"]: m for m in (await api.owner.get("/v1/machines")).body["items"]}
        return machines["m-small"]["inventory"] is None  # still enrolled, so still listed

    await eventually(gone)


async def test_an_apple_class_is_offered_by_a_mac_with_enough_memory(
    api: RunningApi, bus: Bus
) -> None:
    kv = bind_bucket(bus.js, names.MACHINES)
    await enrol(bus.js, "m-mac", region="home")
    await kv.put(names.inventory_key("m-mac"), _mac("m-mac", "home", 36).to_bytes())

    async def offered() -> bool:
        classes = {c["name"]: c for c in await _all(api, "/v1/classes")}
        return bool(classes["apple-silicon-32gb"]["regions"] == ["home"])

    await eventually(offered)
    classes = {c["name"]: c for c in await _all(api, "/v1/classes")}
    assert classes["apple-silicon-64gb"]["regions"] == []


async def test_a_64_gb_mac_offers_every_apple_class_up_to_64_gb(api: RunningApi, bus: Bus) -> None:
    # The scheduler places the same classes on it (services/scheduler/tests/test_catalog_match.py).
    kv = bind_bucket(bus.js, names.MACHINES)
    await enrol(bus.js, "m-mac64", region="studio")
    await kv.put(names.inventory_key("m-mac64"), _mac("m-mac64", "studio", 64).to_bytes())

    async def offered() -> bool:
        classes = {c["name"]: c for c in await _all(api, "/v1/classes")}
        return bool(classes["apple-silicon-64gb"]["regions"] == ["studio"])

    await eventually(offered)
    classes = await _all(api, "/v1/classes")
    apple = {c["name"] for c in classes if c["accelerator"] == "apple" and c["regions"]}
    assert apple == {"apple-silicon-16gb", "apple-silicon-32gb", "apple-silicon-64gb"}


def test_what_is_free_now_is_what_is_lent_less_what_is_placed() -> None:
    from einsora.api.services.catalog import free_by_class
    from einsora.api.views.machines import MachineRecord
    from einsora.common.catalog import Catalog
    from einsora.common.schemas import Enrolment, Lend

    l40s = [Gpu(index=i, uuid=f"GPU-{i}", model="NVIDIA L40S", memory_mib=46068) for i in range(4)]
    enrolled = Enrolment(machine_id="m-gpu", owner_tenant_id="t-1", region="lab")
    gpu_box = MachineRecord(
        "m-gpu", inventory=_inventory("m-gpu", "lab", 32, 128, l40s), enrolment=enrolled
    )
    # Its owner lends three of the four GPUs and 8 of its 32 cores.
    gpu_box.enrolment = enrolled.model_copy(
        update={"lend": Lend(gpus=["GPU-0", "GPU-1", "GPU-2"], cpus=8)}
    )
    small = MachineRecord(
        "m-small",
        inventory=_inventory("m-small", "home", 4, 8, []),
        enrolment=enrolled.model_copy(update={"machine_id": "m-small", "region": "home"}),
    )
    stray = MachineRecord("m-stray", inventory=_inventory("m-stray", "lab", 64, 512, l40s))
    placed = {"m-gpu": [("l40s-48gb", 2), ("cpu-2c-4g", 1)], "m-small": [("cpu-1c-2g", 3)]}

    free = free_by_class(Catalog(), [gpu_box, small, stray], placed)

    assert free["l40s-48gb"] == 1  # 3 lent, 2 placed; the stray machine is not enrolled
    # m-gpu: 8 lent cores less 2 placed = 6, 128 GiB less 4; m-small: 4 cores less 3, 8 GiB less 6.
    assert free["cpu-2c-4g"] == 3 + 0
    assert free["cpu-1c-2g"] == 6 + 1
    assert "h100-80gb" not in free


def test_classes_are_offered_where_the_callers_machines_lend_them() -> None:
    """`/v1/classes` counts only the machines the caller may use, within what their owners lend;
    a class derived from a device (a MIG profile, an unknown model) is listed only where it is
    offered."""
    from einsora.api.schemas.common import PageQuery
    from einsora.api.services.catalog import list_classes
    from einsora.api.views.machines import MachineRecord
    from einsora.common.catalog import Catalog
    from einsora.common.schemas import Enrolment, Lend

    gpus = [
        Gpu(index=0, uuid="GPU-0", model="NVIDIA L40S", memory_mib=46068),
        Gpu(index=1, uuid="GPU-1", model="NVIDIA H200", memory_mib=143771, mig_mode=True),
        Gpu(
            index=2,
            uuid="MIG-a",
            model="NVIDIA H200 MIG 1g.18gb",
            memory_mib=16384,
            mig=True,
            mig_profile="1g.18gb",
            parent_uuid="GPU-1",
        ),
        Gpu(index=3, uuid="GPU-3", model="NVIDIA RTX PRO 6000 Blackwell", memory_mib=97887),
    ]
    catalog = Catalog()
    enrolled = Enrolment(machine_id="m-lab", owner_tenant_id="t-1", region="lab")
    lab = MachineRecord("m-lab", inventory=_inventory("m-lab", "lab", 32, 256, gpus))
    lab.enrolment = enrolled

    def offered(record: MachineRecord) -> dict[str, list[str]]:
        page = list_classes(catalog, [record], PageQuery(limit=200))
        return {c.name: c.regions for c in page.items if c.accelerator != "cpu"}

    everything = offered(lab)
    assert everything["l40s-48gb"] == ["lab"]
    assert everything["h200-1g.18gb"] == ["lab"]  # the slice's class, derived
    assert everything["rtx-pro-6000-blackwell-96gb"] == ["lab"]  # a model no class names
    assert everything["h200-141gb"] == []  # its only H200 is in MIG mode: never whole
    # Its owner lends only the L40S: the derived classes are not offered, so not listed.
    lab.enrolment = enrolled.model_copy(update={"lend": Lend(gpus=["GPU-0"])})
    lent = offered(lab)
    assert lent["l40s-48gb"] == ["lab"]
    assert "h200-1g.18gb" not in lent
    assert "rtx-pro-6000-blackwell-96gb" not in lent
    # A machine the caller may not use is not passed in (machine_visibility.visible): nothing
    # derived is listed, and the configured classes have no region.
    nothing = list_classes(catalog, [], PageQuery(limit=200))
    assert all(c.regions == [] for c in nothing.items)
    assert not any(c.automatic for c in nothing.items)
