"""Access tickets: minted for a running workload, redeemed exactly once by the access proxy.

A ticket has 256 bits of randomness, is valid for 60 seconds, names one workload's site and
is stored only as its hash. Redemption is one conditional UPDATE (unredeemed, unexpired, this
site), so two proxies racing with the same ticket cannot both win. Minting and redeeming are
notes on the workload's timeline, each with the request ID that caused it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal, secret_hash
from einsora.api.errors import Conflict, NotFound
from einsora.api.schemas.access import AccessOut
from einsora.api.store import Store, activity_actor, activity_refused
from einsora.common import lifecycle
from einsora.common.ids import is_id, new_id
from einsora.common.schemas import (
    AccessRedeemReply,
    AccessRedeemRequest,
    EventKind,
    IntentAction,
    WorkloadState,
    utcnow,
)
from einsora.common.settings import Settings
from einsora.common.sites import SiteConfig

TICKET_TTL = timedelta(seconds=60)
REDEEMED_STATUS = 303
"""What the proxy answers a redeemed ticket (a redirect into the site), as the log records it."""
REFUSED_STATUS = 403
"""What the proxy answers a refused one."""
Clock = Callable[[], datetime]


def site_url(settings: Settings, workload_id: str, ticket: str) -> str:
    """The access link, named exactly as the proxy names its sites (one SiteConfig)."""
    return SiteConfig.from_settings(settings).enter_url(workload_id, ticket)


async def _note(
    conn: AsyncConnection,
    workload_id: str,
    state: str,
    reason: str,
    request_id: str,
    at: datetime,
) -> None:
    await conn.execute(
        sa.insert(m.timeline).values(
            workload_id=workload_id,
            at=at,
            kind=EventKind.note.value,
            state=state,
            reason=reason,
            request_id=request_id,
        )
    )


async def mint(
    store: Store,
    settings: Settings,
    principal: Principal,
    workload_id: str,
    *,
    request_id: str,
    clock: Clock = utcnow,
) -> AccessOut:
    """A one-time link to a running workload's site; 404 for another tenant's, 409 if not
    running."""
    if not is_id(workload_id, "workload"):
        raise NotFound(f"no workload {workload_id!r}")
    ticket = secrets.token_urlsafe(32)
    now = clock()
    expires_at = now + TICKET_TTL
    async with store.write() as conn:
        state = await conn.scalar(
            sa.select(m.workloads.c.state).where(
                m.workloads.c.id == workload_id, m.workloads.c.tenant_id == principal.tenant_id
            )
        )
        if state is None:
            raise NotFound(f"no workload {workload_id!r}")
        if state != WorkloadState.running.value:
            raise Conflict(
                f"workload {workload_id} is {state}; only a running workload can be opened"
                + (
                    " (resume it first)"
                    if lifecycle.allows(IntentAction.resume, WorkloadState(state))
                    else ""
                )
            )
        await conn.execute(
            sa.insert(m.access_tickets).values(
                id=new_id("token"),
                secret_sha256=secret_hash(ticket),
                workload_id=workload_id,
                tenant_id=principal.tenant_id,
                user_id=principal.user_id,
                created_at=now,
                expires_at=expires_at,
                mint_request_id=request_id,
            )
        )
        await _note(
            conn,
            workload_id,
            state,
            f"access link made by {principal.username} (valid 60 s, works once)",
            request_id,
            now,
        )
    return AccessOut(url=site_url(settings, workload_id, ticket), expires_at=expires_at)


async def redeem(
    store: Store, ask: AccessRedeemRequest, *, clock: Clock = utcnow
) -> AccessRedeemReply:
    """Use a ticket for the site of `ask.workload_id`: ok exactly once, else why not."""
    digest = secret_hash(ask.ticket)
    now = clock()
    t = m.access_tickets.c
    async with store.write() as conn:
        won = await conn.execute(
            sa.update(m.access_tickets)
            .where(
                t.secret_sha256 == digest,
                t.redeemed_at.is_(None),
                t.expires_at > now,
                t.workload_id == ask.workload_id,
            )
            .values(redeemed_at=now, redeem_request_id=ask.request_id[:64])
        )
        row = (
            await conn.execute(
                sa.select(
                    t.id, t.workload_id, t.tenant_id, t.user_id, t.expires_at, t.redeemed_at
                ).where(t.secret_sha256 == digest)
            )
        ).first()
        if row is not None:  # the activity log names the ticket (never its secret) and its user
            activity_actor(tenant_id=row.tenant_id, user_id=row.user_id, token_id=row.id)
        if won.rowcount != 1 or row is None:
            activity_refused(REFUSED_STATUS)
            return AccessRedeemReply(ok=False, error=_why(row, ask.workload_id, now))
        state = await conn.scalar(
            sa.select(m.workloads.c.state).where(m.workloads.c.id == row.workload_id)
        )
        if state != WorkloadState.running.value:
            activity_refused(REFUSED_STATUS)
            return AccessRedeemReply(ok=False, error="not_running")
        await _note(conn, row.workload_id, state, "access link used", ask.request_id[:64], now)
    return AccessRedeemReply(
        ok=True,
        workload_id=row.workload_id,
        tenant_id=row.tenant_id,
        user_id=row.user_id,
        expires_at=row.expires_at,
    )


def _why(row: Any, workload_id: str, now: datetime) -> str:
    if row is None:
        return "unknown"
    if row.workload_id != workload_id:
        return "wrong_site"
    if row.redeemed_at is not None:
        return "used"
    return "expired"
