"""Machine enrolment: join tokens, the join exchange, the machine's own credential, revocation.

A join token (`agt_…`) is made by an operator or a tenant admin, for machines that will be that
tenant's, owned by its creator, in the token's region with its sharing level: those come from
here, never from what an agent reports. An agent exchanges the token once (`join`) for its
machine id and its own credential (`agk_…`); both secrets have 256 random bits and are stored
only as their SHA-256. A single-use token used twice, an expired or revoked one, answers the
same 401 (which of them is not told to whoever holds a stolen token). A join reads its token
(by its digest) before anything else: only one that checks out leads to a write, so a flood of
bad joins holds up nobody's writes (one at a time on SQLite) and leaves no trace in the store.
Revoking a machine keeps its row, so its credential is refused for good and everything it
reports stays ignored.

A machine's `Enrolment` is read from here whole, its `guests` included (the tenants whose
machine invitation was accepted and not revoked, `services/machine_invitations.py`): every put to
the `enrolments` bucket and the repair pass take it from `enrolment_of` or `enrolments`. Its
`lend` (what the owner lends Einsora of the machine) is stored in the `lend_*` columns.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from ipaddress import IPv4Network, IPv6Network, ip_address, ip_network
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal, secret_hash
from einsora.api.errors import Forbidden, NotFound, Unauthenticated, Unavailable, Unprocessable
from einsora.api.pagination import keyset_page
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.machines import (
    JoinRequest,
    JoinTokenCreate,
    JoinTokenOut,
    JoinTokenPage,
    MachineEnrolment,
    MachineLend,
    MachineUsable,
)
from einsora.api.store import Store, activity_actor, activity_target
from einsora.common.bus.names import is_subject_token
from einsora.common.ids import is_id, new_id
from einsora.common.schemas import Enrolment, Inventory, Lend, SharingLevel, utcnow

log = logging.getLogger("einsora.api.views.machines")

JOIN_TOKEN_PREFIX = "agt_"  # noqa: S105 (a prefix, not a secret)
CREDENTIAL_PREFIX = "agk_"

_t = m.join_tokens.c
_m = m.machines.c
_i = m.machine_invitations.c


def _secret(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def may_enrol(principal: Principal) -> None:
    """Operators and tenant admins enrol machines; a member may not."""
    if not (principal.is_operator or principal.is_admin):
        raise Forbidden("only a tenant admin or the operator enrols machines")


def networks(text: str) -> list[IPv4Network | IPv6Network]:
    """`EINSORA_DIRECT_MACHINE_NETWORKS` as networks (an entry that is none is skipped, and
    said in the log)."""
    found: list[IPv4Network | IPv6Network] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            found.append(ip_network(item, strict=False))
        except ValueError:
            log.warning("not a network in EINSORA_DIRECT_MACHINE_NETWORKS", extra={"entry": item})
    return found


def _within(address: str, allowed: list[IPv4Network | IPv6Network]) -> bool:
    try:
        ip = ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in allowed)


def may_make_direct(principal: Principal, body: JoinTokenCreate, allowed: str) -> None:
    """A machine reached directly is reached at an address the control plane connects to, so
    making one is the operator's decision, or an admin's within networks the operator set
    (ADR-0026)."""
    if body.tunnel or principal.is_operator:
        return
    nets = networks(allowed)
    if not nets:
        raise Forbidden(
            "only the operator makes join tokens for machines reached directly (tunnel: false): "
            "make a tunnelled token, or ask the operator to set EINSORA_DIRECT_MACHINE_NETWORKS"
        )
    if body.address is not None and not _within(str(body.address), nets):
        raise Forbidden(
            f"{body.address} is not in the networks the operator allows direct machines in "
            "(EINSORA_DIRECT_MACHINE_NETWORKS)"
        )


def direct_address(token: Any, peer: str | None, allowed: str) -> str:
    """Where a machine joining directly with `token` is reached: the address it joined from,
    which must be the one the token names (if it names one) and, for a token an admin made, in
    the networks the operator allows. Refused (403) otherwise, its use kept."""
    if peer is None:
        raise Forbidden("the address this join came from is not known, so no direct machine")
    if token.address is not None and peer != token.address:
        raise Forbidden(
            f"this token is for a machine joining from {token.address}, not from {peer}"
        )
    if not token.by_operator and not _within(peer, networks(allowed)):
        raise Forbidden(
            f"{peer} is not in the networks the operator allows direct machines in "
            "(EINSORA_DIRECT_MACHINE_NETWORKS)"
        )
    return peer


@dataclass(frozen=True)
class NewJoinToken:
    """A join token just made: its secret, shown once."""

    id: str
    token: str
    region: str
    expires_at: datetime
    created_at: datetime


async def create_join_token(
    store: Store,
    principal: Principal,
    body: JoinTokenCreate,
    *,
    default_region: str,
    now: datetime | None = None,
    direct_networks: str = "",
) -> NewJoinToken:
    """A token for machines of the caller's tenant, committed."""
    may_enrol(principal)
    may_make_direct(principal, body, direct_networks)
    region = body.region or default_region
    if not is_subject_token(region, 64):
        raise Unprocessable(
            f"not a region name: {region!r} (letters, digits, `-` and `_`)",
            details=[{"field": "region", "message": "not a region name", "type": "value_error"}],
        )
    now = now or utcnow()
    token = _secret(JOIN_TOKEN_PREFIX)
    token_id = new_id("join_token")
    activity_target(token_id)
    expires_at = now + timedelta(hours=body.expires_in_hours)
    async with store.write() as conn:
        await conn.execute(
            sa.insert(m.join_tokens).values(
                id=token_id,
                tenant_id=principal.tenant_id,
                user_id=principal.user_id,
                name=body.name,
                secret_sha256=secret_hash(token),
                region=region,
                sharing=body.sharing.value,
                tunnel=body.tunnel,
                address=None if body.tunnel or body.address is None else str(body.address),
                by_operator=principal.is_operator,
                max_uses=body.uses,
                uses=0,
                created_at=now,
                expires_at=expires_at,
            )
        )
    return NewJoinToken(token_id, token, region, expires_at, now)


def _token_out(row: Any) -> JoinTokenOut:
    return JoinTokenOut(
        id=row.id,
        name=row.name,
        region=row.region,
        sharing=SharingLevel(row.sharing),
        uses=row.max_uses,
        used=row.uses,
        tunnel=row.tunnel,
        expires_at=row.expires_at,
        created_at=row.created_at,
    )


async def list_join_tokens(store: Store, principal: Principal, query: PageQuery) -> JoinTokenPage:
    """The tenant's join tokens that are not revoked (never a secret), oldest first."""
    may_enrol(principal)
    stmt = sa.select(m.join_tokens).where(
        _t.tenant_id == principal.tenant_id, _t.revoked_at.is_(None)
    )
    async with store.read() as conn:
        items, cursor = await keyset_page(conn, stmt, _t.id, query, _token_out, lambda t: t.id)
    return JoinTokenPage(items=items, next_cursor=cursor)


async def revoke_join_token(
    store: Store, principal: Principal, token_id: str, *, now: datetime | None = None
) -> None:
    may_enrol(principal)
    if not is_id(token_id, "join_token"):
        raise NotFound(f"no join token {token_id!r}")
    async with store.write() as conn:
        result = await conn.execute(
            sa.update(m.join_tokens)
            .where(_t.id == token_id, _t.tenant_id == principal.tenant_id, _t.revoked_at.is_(None))
            .values(revoked_at=now or utcnow())
        )
    if result.rowcount != 1:
        raise NotFound(f"no join token {token_id!r}")


@dataclass(frozen=True)
class Joined:
    """A machine just enrolled: its credential (shown once) and its enrolment."""

    credential: str
    enrolment: Enrolment


_REFUSED = "this join token is unknown, used up, expired or revoked"


def _usable(token: Any, now: datetime) -> bool:
    return bool(token.revoked_at is None and token.expires_at > now and token.uses < token.max_uses)


async def join(
    store: Store,
    body: JoinRequest,
    *,
    now: datetime | None = None,
    hub_running: bool = True,
    peer: str | None = None,
    direct_networks: str = "",
) -> Joined:
    """Spend one use of the token and enrol a new machine, in one unit of work, once a read
    found the token usable.

    `hub_running`: whether this control plane runs a tunnel hub; a token for tunnelled machines
    is refused without one (and its use kept), rather than enrolling a machine nobody reaches.
    `peer`: the address the join came from, where a direct machine is reached (`direct_address`).
    """
    if not body.token.startswith(JOIN_TOKEN_PREFIX):
        raise Unauthenticated(_REFUSED, code="join_token_invalid")
    now = now or utcnow()
    found = sa.select(m.join_tokens).where(_t.secret_sha256 == secret_hash(body.token))
    token = await store.query(lambda conn: conn.execute(found).first())
    if token is None or not _usable(token, now):
        raise Unauthenticated(_REFUSED, code="join_token_invalid")
    credential = _secret(CREDENTIAL_PREFIX)
    machine_id = new_id("machine")
    # A join is the token's: its row names the token and its creator, and the machine.
    activity_actor(tenant_id=token.tenant_id, user_id=token.user_id, token_id=token.id)
    activity_target(machine_id)
    if token.tunnel and not hub_running:
        raise Unavailable(
            "this control plane runs no tunnel hub, so a machine that accepts no inbound "
            "connection cannot be reached: start the proxy (it runs the hub), or make a "
            "token with `tunnel: false`"
        )
    if token.tunnel and body.tunnel_key is None:
        raise Unprocessable(
            "this token is for a machine reached through its tunnel: send `tunnel_key`",
            details=[{"field": "tunnel_key", "message": "required", "type": "missing"}],
        )
    address = None if token.tunnel else direct_address(token, peer, direct_networks)
    async with store.write() as conn:
        # The use is taken by a conditional update, so two machines racing for the last use
        # cannot both have it, nor one have it from a token revoked or expired since the read.
        spent = await conn.execute(
            sa.update(m.join_tokens)
            .where(
                _t.id == token.id,
                _t.uses < _t.max_uses,
                _t.revoked_at.is_(None),
                _t.expires_at > now,
            )
            .values(uses=_t.uses + 1)
        )
        if spent.rowcount != 1:
            raise Unauthenticated(_REFUSED, code="join_token_invalid")
        enrolment = Enrolment(
            machine_id=machine_id,
            owner_tenant_id=token.tenant_id,
            owner_user_id=token.user_id,
            region=token.region,
            sharing=SharingLevel(token.sharing),
            tunnel=token.tunnel,
            tunnel_key=body.tunnel_key,
            address=address,
            enrolled_at=now,
        )
        await conn.execute(
            sa.insert(m.machines).values(
                id=machine_id,
                owner_tenant_id=token.tenant_id,
                owner_user_id=token.user_id,
                region=token.region,
                sharing=token.sharing,
                hostname=body.hostname,
                credential_sha256=secret_hash(credential),
                tunnel=token.tunnel,
                tunnel_key=body.tunnel_key,
                address=address,
                join_token_id=token.id,
                enrolled_at=now,
            )
        )
    return Joined(credential, enrolment)


async def enrol_own(
    store: Store,
    machine_ids: list[str],
    *,
    owner_tenant_id: str,
    region: str,
    hostname: str,
    now: datetime | None = None,
) -> list[Enrolment]:
    """Enrol the control plane's own machines (Solo's, reached directly, with the nkey Solo
    made for them), once; an existing row is kept as it is (a revoked one stays revoked)."""
    now = now or utcnow()
    async with store.write() as conn:
        have = set((await conn.execute(sa.select(_m.id).where(_m.id.in_(machine_ids)))).scalars())
        fresh = [i for i in machine_ids if i not in have]
        if fresh:
            await conn.execute(
                sa.insert(m.machines),
                [
                    {
                        "id": i,
                        "owner_tenant_id": owner_tenant_id,
                        "owner_user_id": None,
                        "region": region,
                        "sharing": SharingLevel.private.value,
                        "hostname": hostname,
                        "credential_sha256": None,
                        "tunnel": False,
                        "tunnel_key": None,
                        "join_token_id": None,
                        "enrolled_at": now,
                    }
                    for i in fresh
                ],
            )
    return [e for e in (await enrolments(store)).values() if e.machine_id in machine_ids]


def lend_of(row: Any) -> Lend | None:
    """The lend the machine's row stores (None: all of its inventory)."""
    gpus = None if row.lend_gpus is None else [str(uuid) for uuid in json.loads(row.lend_gpus)]
    lend = Lend(cpus=row.lend_cpus, memory_mib=row.lend_memory_mib, gpus=gpus)
    return None if lend.everything else lend


def lend_columns(lend: Lend | None) -> dict[str, Any]:
    """The `machines` columns that store `lend` (None: all of the inventory)."""
    lend = lend or Lend()
    return {
        "lend_cpus": lend.cpus,
        "lend_memory_mib": lend.memory_mib,
        "lend_gpus": None if lend.gpus is None else json.dumps(lend.gpus),
    }


OWN_ADDRESS = "127.0.0.1"
"""Where the control plane's own machines are (Solo's): this host."""


def address_of(row: Any) -> str | None:
    """Where the control plane reaches a direct machine: the address it joined from; the control
    plane's own machines (enrolled without a join token) on this host; a machine that joined
    directly before addresses were kept, none (its routes are refused)."""
    if row.tunnel:
        return None
    if row.address is not None:
        return str(row.address)
    return OWN_ADDRESS if row.join_token_id is None else None


def _enrolment(row: Any, guests: _Guests | None = None) -> Enrolment:
    return Enrolment(
        machine_id=row.id,
        owner_tenant_id=row.owner_tenant_id,
        owner_user_id=row.owner_user_id,
        region=row.region,
        sharing=SharingLevel(row.sharing),
        guests=guests.tenants if guests is not None else [],
        guest_users=guests.users if guests is not None else [],
        tunnel=row.tunnel,
        tunnel_key=row.tunnel_key,
        address=address_of(row),
        reclaim_grace_s=row.reclaim_grace_s,
        guest_min_runtime_s=row.guest_min_runtime_s,
        reclaimed_at=row.reclaimed_at,
        lend=lend_of(row),
        enrolled_at=row.enrolled_at,
        revoked_at=row.revoked_at,
    )


@dataclass
class _Guests:
    """One machine's guests: tenants and users (ids, sorted)."""

    tenants: list[str] = field(default_factory=list)
    users: list[str] = field(default_factory=list)


async def guests_of(
    conn: AsyncConnection, machine_ids: Collection[str] | None = None
) -> dict[str, _Guests]:
    """Each machine's guests: accepted, unrevoked invitations. Only the machines that have
    any are keys; `machine_ids` None reads every machine's."""
    stmt = sa.select(_i.machine_id, _i.tenant_id, _i.user_id).where(
        _i.accepted_at.is_not(None), _i.revoked_at.is_(None)
    )
    if machine_ids is not None:
        stmt = stmt.where(_i.machine_id.in_(list(machine_ids)))
    found: dict[str, _Guests] = {}
    rows = (await conn.execute(stmt.order_by(_i.tenant_id, _i.user_id))).all()
    for machine_id, tenant_id, user_id in rows:
        guests = found.setdefault(machine_id, _Guests())
        if tenant_id is not None:
            guests.tenants.append(tenant_id)
        else:
            guests.users.append(user_id)
    return found


async def enrolment_of(conn: AsyncConnection, machine_id: str) -> Enrolment | None:
    """One machine's enrolment as the store has it now, guests included (None: unknown)."""
    row = (await conn.execute(sa.select(m.machines).where(_m.id == machine_id))).first()
    if row is None:
        return None
    return _enrolment(row, (await guests_of(conn, [machine_id])).get(machine_id))


async def enrolments(store: Store) -> dict[str, Enrolment]:
    """Every machine ever enrolled (revoked ones too), by id, guests included."""
    async with store.read() as conn:
        rows = (await conn.execute(sa.select(m.machines))).all()
        guests = await guests_of(conn)
    return {r.id: _enrolment(r, guests.get(r.id)) for r in rows}


def shown(
    enrolment: Enrolment,
    viewer: Principal | None = None,
    owner_tenant_name: str | None = None,
    inventory: Inventory | None = None,
) -> MachineEnrolment:
    """The enrolment as `viewer` may see it: whole for the owner's tenant and the operator
    (and where no viewer is given); anyone else (a guest, a community user) is told the owner's
    tenant name, the sharing level and what is lent, never the owner's ids, the guests or the
    tunnel. `inventory`: the machine's latest, to show what is usable of it now."""
    lend = enrolment.lend
    usable = None if inventory is None else (lend or Lend()).usable(inventory)
    whole = viewer is None or viewer.is_operator or viewer.tenant_id == enrolment.owner_tenant_id
    return MachineEnrolment(
        owner_tenant_id=enrolment.owner_tenant_id if whole else None,
        owner_tenant_name=owner_tenant_name,
        owner_user_id=enrolment.owner_user_id if whole else None,
        sharing=enrolment.sharing,
        guests=list(enrolment.guests) if whole else None,
        tunnel=enrolment.tunnel if whole else None,
        address=enrolment.address if whole else None,
        reclaim_grace_s=enrolment.reclaim_grace_s,
        guest_min_runtime_s=enrolment.guest_min_runtime_s,
        reclaimed_at=enrolment.reclaimed_at,
        lend=None if lend is None else MachineLend.model_validate(lend.model_dump()),
        usable=None if usable is None else MachineUsable.model_validate(usable.model_dump()),
        enrolled_at=enrolment.enrolled_at,
        revoked_at=enrolment.revoked_at,
    )


_CREDENTIAL_RE_LEN = (len(CREDENTIAL_PREFIX) + 20, len(CREDENTIAL_PREFIX) + 100)


async def by_credential(store: Store, credential: str) -> Enrolment | None:
    """The machine whose credential this is (revoked or not), or None. Its `guests` are not
    read (who the machine is needs none): never put this record to the bus."""
    low, high = _CREDENTIAL_RE_LEN
    if not credential.startswith(CREDENTIAL_PREFIX) or not low <= len(credential) <= high:
        return None
    async with store.read() as conn:
        row = (
            await conn.execute(
                sa.select(m.machines).where(_m.credential_sha256 == secret_hash(credential))
            )
        ).first()
    return None if row is None else _enrolment(row)


async def revoke(
    store: Store, principal: Principal, machine_id: str, *, now: datetime | None = None
) -> Enrolment:
    """Revoke a machine: the operator any, a tenant admin their tenant's. 404 otherwise."""
    may_enrol(principal)
    mine = sa.true() if principal.is_operator else _m.owner_tenant_id == principal.tenant_id
    async with store.write() as conn:
        row = (await conn.execute(sa.select(m.machines).where(_m.id == machine_id, mine))).first()
        if row is None:
            raise NotFound(f"no machine {machine_id!r}")
        if row.revoked_at is None:
            await conn.execute(
                sa.update(m.machines).where(_m.id == machine_id).values(revoked_at=now or utcnow())
            )
        enrolment = await enrolment_of(conn, machine_id)
    assert enrolment is not None  # the row was read in this unit of work
    return enrolment
