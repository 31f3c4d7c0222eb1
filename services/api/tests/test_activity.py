"""The activity log against a real api, bus and store (SQLite, and Postgres when one answers).

Every mutating route, called once, leaves exactly one row with its request ID, its action and
how it was answered; a refused action is recorded as failed and changed nothing; a ticket's
redemption over the bus is recorded too; another tenant's admin sees none of it and a member
nothing at all; the export is the list, whole, as JSON lines or CSV; old rows are purged.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest_asyncio
import sqlalchemy as sa
from fastapi.routing import APIRoute

from einsora.api import models
from einsora.api.routers import ROUTERS
from einsora.api.services.activity import ACTIONS, REDEEM_ACTION
from einsora.api.store import Action, bound
from einsora.api.testing import (
    Answer,
    Client,
    RunningApi,
    SessionClient,
    eventually,
    new_member,
    new_tenant,
    running_api,
    session_cookie_of,
)
from einsora.common.bus import names
from einsora.common.ids import new_id
from einsora.common.schemas import AccessRedeemReply, AccessRedeemRequest, utcnow
from einsora.common.settings import Settings
from einsora.common.testing import Bus, ManualClock

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


def _mutating_routes() -> dict[str, APIRoute]:
    routes = [r for router in ROUTERS for r in router.routes if isinstance(r, APIRoute)]
    return {r.name: r for r in routes if MUTATING & (r.methods or set())}


async def _rows(api: RunningApi, where: str = "", **params: Any) -> list[dict[str, Any]]:
    assert api.service.store is not None
    # `where` is this module's own literal text; values go in as parameters.
    sql = "SELECT * FROM activity" + (f" WHERE {where}" if where else "") + " ORDER BY seq"  # noqa: S608
    async with api.service.store.read() as conn:
        found = (await conn.execute(sa.text(sql), params)).mappings().all()
    return [dict(r) for r in found]


async def _set_state(api: RunningApi, workload_id: str, state: str) -> None:
    assert api.service.store is not None
    async with api.service.store.write() as conn:
        await conn.execute(
            sa.text("UPDATE workloads SET state = :s WHERE id = :id"),
            {"s": state, "id": workload_id},
        )


@dataclass
class Calls:
    """Each route called with a request ID of its own, and what it answered."""

    made: list[tuple[str, str, str, Answer]] = field(default_factory=list)
    """(route name, request ID, tenant it acted in, answer)"""

    async def call(
        self,
        route: str,
        client: Client,
        method: str,
        path: str,
        body: Any = None,
        *,
        tenant: str,
        status: int,
    ) -> Answer:
        request_id = f"test-{route}-{len(self.made)}"
        answer = await client.call(method, path, body, headers={"X-Request-ID": request_id})
        assert answer.status == status, (route, answer.status, answer.text)
        assert answer.request_id == request_id
        self.made.append((route, request_id, tenant, answer))
        return answer


async def test_every_mutating_route_called_once_leaves_one_row(api_on_store: RunningApi) -> None:
    api = api_on_store
    calls = Calls()
    anon = api.client(None)
    me = (await api.owner.get("/v1/me")).body
    home = me["tenant"]["id"]  # the operator's own tenant, where its actions are recorded

    made = await calls.call(
        "create_tenant", api.owner, "POST", "/v1/tenants", {"name": "acme"}, tenant=home, status=201
    )
    acme = made.body["id"]
    made = await calls.call(
        "invite",
        api.owner,
        "POST",
        f"/v1/tenants/{acme}/invitations",
        {"username": "ann", "role": "admin"},
        tenant=home,
        status=201,
    )
    made = await calls.call(
        "redeem_invitation",
        anon,
        "POST",
        "/v1/invitations/redeem",
        {"code": made.body["code"]},
        tenant=acme,
        status=201,
    )
    ann = api.client(made.body["token"]["token"])
    ann_id = made.body["user"]["id"]
    await calls.call(
        "put_tenant_limits",
        api.owner,
        "PUT",
        f"/v1/tenants/{acme}/limits",
        {"max_workloads": 50},
        tenant=home,
        status=200,
    )
    await calls.call(
        "put_tenant_quota",
        api.owner,
        "PUT",
        f"/v1/tenants/{acme}/quota",
        {"max_gpus_total": 8},
        tenant=home,
        status=200,
    )

    # Workloads: launch, then each action from a state that allows it.
    launched = await calls.call(
        "create_workload",
        ann,
        "POST",
        "/v1/workloads",
        {"kind": "notebook", "class": "cpu-1c-2g"},
        tenant=acme,
        status=201,
    )
    wid = launched.body["id"]
    await _set_state(api, wid, "running")
    await calls.call(
        "create_access", ann, "POST", f"/v1/workloads/{wid}/access", tenant=acme, status=201
    )
    await calls.call(
        "park_workload", ann, "POST", f"/v1/workloads/{wid}/park", tenant=acme, status=202
    )
    await _set_state(api, wid, "parked")
    await calls.call(
        "resume_workload", ann, "POST", f"/v1/workloads/{wid}/resume", tenant=acme, status=202
    )
    await calls.call(
        "remove_workload", ann, "DELETE", f"/v1/workloads/{wid}", tenant=acme, status=202
    )

    # Tokens and gateway keys: made and revoked.
    token = await calls.call(
        "create_token", ann, "POST", "/v1/tokens", {"name": "ci"}, tenant=acme, status=201
    )
    await calls.call(
        "revoke_token", ann, "DELETE", f"/v1/tokens/{token.body['id']}", tenant=acme, status=204
    )
    key = await calls.call(
        "create_gateway_key",
        ann,
        "POST",
        "/v1/gateway/keys",
        {"name": "k"},
        tenant=acme,
        status=201,
    )
    await calls.call(
        "revoke_gateway_key",
        ann,
        "DELETE",
        f"/v1/gateway/keys/{key.body['id']}",
        tenant=acme,
        status=204,
    )

    # Machines: a join token, a join with it, its sharing, reclaim, invitations, revocation.
    join_token = await calls.call(
        "create_join_token",
        ann,
        "POST",
        "/v1/machines/join-tokens",
        {"tunnel": False},
        tenant=acme,
        status=201,
    )
    joined = await calls.call(
        "join",
        anon,
        "POST",
        "/v1/machines/join",
        {"token": join_token.body["token"], "hostname": "box"},
        tenant=acme,
        status=201,
    )
    machine = joined.body["machine_id"]
    await calls.call(
        "revoke_join_token",
        ann,
        "DELETE",
        f"/v1/machines/join-tokens/{join_token.body['id']}",
        tenant=acme,
        status=204,
    )
    await calls.call(
        "share_machine",
        ann,
        "PATCH",
        f"/v1/machines/{machine}",
        {"sharing": "invite-only"},
        tenant=acme,
        status=200,
    )
    await calls.call(
        "reclaim_machine", ann, "POST", f"/v1/machines/{machine}/reclaim", tenant=acme, status=200
    )
    await calls.call(
        "release_machine", ann, "POST", f"/v1/machines/{machine}/release", tenant=acme, status=200
    )
    guest_id, guest = await new_tenant(api, "guest", "gus")
    invitation = await calls.call(
        "invite_to_machine",
        ann,
        "POST",
        f"/v1/machines/{machine}/invitations",
        {"tenant": "guest"},
        tenant=acme,
        status=201,
    )
    await calls.call(
        "accept_machine_invitation",
        guest,
        "POST",
        f"/v1/machine-invitations/{invitation.body['id']}/accept",
        tenant=guest_id,
        status=200,
    )
    await calls.call(
        "revoke_machine_invitation",
        ann,
        "DELETE",
        f"/v1/machines/{machine}/invitations/{invitation.body['id']}",
        tenant=acme,
        status=204,
    )
    await calls.call(
        "revoke_machine", ann, "DELETE", f"/v1/machines/{machine}", tenant=acme, status=204
    )
    sim, sims = {"agent": "m-sim", "count": 2}, "/v1/machines/sim-agents"
    await calls.call("enrol_sim_agent", api.owner, "POST", sims, sim, tenant=home, status=201)

    # Tenant invitations: one revoked, one to an existing user accepted by them.
    open_one = await ann.post(f"/v1/tenants/{acme}/invitations", {"username": "bob"})
    await calls.call(
        "revoke_invitation",
        ann,
        "DELETE",
        f"/v1/tenants/{acme}/invitations/{open_one.body['id']}",
        tenant=acme,
        status=204,
    )
    to_ann = await guest.post(f"/v1/tenants/{guest_id}/invitations", {"username": "ann"})
    await calls.call(
        "accept_invitation",
        ann,
        "POST",
        f"/v1/invitations/{to_ann.body['id']}/accept",
        tenant=acme,
        status=201,
    )

    # Dashboard sessions (ADR-0019): a sign-in link made and opened, a password set and used,
    # a new member's invitation link, a sign-out.
    link = await calls.call(
        "create_sign_in_link", ann, "POST", "/v1/sign-in-links", {}, tenant=acme, status=201
    )
    began = await calls.call(
        "create_session_from_link",
        anon,
        "POST",
        "/v1/sessions/link",
        {"code": link.body["code"]},
        tenant=acme,
        status=201,
    )
    ann_session = SessionClient(
        anon.session, anon.base_url, session_cookie_of(began), began.body["csrf_token"]
    )
    password = "correct horse battery staple"
    await calls.call(
        "set_password",
        ann_session,
        "PUT",
        "/v1/me/password",
        {"password": password},
        tenant=acme,
        status=204,
    )
    await calls.call(
        "create_session",
        anon,
        "POST",
        "/v1/sessions",
        {"username": "ann", "password": password},
        tenant=acme,
        status=201,
    )
    to_cy = await ann.post(f"/v1/tenants/{acme}/invitations", {"username": "cy"})
    await calls.call(
        "create_session_from_invitation",
        anon,
        "POST",
        "/v1/sessions/invitation",
        {"code": to_cy.body["code"], "password": password},
        tenant=acme,
        status=201,
    )
    await calls.call(
        "end_session", ann_session, "DELETE", "/v1/sessions/current", tenant=acme, status=204
    )
    # Offboarding (issue 34, N11): a role changed, a member's credentials revoked, a removal.
    cy = f"/v1/tenants/{acme}/members/cy"
    role = {"role": "admin"}
    await calls.call("set_member_role", ann, "PATCH", cy, role, tenant=acme, status=200)
    await calls.call(
        "revoke_member_credentials", ann, "DELETE", f"{cy}/credentials", tenant=acme, status=200
    )
    await calls.call("remove_member", ann, "DELETE", cy, tenant=acme, status=200)

    assert {route for route, *_ in calls.made} == set(_mutating_routes()), "a route is not called"
    routes = _mutating_routes()
    for route, request_id, tenant, answer in calls.made:
        rows = await _rows(api, "request_id = :r", r=request_id)
        assert len(rows) == 1, (route, rows)
        row = rows[0]
        template = routes[route].path_format
        assert row["action"] == ACTIONS[route]
        assert row["route"].split(" ", 1)[1] == template
        assert (row["tenant_id"], row["outcome"], row["status"]) == (tenant, "ok", answer.status)
        assert row["user_id"] is not None, route
        assert row["target"], route
    by_route = {
        route: (await _rows(api, "request_id = :r", r=rid))[0] for route, rid, *_ in calls.made
    }
    assert by_route["create_workload"]["target"] == wid
    assert by_route["create_workload"]["user_id"] == ann_id
    assert by_route["create_token"]["target"] == token.body["id"]
    assert token.body["token"] not in json.dumps(by_route, default=str)  # never a secret
    # A machine's join is its join token's, and its creator's.
    assert by_route["join"]["token_id"] == join_token.body["id"]
    assert (by_route["join"]["user_id"], by_route["join"]["target"]) == (ann_id, machine)
    assert by_route["redeem_invitation"]["user_id"] == ann_id
    assert by_route["revoke_machine_invitation"]["target"] == invitation.body["id"]
    # A session's actions name the session as their credential, never its secret.
    assert by_route["create_session_from_link"]["token_id"] == began.body["id"]
    assert by_route["end_session"]["target"] == began.body["id"]
    assert by_route["create_session_from_invitation"]["target"] == to_cy.body["id"]
    assert began.body["csrf_token"] not in json.dumps(by_route, default=str)


async def test_a_ticket_redeemed_over_the_bus_is_recorded(api: RunningApi, bus: Bus) -> None:
    acme, ann = await new_tenant(api, "acme", "ann")
    launched = await ann.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    wid = launched.body["id"]
    await _set_state(api, wid, "running")
    minted = await ann.post(f"/v1/workloads/{wid}/access")
    ticket = minted.body["url"].split("ticket=")[1].split("&")[0]

    async def redeem(request_id: str) -> AccessRedeemReply:
        ask = AccessRedeemRequest(ticket=ticket, workload_id=wid, request_id=request_id)
        reply = await bus.nc.request(names.ACCESS_REDEEM_SUBJECT, ask.to_bytes(), timeout=5)
        return AccessRedeemReply.from_bytes(reply.data)

    assert (await redeem("proxy-1")).ok
    assert not (await redeem("proxy-2")).ok  # a ticket works once
    rows = await _rows(api, "action = :a", a=REDEEM_ACTION)
    assert [(r["request_id"], r["outcome"], r["status"]) for r in rows] == [
        ("proxy-1", "ok", 303),
        ("proxy-2", "failed", 403),
    ]
    assert {(r["tenant_id"], r["target"]) for r in rows} == {(acme, wid)}
    assert rows[0]["token_id"] is not None
    assert rows[0]["token_id"] not in ticket
    # An unknown ticket names no tenant: nothing to record, in nobody's log.
    forged = AccessRedeemRequest(ticket="x" * 43, workload_id=wid, request_id="proxy-3")
    await bus.nc.request(names.ACCESS_REDEEM_SUBJECT, forged.to_bytes(), timeout=5)
    assert await _rows(api, "request_id = 'proxy-3'") == []


async def test_a_failed_action_is_recorded_failed_and_changes_nothing(
    api_on_store: RunningApi,
) -> None:
    api = api_on_store
    acme, ann = await new_tenant(api, "acme", "ann")
    await api.owner.call("PUT", f"/v1/tenants/{acme}/limits", {"max_workloads": 1})
    first = await ann.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    refusals = [
        # Over the cap: refused inside the launch's unit of work.
        ("POST", "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"}, 409),
        # A body that breaks the schema, refused before any write.
        ("POST", "/v1/workloads", {"kind": "notebook", "class": "no-such"}, 422),
        # Its state forbids it: refused inside the action's unit.
        ("POST", f"/v1/workloads/{first.body['id']}/resume", None, 409),
        # A write that matched nothing, refused after it.
        ("DELETE", f"/v1/tokens/{new_id('token')}", None, 404),
        ("POST", "/v1/tokens", {"name": "x", "operator": True}, 403),
        # A hostile id, longer than any: refused, and recorded with it cut to the column.
        ("DELETE", f"/v1/tenants/{acme}/invitations/{'x' * 300}", None, 404),
    ]
    for i, (method, path, body, status) in enumerate(refusals):
        answer = await ann.call(method, path, body, headers={"X-Request-ID": f"refused-{i}"})
        assert answer.status == status, answer.text
        rows = await _rows(api, "request_id = :r", r=f"refused-{i}")
        assert [(r["outcome"], r["status"], r["tenant_id"]) for r in rows] == [
            ("failed", status, acme)
        ], (method, path)
    (hostile,) = await _rows(api, "request_id = :r", r=f"refused-{len(refusals) - 1}")
    assert hostile["target"] == "x" * 128
    listed = (await ann.get("/v1/workloads")).body["items"]
    assert [(w["id"], w["state"]) for w in listed] == [(first.body["id"], "pending")]
    # A launch that was refused is recorded as failed in the log the admin reads, too.
    page = (await ann.get("/v1/activity", action="workload.create")).body["items"]
    assert [(e["outcome"], e["status"]) for e in page] == [
        ("failed", 422),
        ("failed", 409),
        ("ok", 201),
    ]
    # No token, no tenant: nobody's log (the access log has it).
    assert (await api.client(None).post("/v1/tokens", {"name": "x"})).status == 401
    assert len(await _rows(api, "tenant_id = :t", t=acme)) == 1 + len(refusals) + 1


async def test_admins_read_only_their_tenants_log_and_members_none(api: RunningApi) -> None:
    acme, ann = await new_tenant(api, "acme", "ann")
    other, olga = await new_tenant(api, "other", "olga")
    carl = await new_member(api, acme, "carl", by=ann)
    launched = await carl.post(
        "/v1/workloads",
        {"kind": "notebook", "class": "cpu-1c-2g"},
        headers={"X-Request-ID": "req-by-carl"},
    )
    assert launched.status == 201
    mine = (await ann.get("/v1/activity")).body["items"]
    assert (mine[0]["request_id"], mine[0]["username"]) == ("req-by-carl", "carl")
    assert {e["tenant_id"] for e in mine} == {acme}
    theirs = await olga.get("/v1/activity")
    assert {e["tenant_id"] for e in theirs.body["items"]} == {other}
    # (a request ID no random id can contain, so its absence means something)
    assert "req-by-carl" not in theirs.text
    assert launched.body["id"] not in theirs.text
    # Another tenant's log is not found, as any of its objects; a member reads none at all.
    assert (await olga.get("/v1/activity", tenant=acme)).status == 404
    assert (await olga.get("/v1/activity/export", tenant=acme)).status == 404
    assert (await carl.get("/v1/activity")).status == 403
    assert (await carl.get("/v1/activity/export")).status == 403
    # The operator names the tenant.
    seen = (await api.owner.get("/v1/activity", tenant=acme)).body["items"]
    assert [e["request_id"] for e in seen] == [e["request_id"] for e in mine]
    # Filters: a user (id or name), an action or every action of a noun, a window of time.
    by_carl = (await ann.get("/v1/activity", user="carl")).body["items"]
    assert [e["action"] for e in by_carl] == ["workload.create", "invitation.redeem"]
    assert (await ann.get("/v1/activity", user=by_carl[0]["user_id"])).body["items"] == by_carl
    nouns = (await ann.get("/v1/activity", action="invitation.*")).body["items"]
    assert {e["action"] for e in nouns} == {"invitation.create", "invitation.redeem"}
    at = by_carl[0]["at"]  # the launch's time: the window from it holds the launch alone
    assert (await ann.get("/v1/activity", user="carl", to=at)).body["items"] == by_carl[1:]
    assert (await ann.get("/v1/activity", user="carl", **{"from": at})).body["items"] == by_carl[:1]
    assert (await ann.get("/v1/activity", cursor="bm9wZQ")).status == 422


async def test_pages_and_the_export_are_the_whole_log(api: RunningApi) -> None:
    acme, ann = await new_tenant(api, "acme", "ann")
    for i in range(5):
        await ann.post("/v1/tokens", {"name": f"t{i}"}, headers={"X-Request-ID": f"tok-{i}"})
    everything: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await ann.get("/v1/activity", params=params)).body
        everything.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    seqs = [e["seq"] for e in everything]
    assert seqs == sorted(set(seqs), reverse=True)
    assert [e["request_id"] for e in everything[:5]] == [f"tok-{i}" for i in reversed(range(5))]

    jsonl = await ann.get("/v1/activity/export", format="jsonl")
    assert jsonl.status == 200
    assert jsonl.headers["Content-Type"].startswith("application/jsonl")
    assert [json.loads(line) for line in jsonl.text.splitlines()] == everything
    as_csv = await ann.get("/v1/activity/export", format="csv", action="token.create")
    assert as_csv.headers["Content-Type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert [r["request_id"] for r in table] == [f"tok-{i}" for i in reversed(range(5))]
    assert {(r["tenant_id"], r["outcome"], r["status"], r["username"]) for r in table} == {
        (acme, "ok", "201", "ann")
    }
    assert (await ann.get("/v1/activity/export", format="xml")).status == 422


async def test_a_change_and_its_row_commit_together_or_not_at_all(
    api_on_store: RunningApi,
) -> None:
    api = api_on_store
    store = api.service.store
    assert store is not None
    tenants = models.tenants

    def action(request_id: str) -> Action:
        made = Action(request_id, "POST", asyncio.current_task())
        made.arm(store, name="tenant.create", route="POST /v1/tenants", at=utcnow(), status=201)
        made.tenant_id = "t-home"
        return made

    def insert(name: str) -> Any:
        return sa.insert(tenants).values(id=new_id("tenant"), name=name, created_at=utcnow())

    # A unit of work and a write block each record their action in their own transaction.
    with bound(action("unit-ok")) as done:
        await store.run(lambda conn: conn.execute(insert("by-unit")))
    assert done.recorded
    with bound(action("block-ok")) as done:
        async with store.write() as conn:
            await conn.execute(insert("by-block"))
    assert done.recorded
    # A row that cannot be written (no time) takes its change with it, and the other way round.
    broken = action("unit-broken")
    broken.at = None
    with bound(broken), contextlib.suppress(sa.exc.IntegrityError):
        await store.run(lambda conn: conn.execute(insert("lost-unit")))
    broken = action("block-broken")
    broken.at = None
    with bound(broken), contextlib.suppress(sa.exc.IntegrityError):
        async with store.write() as conn:
            await conn.execute(insert("lost-block"))
    with bound(action("unit-raised")), contextlib.suppress(sa.exc.IntegrityError):
        await store.run(lambda conn: conn.execute(insert("by-unit")))  # the name is taken
    async with store.read() as conn:
        names_ = set((await conn.execute(sa.select(tenants.c.name))).scalars())
    assert {"by-unit", "by-block"} <= names_
    assert not {"lost-unit", "lost-block"} & names_
    recorded = await _rows(api, "request_id IN ('unit-ok', 'block-ok', 'unit-raised')")
    assert [r["request_id"] for r in recorded] == ["unit-ok", "block-ok"]
    # A task the request started inherits the binding but never writes its row.
    with bound(action("spawned")):
        await asyncio.create_task(store.run(lambda conn: conn.execute(insert("by-task"))))
    assert await _rows(api, "request_id = 'spawned'") == []


async def test_launches_sharing_a_commit_record_one_row_each(api_on_store: RunningApi) -> None:
    api = api_on_store
    _, ann = await new_tenant(api, "acme", "ann")
    body = {"kind": "notebook", "class": "cpu-1c-2g"}
    answers = await asyncio.gather(
        *(ann.post("/v1/workloads", body, headers={"X-Request-ID": f"l-{i}"}) for i in range(24))
    )
    assert {a.status for a in answers} == {201}
    rows = await _rows(api, "action = 'workload.create'")
    assert sorted(r["request_id"] for r in rows) == sorted(f"l-{i}" for i in range(24))
    assert {r["target"] for r in rows} == {a.body["id"] for a in answers}
    # A retried launch (its Idempotency-Key) is a request of its own, on the first's workload.
    keyed = {"Idempotency-Key": "once"}
    first = await ann.post("/v1/workloads", body, headers={**keyed, "X-Request-ID": "k-1"})
    again = await ann.post("/v1/workloads", body, headers={**keyed, "X-Request-ID": "k-2"})
    assert again.headers["Idempotent-Replayed"] == "true"
    retried = await _rows(api, "request_id IN ('k-1', 'k-2')")
    assert [(r["target"], r["status"]) for r in retried] == [(first.body["id"], 201)] * 2


@pytest_asyncio.fixture
async def timed_api(bus: Bus, sqlite_url: str, data_dir: Path) -> AsyncIterator[RunningApi]:
    """The api on a clock the test moves, purging every 50 ms, keeping entries 30 days."""
    settings = Settings(
        nats_url=bus.url,
        database_url=sqlite_url,
        data_dir=data_dir,
        activity_retention_days=30,
    )
    async with running_api(settings, clock=ManualClock(), activity_purge_period_s=0.05) as api:
        yield api


async def test_entries_past_the_retention_are_purged(timed_api: RunningApi) -> None:
    api = timed_api
    clock = api.service.clock
    assert isinstance(clock, ManualClock)
    _, ann = await new_tenant(api, "acme", "ann")
    await ann.post("/v1/tokens", {"name": "old"}, headers={"X-Request-ID": "old"})
    clock.advance(timedelta(days=20).total_seconds())
    await ann.post("/v1/tokens", {"name": "new"}, headers={"X-Request-ID": "new"})
    assert len(await _rows(api, "request_id IN ('old', 'new')")) == 2
    clock.advance(timedelta(days=11).total_seconds())  # "old" is 31 days old, "new" 11

    async def purged() -> bool:
        return [r["request_id"] for r in await _rows(api, "request_id IN ('old', 'new')")] == [
            "new"
        ]

    await eventually(purged)
    assert api.service.activity_retention is not None
    assert api.service.activity_retention.purged >= 1
    newest = (await ann.get("/v1/activity")).body["items"][0]
    assert newest["request_id"] == "new"
