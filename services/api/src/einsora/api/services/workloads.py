"""Workloads: create, read, list, and the user's actions (park, resume, remove).

Each change writes the workload row, a timeline entry and an outbox row in one transaction, so
the intent is never lost and never published for a change that did not commit. A launch names a
class of the catalog and a region the api knows (its own, or one a machine reports), and stays
within its tenant's cap on workloads (`services/limits.py`). Which action is allowed in which
state is `einsora.common.lifecycle`'s table; the api records only the state the user's action
implies (pending, parking, pending again on resume, removing), and everything after comes from
the scheduler's events (`services/timeline.py`).

A workload placed on another tenant's machine is shown with its host (`placement.host`): the
machine's owner can see its data. The owner's tenant comes with the workload's own row (one
outer join with the machines and tenants tables), never from a query per workload.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.consumers.outbox import outbox_row
from einsora.api.errors import Conflict, NotFound, field_error
from einsora.api.pagination import cursor_str, encode_cursor
from einsora.api.schemas.workloads import (
    HostOut,
    PlacementOut,
    WorkloadCreate,
    WorkloadListQuery,
    WorkloadOut,
    WorkloadPage,
    spec_json,
)
from einsora.api.services import endpoints, vms
from einsora.api.services.fallback import ChainContext, check_fallback, has_steps
from einsora.api.services.limits import check_workload_cap, has_own_cap
from einsora.api.store import Store, activity_target, current_action
from einsora.api.views.machines import MachineRecord
from einsora.common import lifecycle
from einsora.common.catalog import Catalog
from einsora.common.ids import is_id, new_id
from einsora.common.schemas import (
    EventKind,
    IntentAction,
    StepKind,
    WorkloadIntent,
    WorkloadKind,
    WorkloadState,
    utcnow,
)
from einsora.store.statements import execute


def next_state(action: IntentAction, current: WorkloadState) -> WorkloadState:
    """The state `action` records from `current` (the lifecycle table), or 409 saying why not."""
    why = lifecycle.refusal(action, current)
    if why is not None:
        raise Conflict(why, code="invalid_state")
    return lifecycle.ACTIONS[action].requested


def check_classes(catalog: Catalog, body: WorkloadCreate) -> None:
    """422 naming the field when `class` names no catalog class (the fallback chain's are
    checked by `fallback.check_fallback`)."""
    if catalog.get(body.class_name) is None:
        raise field_error("class", f"no class {body.class_name!r} in the catalog (see /v1/classes)")


def known_regions(
    default_region: str, machines: Iterable[MachineRecord], schedulers: Iterable[str] = ()
) -> list[str]:
    """The regions a launch (or a region step) may name: this api's own, every region a
    machine is enrolled in, and every region whose scheduler has reported."""
    enrolled = (r.region for r in machines if r.region is not None)
    return sorted({default_region, *enrolled, *schedulers})


def check_region(body: WorkloadCreate, regions: Collection[str]) -> None:
    """422 naming the known regions when `region` is none of them (it would wait for ever)."""
    if body.region is not None and body.region not in regions:
        known = ", ".join(sorted(regions))
        raise field_error(
            "region", f"no region {body.region!r}; the known regions are: {known} (see /v1/regions)"
        )


_COLUMNS = (
    m.workloads.c.id,
    m.workloads.c.tenant_id,
    m.workloads.c.created_by,
    m.workloads.c.name,
    m.workloads.c.kind,
    m.workloads.c.class_name,
    m.workloads.c.count,
    m.workloads.c.region,
    m.workloads.c.spec,
    m.workloads.c.fallback,
    m.workloads.c.fallback_after_s,
    m.workloads.c.current_region,
    m.workloads.c.state,
    m.workloads.c.placed_region,
    m.workloads.c.placed_machine,
    m.workloads.c.placed_class,
    m.workloads.c.created_at,
    m.workloads.c.updated_at,
    m.workloads.c.replica_of,
)


_host = m.tenants.alias("host")
_SHOWN = (
    sa.select(
        *_COLUMNS,
        m.machines.c.owner_tenant_id.label("host_tenant_id"),
        _host.c.name.label("host_tenant_name"),
    )
    .select_from(m.workloads)
    .outerjoin(m.machines, m.machines.c.id == m.workloads.c.placed_machine)
    .outerjoin(_host, _host.c.id == m.machines.c.owner_tenant_id)
)
"""Workloads as answered: with their machine's owner tenant, for the host note."""

_INSERT_WORKLOAD = sa.insert(m.workloads)
_INSERT_TIMELINE = sa.insert(m.timeline)
_INSERT_OUTBOX = sa.insert(m.outbox)


def _host_of(r: Mapping[Any, Any]) -> HostOut | None:
    """Who hosts the workload when its machine is another tenant's (rows read with _SHOWN)."""
    owner, name = r.get("host_tenant_id"), r.get("host_tenant_name")
    if owner is None or owner == r["tenant_id"] or name is None:
        return None
    machine = r["placed_machine"]
    return HostOut(
        machine=machine,
        owner_tenant=name,
        note=f"runs on {machine} owned by {name}, who can see its data",
    )


def _out(r: Mapping[Any, Any]) -> WorkloadOut:
    placement = None
    if r["placed_machine"] is not None:
        placement = PlacementOut(
            region=r["placed_region"] or r["region"],
            machine=r["placed_machine"],
            placed_class=r["placed_class"] or r["class_name"],
            host=_host_of(r),
        )
    return WorkloadOut.model_validate(
        {
            "id": r["id"],
            "tenant_id": r["tenant_id"],
            "name": r["name"],
            "kind": r["kind"],
            "class": r["class_name"],
            "count": r["count"],
            "region": r["region"],
            "spec": json.loads(r["spec"]),
            "fallback": _steps(r["fallback"]),
            "fallback_after_s": r["fallback_after_s"],
            "state": r["state"],
            "placement": placement,
            "created_at": r["created_at"],
            "updated_at": r["updated_at"],
            "replica_of": r["replica_of"],
        }
    )


def _steps(stored: str) -> list[dict[str, Any]]:
    """A stored chain (a list of steps; rows from before issue 20 hold an empty list)."""
    return [{"class": s} if isinstance(s, str) else s for s in json.loads(stored)]


def _intent(action: IntentAction, r: Any, replica: int = 1) -> WorkloadIntent:
    """The intent of `action`, to the region whose scheduler holds the workload now (its own
    until a region step hands it over: ADR-0022)."""
    return WorkloadIntent.model_validate(
        {
            "intent_id": new_id("intent"),
            "action": action,
            "workload_id": r["id"],
            "tenant_id": r["tenant_id"],
            "user_id": r["created_by"],
            "region": r["current_region"] or r["region"],
            "kind": r["kind"],
            "name": r["name"],
            "class": r["class_name"],
            "count": r["count"],
            "spec": json.loads(r["spec"]),
            "fallback": _steps(r["fallback"]),
            "fallback_after_s": r["fallback_after_s"],
            "replica": replica,
        }
    )


def fingerprint(body: WorkloadCreate) -> str:
    """What makes two POSTs the same request, for Idempotency-Key."""
    canonical = json.dumps(body.model_dump(mode="json", by_alias=True), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _replay(conn: sa.Connection, principal: Principal, key: str, print_: str) -> WorkloadOut | None:
    prior = conn.execute(
        sa.select(m.idempotency_keys.c.fingerprint, m.idempotency_keys.c.workload_id).where(
            m.idempotency_keys.c.tenant_id == principal.tenant_id,
            m.idempotency_keys.c.key == key,
        )
    ).first()
    if prior is None:
        return None
    if prior.fingerprint != print_:
        raise Conflict(
            "this Idempotency-Key was used for a different request; use a new key",
            code="idempotency_key_reused",
        )
    row = conn.execute(_SHOWN.where(m.workloads.c.id == prior.workload_id)).one()
    return _out(row._mapping)


async def create(
    store: Store,
    catalog: Catalog,
    principal: Principal,
    body: WorkloadCreate,
    *,
    default_region: str,
    regions: Collection[str],
    default_cap: int,
    request_id: str,
    traceparent: str | None = None,
    idempotency_key: str | None = None,
    machines: Mapping[str, MachineRecord] | None = None,
    waits_because: str | None = None,
    model_dirs: endpoints.ModelDirs = (),
) -> tuple[WorkloadOut, bool]:
    """The new workload (pending) and False, or the first result of this Idempotency-Key and
    True. `default_cap` is the cap of a tenant the operator set none for (0: no cap).
    `machines`: those the caller may use, by id (for machine steps of its fallback chain);
    `waits_because`: why its region's scheduler will not take it now (it is down), a note;
    `model_dirs`: where an endpoint's model is checked here (elsewhere its agent checks it)."""
    check_classes(catalog, body)
    check_region(body, regions)
    replicas = 1
    if body.kind is WorkloadKind.endpoint:
        endpoint = endpoints.check_spec(body.spec)
        await endpoints.check_weights(endpoint, model_dirs)
        replicas = endpoint.replicas
    chain: list[dict[str, Any]] = []
    if body.fallback:
        names = await _endpoint_names(store, principal) if has_steps(body, StepKind.model) else ()
        context = ChainContext(catalog, regions, machines or {}, names)
        chain = check_fallback(body, body.region or default_region, replicas, context)
    if body.kind is WorkloadKind.vm:
        vms.check_vm_spec(body.spec, catalog.get(body.class_name))
    else:
        vms.check_container_spec(body.spec)
    print_ = fingerprint(body) if idempotency_key else ""
    now = utcnow()
    workload_id = new_id("workload")
    row: dict[str, Any] = {
        "id": workload_id,
        "tenant_id": principal.tenant_id,
        "created_by": principal.user_id,
        "name": body.name or f"{body.kind.value}-{workload_id[-6:]}",
        "kind": body.kind.value,
        "class_name": body.class_name,
        "count": body.count,
        "region": body.region or default_region,
        "spec": spec_json(body.spec),
        "fallback": json.dumps(chain),
        "fallback_after_s": body.fallback_after_s,
        "current_region": None,
        "state": WorkloadState.pending.value,
        "placed_region": None,
        "placed_machine": None,
        "placed_class": None,
        "last_seq": -1,
        "created_at": now,
        "updated_at": now,
        "replica_of": None,
    }
    # An endpoint's further replicas: workloads of their own (each placed, timed and routed
    # alone, on another machine when there is one), made and acted on with the first.
    rows = [row] + [
        {**row, "id": new_id("workload"), "replica_of": workload_id} for _ in range(replicas - 1)
    ]
    entries, outboxes = [], []
    for i, each in enumerate(rows):
        said = f"created by {principal.username}"
        if replicas > 1:
            said += f" (replica {i + 1} of {replicas})"
        entries.append(_entry(each["id"], WorkloadState.pending, said, request_id, now))
        if waits_because is not None:
            note = _entry(each["id"], WorkloadState.pending, waits_because, request_id, now)
            entries.append({**note, "kind": EventKind.note.value})
        outboxes.append(
            outbox_row(
                _intent(IntentAction.create, each, replica=i + 1),
                request_id=request_id,
                traceparent=traceparent,
            )
        )
    capped = default_cap > 0 or await has_own_cap(store, principal.tenant_id)
    activity_target(workload_id)  # its activity row joins the launch's unit (`Store.run`)
    action = current_action()

    def insert(conn: sa.Connection) -> WorkloadOut | None:
        """The launch's one transaction (shared with concurrent ones): None when inserted."""
        if idempotency_key:
            prior = _replay(conn, principal, idempotency_key, print_)
            if prior is not None:
                if action is not None:
                    action.target = prior.id  # a replay acts on the first launch's workload
                return prior
        if capped:
            # Counted in the transaction that inserts: concurrent launches cannot all pass.
            check_workload_cap(conn, principal.tenant_id, default_cap, more=len(rows))
        # Statements built once, handed to the driver (`einsora.store.statements`).
        if len(rows) == 1 and len(entries) == 1:
            execute(conn, _INSERT_WORKLOAD, row)
            execute(conn, _INSERT_TIMELINE, entries[0])
            execute(conn, _INSERT_OUTBOX, outboxes[0])
        else:
            execute(conn, _INSERT_WORKLOAD, rows[0])  # before the replicas that refer to it
            if rows[1:]:
                execute(conn, _INSERT_WORKLOAD, rows[1:])
            execute(conn, _INSERT_TIMELINE, entries)
            execute(conn, _INSERT_OUTBOX, outboxes)
        if idempotency_key:
            conn.execute(
                sa.insert(m.idempotency_keys).values(
                    tenant_id=principal.tenant_id,
                    key=idempotency_key,
                    fingerprint=print_,
                    workload_id=workload_id,
                    created_at=now,
                )
            )
        return None

    try:
        prior = await store.run(insert)
    except IntegrityError:
        if body.kind is WorkloadKind.endpoint and await _name_taken(store, principal, row["name"]):
            raise Conflict(
                f"this tenant already has an endpoint named {row['name']!r} (the model name "
                "clients send to the gateway); remove it first, or choose another name",
                code="name_taken",
            ) from None
        if not idempotency_key:
            raise
        # The same key committed by a concurrent request (Postgres): answer with its result.
        prior = await store.query(lambda conn: _replay(conn, principal, idempotency_key, print_))
        if prior is None:
            raise
    if prior is not None:
        return prior, True
    store.outbox_written.set()
    return _out(row), False


async def _endpoint_names(store: Store, principal: Principal) -> set[str]:
    """The names of the tenant's live endpoints (what a model step may name)."""
    stmt = sa.select(m.workloads.c.name).where(
        m.workloads.c.tenant_id == principal.tenant_id, m.ENDPOINT_NAME_TAKEN
    )
    return set(await store.query(lambda conn: conn.execute(stmt).scalars().all()))


async def _name_taken(store: Store, principal: Principal, name: str) -> bool:
    stmt = sa.select(m.workloads.c.id).where(
        m.workloads.c.tenant_id == principal.tenant_id,
        m.workloads.c.name == name,
        m.ENDPOINT_NAME_TAKEN,
    )
    return await store.query(lambda conn: conn.execute(stmt).first()) is not None


def _entry(
    workload_id: str, state: WorkloadState, reason: str, request_id: str, at: datetime
) -> dict[str, Any]:
    """A timeline entry for a transition the user's action made."""
    return {
        "workload_id": workload_id,
        "at": at,
        "kind": EventKind.transition.value,
        "state": state.value,
        "reason": reason,
        "request_id": request_id,
    }


_ACTION_REASONS = {
    IntentAction.park: "park requested by {}",
    IntentAction.resume: "resume requested by {}",
    IntentAction.remove: "removal requested by {}",
}


async def act(
    store: Store,
    principal: Principal,
    workload_id: str,
    action: IntentAction,
    *,
    request_id: str,
    traceparent: str | None = None,
) -> WorkloadOut:
    """Park, resume or remove a workload: its new state, or 404/409."""
    if not is_id(workload_id, "workload"):
        raise NotFound(f"no workload {workload_id!r}")
    reason = _ACTION_REASONS[action].format(principal.username)

    def record(conn: sa.Connection) -> WorkloadOut:
        found = conn.execute(
            sa.select(*_COLUMNS)
            .where(m.workloads.c.id == workload_id, m.workloads.c.tenant_id == principal.tenant_id)
            .with_for_update()
        ).first()
        if found is None:
            raise NotFound(f"no workload {workload_id!r}")
        if found.replica_of is not None:
            raise Conflict(
                f"this workload is a replica of endpoint {found.replica_of}, and acts with it: "
                f"{action.value} {found.replica_of} instead",
                code="replica",
            )
        target = next_state(action, WorkloadState(found.state))
        now = utcnow()
        _record(conn, found._mapping, target, now)
        if found.kind == WorkloadKind.endpoint.value:
            replicas = conn.execute(
                sa.select(*_COLUMNS)
                .where(m.workloads.c.replica_of == workload_id)
                .order_by(m.workloads.c.id)
                .with_for_update()
            ).all()
            for replica in replicas:  # each one the action applies to (a removed one stays)
                if lifecycle.refusal(action, WorkloadState(replica.state)) is None:
                    _record(conn, replica._mapping, lifecycle.ACTIONS[action].requested, now)
        return _out({**found._mapping, "state": target.value, "updated_at": now})

    def _record(
        conn: sa.Connection, r: Mapping[Any, Any], target: WorkloadState, now: datetime
    ) -> None:
        conn.execute(
            sa.update(m.workloads)
            .where(m.workloads.c.id == r["id"])
            .values(state=target.value, updated_at=now)
        )
        execute(conn, _INSERT_TIMELINE, _entry(r["id"], target, reason, request_id, now))
        intent = _intent(action, r)
        execute(
            conn, _INSERT_OUTBOX, outbox_row(intent, request_id=request_id, traceparent=traceparent)
        )

    out = await store.run(record)
    store.outbox_written.set()
    return out


async def get(store: Store, principal: Principal, workload_id: str) -> WorkloadOut:
    if not is_id(workload_id, "workload"):
        raise NotFound(f"no workload {workload_id!r}")
    stmt = _SHOWN.where(
        m.workloads.c.id == workload_id, m.workloads.c.tenant_id == principal.tenant_id
    )
    row = await store.query(lambda conn: conn.execute(stmt).first())
    if row is None:
        raise NotFound(f"no workload {workload_id!r}")
    return _out(row._mapping)


async def list_workloads(
    store: Store, principal: Principal, query: WorkloadListQuery
) -> WorkloadPage:
    """The tenant's workloads, newest first, optionally of one state and kind."""
    stmt = _SHOWN.where(m.workloads.c.tenant_id == principal.tenant_id)
    if query.state is not None:
        stmt = stmt.where(m.workloads.c.state == query.state.value)
    if query.kind is not None:
        stmt = stmt.where(m.workloads.c.kind == query.kind.value)
    before = cursor_str(query.cursor)
    if before is not None:
        stmt = stmt.where(m.workloads.c.id < before)
    stmt = stmt.order_by(m.workloads.c.id.desc()).limit(query.limit + 1)
    rows = await store.query(lambda conn: conn.execute(stmt).all())
    items = [_out(r._mapping) for r in rows[: query.limit]]
    more = len(rows) > query.limit
    return WorkloadPage(items=items, next_cursor=encode_cursor(items[-1].id) if more else None)


async def exists(conn: AsyncConnection, principal: Principal, workload_id: str) -> bool:
    """Whether the caller's tenant has this workload (for routes under a workload)."""
    if not is_id(workload_id, "workload"):
        return False
    found = await conn.scalar(
        sa.select(m.workloads.c.id).where(
            m.workloads.c.id == workload_id, m.workloads.c.tenant_id == principal.tenant_id
        )
    )
    return found is not None
