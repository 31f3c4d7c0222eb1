"""A machine makes the server publish nowhere but its own keys (issue 34, N17; ADR-0028).

A real nats-server in the accounts layout with the auth callout (`running_lab`, as Lab runs it).
A consumer's deliver subject, and a request's reply subject, are the client's to name, and no
subject permission can hold them to its own inbox: nats-server checks a deliver subject only for
wildcards and cycles, and a reply subject not at all (checked on 2.15.1). So a machine creates no
consumer, and its requests reach the app account through its account's imports, whose answers
come back into the machines' account whatever reply subject it named.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError
from tests.test_bus_callout import M1, M2, Lab, running_lab

from einsora.common.bus import bind_bucket, identities, names, provision
from einsora.common.schemas import DesiredState

WORKLOAD = "w-other-tenant"
ROUTE = b'{"token": "theirs"}'
SETTLE_S = 0.3
"""How long a misdirected answer is given to arrive somewhere (a round trip on the same
connection follows it first)."""


@pytest_asyncio.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    async with running_lab(tmp_path) as lab:
        js = lab.scheduler.jetstream()
        await provision(js)
        machines = bind_bucket(js, names.MACHINES)
        for m in (M1, M2):
            desired = DesiredState(machine_id=m, generation=1, workloads=[])
            await machines.put(names.desired_key(m), desired.to_bytes())
        await bind_bucket(js, names.ROUTES).put(names.route_key(WORKLOAD), ROUTE)
        yield lab


@pytest.mark.parametrize(
    "deliver", [f"{identities.inbox_prefix(M2)}.x", names.event_subject(WORKLOAD), "_INBOX_m1.x"]
)
async def test_a_machine_creates_no_consumer_wherever_it_would_deliver(
    lab: Lab, deliver: str
) -> None:
    m1 = await lab.agent(M1)
    consumer = names.desired_watch_consumer(M1)
    desired = names.MACHINES.key_subject(names.desired_key(M1))
    subject = f"$JS.API.CONSUMER.CREATE.{names.MACHINES.stream}.{consumer}.{desired}"
    body = {
        "stream_name": names.MACHINES.stream,
        "config": {
            "name": consumer,
            "filter_subject": desired,
            "deliver_subject": deliver,
            "ack_policy": "none",
            "deliver_policy": "last_per_subject",
        },
    }
    try:
        await m1.client.refused(subject, m1.nc.request(subject, json.dumps(body).encode(), 1.0))
    finally:
        await m1.nc.close()
    with pytest.raises(NotFoundError):
        await lab.scheduler.jetstream().consumer_info(names.MACHINES.stream, consumer)


async def test_a_machines_answers_come_back_to_its_own_account_whatever_reply_it_names(
    lab: Lab,
) -> None:
    js = lab.scheduler.jetstream()
    before = (await js.stream_info(names.ROUTES.stream)).state.last_seq
    spied: list[Msg] = []

    async def spy(msg: Msg) -> None:
        spied.append(msg)

    scheduler_inbox = f"{identities.inbox_prefix(identities.SCHEDULER)}.spy"
    await lab.scheduler.subscribe(scheduler_inbox, cb=spy)
    await lab.scheduler.flush()
    m1 = await lab.agent(M1)
    try:
        get = f"$JS.API.DIRECT.GET.{names.MACHINES.stream}." + names.MACHINES.key_subject(
            names.desired_key(M1)
        )
        observed = names.MACHINES.key_subject(names.observed_key(M1))
        # Another tenant's route (the routes bucket holds workloads' tokens) and the scheduler's
        # inbox, named as where the server should answer a direct get and a put.
        for reply in (names.ROUTES.key_subject(WORKLOAD), scheduler_inbox):
            await m1.nc.publish(get, b"", reply=reply)
            await m1.nc.publish(observed, b"{}", reply=reply)
        # A round trip of its own after them, then a moment for anything misdirected.
        assert (await m1.kv.get(names.desired_key(M1))).value is not None
        await asyncio.sleep(SETTLE_S)
        assert m1.client.errors == []
    finally:
        await m1.nc.close()
    assert spied == []
    # Nothing was written over the route (the scheduler may list routes, not read them).
    assert (await js.stream_info(names.ROUTES.stream)).state.last_seq == before
