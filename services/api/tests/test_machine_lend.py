"""What a machine's owner lends Einsora of it, against a real api and a real bus: the lend in
`PATCH /v1/machines/{id}` (a merge patch), checked against the inventory the api knows, put to
the `enrolments` bucket before the answer, and shown with what is usable now (issue 15)."""

from __future__ import annotations

from typing import Any

from einsora.api.testing import (
    Client,
    RunningApi,
    enrolment_on_bus,
    eventually,
    join_machine,
    new_member,
    new_tenant,
)
from einsora.common.bus import bind_bucket, names
from einsora.common.schemas import Enrolment, Gpu, GpuHealth, Inventory
from einsora.common.testing import Bus

WHOLE = {"cpus": 8.0, "memory_mib": 32768, "gpus": ["GPU-a", "GPU-b"]}


async def _reports(api: RunningApi, bus: Bus, machine_id: str) -> None:
    """The machine's agent writes its inventory (8 cores, 32 GiB, two GPUs and a quarantined
    one); returns once the api's view has it."""
    gpus = [
        Gpu(index=i, uuid=f"GPU-{n}", model="NVIDIA L40S", memory_mib=46068)
        for i, n in enumerate("ab")
    ]
    gpus.append(
        Gpu(index=2, uuid="GPU-c", model="NVIDIA L40S", memory_mib=46068).model_copy(
            update={"health": GpuHealth.quarantined}
        )
    )
    inventory = Inventory(
        machine_id=machine_id,
        region="local",
        hostname="box",
        os="linux",
        arch="x86_64",
        cpus=8,
        memory_mib=32768,
        gpus=gpus,
        drivers=["sim"],
    )
    kv = bind_bucket(bus.js, names.MACHINES)
    await kv.put(names.inventory_key(machine_id), inventory.to_bytes())

    async def known() -> bool:
        shown = await api.owner.get(f"/v1/machines/{machine_id}")
        return shown.status == 200 and shown.body["inventory"] is not None

    await eventually(known)


async def _enrolment(bus: Bus, machine_id: str) -> Enrolment:
    found = await enrolment_on_bus(bus.js, machine_id)
    assert found is not None, f"{machine_id} has no enrolment in the bucket"
    return found


async def _lend(client: Client, machine_id: str, lend: Any) -> Any:
    return await client.call("PATCH", f"/v1/machines/{machine_id}", {"lend": lend})


def _lent(enrolment: Enrolment) -> dict[str, Any] | None:
    return None if enrolment.lend is None else enrolment.lend.model_dump(exclude={"v"})


async def test_the_owner_narrows_and_widens_the_lend_and_the_bucket_follows(
    api_on_store: RunningApi, bus: Bus
) -> None:
    api = api_on_store
    _, lab = await new_tenant(api, "lab", "lab-admin")
    machine = await join_machine(api, lab)
    await _reports(api, bus, machine)
    assert (await _enrolment(bus, machine)).lend is None  # all of it, as before there was one
    shown = await lab.get(f"/v1/machines/{machine}")
    assert shown.status == 200, shown.text
    assert shown.body["enrolment"]["lend"] is None
    # Usable: all of it but the quarantined GPU.
    assert shown.body["enrolment"]["usable"] == WHOLE

    narrowed = await _lend(lab, machine, {"cpus": 4, "gpus": ["GPU-b"]})
    assert narrowed.status == 200, narrowed.text
    enrolment = narrowed.body["enrolment"]
    assert enrolment["lend"] == {"cpus": 4, "memory_mib": None, "gpus": ["GPU-b"]}
    assert enrolment["usable"] == {"cpus": 4, "memory_mib": 32768, "gpus": ["GPU-b"]}
    assert enrolment["sharing"] == "private"  # what was not given is kept
    # The scheduler's copy changed before the answer came.
    assert _lent(await _enrolment(bus, machine)) == enrolment["lend"]

    # A merge patch: a field given is set, one left out kept, one given as null lent whole.
    more = await _lend(lab, machine, {"memory_mib": 16384, "gpus": ["GPU-a", "GPU-a"]})
    assert more.status == 200, more.text
    assert more.body["enrolment"]["lend"] == {"cpus": 4, "memory_mib": 16384, "gpus": ["GPU-a"]}
    reset = await _lend(lab, machine, {"cpus": None, "gpus": []})
    assert reset.status == 200, reset.text
    assert reset.body["enrolment"]["lend"] == {"cpus": None, "memory_mib": 16384, "gpus": []}
    assert reset.body["enrolment"]["usable"] == {"cpus": 8, "memory_mib": 16384, "gpus": []}
    assert _lent(await _enrolment(bus, machine)) == reset.body["enrolment"]["lend"]

    async def listed(lend: dict[str, Any] | None) -> bool:
        # The list reads the machines view, which follows the bucket.
        page = await lab.get("/v1/machines")
        items = [m for m in page.body["items"] if m["id"] == machine]
        return bool(items) and items[0]["enrolment"]["lend"] == lend

    await eventually(lambda: listed(reset.body["enrolment"]["lend"]))

    whole = await _lend(lab, machine, None)
    assert whole.status == 200, whole.text
    assert whole.body["enrolment"]["lend"] is None
    assert whole.body["enrolment"]["usable"] == WHOLE
    assert (await _enrolment(bus, machine)).lend is None
    await eventually(lambda: listed(None))
    # Each field null lends all of it too.
    await _lend(lab, machine, {"cpus": 2})
    nulls = await _lend(lab, machine, {"cpus": None, "memory_mib": None, "gpus": None})
    assert nulls.status == 200, nulls.text
    assert nulls.body["enrolment"]["lend"] is None
    assert (await _enrolment(bus, machine)).lend is None


async def test_a_lend_the_machine_cannot_give_is_refused_naming_the_field(
    api_on_store: RunningApi, bus: Bus
) -> None:
    api = api_on_store
    _, lab = await new_tenant(api, "lab", "lab-admin")
    machine = await join_machine(api, lab)
    await _reports(api, bus, machine)
    assert (await _lend(lab, machine, {"cpus": 6})).status == 200

    for bad, field, words in (
        ({"cpus": 0}, "lend.cpus", ""),
        ({"cpus": -1}, "lend.cpus", ""),
        ({"cpus": "4"}, "lend.cpus", ""),
        ({"cpus": 9}, "lend.cpus", "the machine has 8 cores"),
        ({"memory_mib": 1.5}, "lend.memory_mib", ""),
        ({"memory_mib": 32769}, "lend.memory_mib", "the machine has 32768 MiB"),
        ({"gpus": ["GPU-a", "GPU-x"]}, "lend.gpus", "'GPU-x'"),
        ({"gpus": "GPU-a"}, "lend.gpus", ""),
        ({"gpus": [""]}, "lend.gpus.0", ""),
        ({"cores": 4}, "lend.cores", ""),
        ([4], "lend", ""),
    ):
        answer = await _lend(lab, machine, bad)
        assert answer.status == 422, (bad, answer.text)
        assert answer.body["error"] == "validation_error"
        fields = [d["field"] for d in answer.body["details"]]
        assert field in fields, (bad, answer.body)
        assert words in answer.body["message"], (bad, answer.body)
    # Nothing refused changed anything.
    assert _lent(await _enrolment(bus, machine)) == {"cpus": 6, "memory_mib": None, "gpus": None}

    # While the api knows no inventory, the scheduler narrows the lend to what the machine has.
    unknown = await join_machine(api, lab)
    blind = await _lend(lab, unknown, {"cpus": 1000, "gpus": ["GPU-z"]})
    assert blind.status == 200, blind.text
    assert blind.body["enrolment"]["usable"] is None
    assert _lent(await _enrolment(bus, unknown)) == {
        "cpus": 1000,
        "memory_mib": None,
        "gpus": ["GPU-z"],
    }


async def test_only_the_owners_admins_and_the_operator_lend_and_guests_see_the_lend(
    api_on_store: RunningApi, bus: Bus
) -> None:
    api = api_on_store
    lab_id, lab = await new_tenant(api, "lab", "lab-admin")
    member = await new_member(api, lab_id, "lab-member", by=lab)
    _, studio = await new_tenant(api, "studio", "studio-admin")
    _, stranger = await new_tenant(api, "stranger", "stranger-admin")
    machine = await join_machine(api, lab, sharing="invite-only")
    await _reports(api, bus, machine)

    refused = await _lend(member, machine, {"cpus": 2})
    assert refused.status == 403, refused.text
    assert refused.body["request_id"] == refused.request_id
    hidden = await _lend(stranger, machine, {"cpus": 2})
    assert hidden.status == 404  # not shared with it: not told it exists
    assert machine not in str(hidden.body["details"])
    assert (await _lend(lab, "m-nope", {"cpus": 2})).status == 404
    assert (await _enrolment(bus, machine)).lend is None

    by_operator = await _lend(api.owner, machine, {"cpus": 2})
    assert by_operator.status == 200, by_operator.text
    assert _lent(await _enrolment(bus, machine)) == {"cpus": 2, "memory_mib": None, "gpus": None}

    # A guest sees what is lent and usable (public facts of the machine), never its guests.
    invited = await lab.post(f"/v1/machines/{machine}/invitations", {"tenant": "studio"})
    assert invited.status == 201, invited.text
    accepted = await studio.post(f"/v1/machine-invitations/{invited.body['id']}/accept")
    assert accepted.status == 200, accepted.text

    async def guest_sees() -> bool:
        shown = await studio.get(f"/v1/machines/{machine}")
        return shown.status == 200 and shown.body["enrolment"]["lend"] is not None

    await eventually(guest_sees)
    shown = (await studio.get(f"/v1/machines/{machine}")).body["enrolment"]
    assert shown["usable"] == {"cpus": 2, "memory_mib": 32768, "gpus": ["GPU-a", "GPU-b"]}
    assert shown["guests"] is None
    assert (await stranger.get(f"/v1/machines/{machine}")).status == 404
    assert (await lab.get("/v1/machines/m-nope")).status == 404
