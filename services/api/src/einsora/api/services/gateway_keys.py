"""Gateway keys: issue (the `esk_…` key returned once, its SHA-256 stored), list, show, revoke.

Any member of a tenant makes keys for themself in that tenant. A member sees and revokes their
own keys; a tenant admin every key of the tenant. Any other key id (another member's, another
tenant's, a revoked one) answers 404. What the gateway reads of a key is `GatewayKey`
(`published`): its hash, never the key; the router puts it into KV once the key is stored, and
`projections/gateway_keys.py` puts right whatever a crash left.
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from einsora.api import models as m
from einsora.api.auth import Principal, secret_hash
from einsora.api.errors import NotFound
from einsora.api.pagination import keyset_page
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.gateway_keys import (
    GatewayKeyCreate,
    GatewayKeyCreated,
    GatewayKeyOut,
    GatewayKeyPage,
)
from einsora.api.store import Store, activity_target
from einsora.common.ids import is_id, new_id
from einsora.common.schemas import GatewayKey, utcnow

KEY_PREFIX = "esk_"
"""What a gateway key starts with (an API token starts with `tsk_`: the two never mix)."""

_k = m.gateway_keys.c
_SHOWN = (
    _k.id,
    _k.name,
    _k.user_id,
    _k.models,
    _k.rpm,
    _k.tpm,
    _k.max_tokens_default,
    _k.expires_at,
    _k.created_at,
    _k.last_used_at,
)


def new_key() -> str:
    """A new key: 32 random bytes (256 bits), so a plain SHA-256 is enough to store it."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


async def create(
    store: Store, principal: Principal, body: GatewayKeyCreate, *, now: datetime | None = None
) -> tuple[GatewayKeyCreated, GatewayKey]:
    """A key for the caller in the caller's tenant, committed; and what the gateway reads of it."""
    now = now or utcnow()
    key = new_key()
    key_id = new_id("gateway_key")
    models = list(dict.fromkeys(body.models)) if body.models is not None else None
    expires_at = now + timedelta(days=body.expires_in_days) if body.expires_in_days else None
    key_sha256 = secret_hash(key)
    activity_target(key_id)
    async with store.write() as conn:
        await conn.execute(
            sa.insert(m.gateway_keys).values(
                id=key_id,
                tenant_id=principal.tenant_id,
                user_id=principal.user_id,
                name=body.name,
                key_sha256=key_sha256,
                models=None if models is None else json.dumps(models),
                rpm=body.rpm,
                tpm=body.tpm,
                max_tokens_default=body.max_tokens_default,
                created_at=now,
                expires_at=expires_at,
            )
        )
    created = GatewayKeyCreated(
        id=key_id,
        name=body.name,
        key=key,
        models=models,
        rpm=body.rpm,
        tpm=body.tpm,
        max_tokens_default=body.max_tokens_default,
        expires_at=expires_at,
        created_at=now,
    )
    return created, GatewayKey(
        key_id=key_id,
        tenant_id=principal.tenant_id,
        user_id=principal.user_id,
        name=body.name,
        key_hash=key_sha256,
        models=models,
        rpm=body.rpm,
        tpm=body.tpm,
        max_tokens_default=body.max_tokens_default,
        expires_at=expires_at,
    )


def _visible(principal: Principal) -> sa.ColumnElement[bool]:
    """The caller's live keys, or every live key of the tenant for its admin."""
    mine = sa.and_(_k.tenant_id == principal.tenant_id, _k.revoked_at.is_(None))
    return mine if principal.is_admin else sa.and_(mine, _k.user_id == principal.user_id)


def _models(stored: str | None) -> list[str] | None:
    return None if stored is None else [str(name) for name in json.loads(stored)]


def _out(row: Any) -> GatewayKeyOut:
    return GatewayKeyOut(
        id=row.id,
        name=row.name,
        user_id=row.user_id,
        models=_models(row.models),
        rpm=row.rpm,
        tpm=row.tpm,
        max_tokens_default=row.max_tokens_default,
        expires_at=row.expires_at,
        created_at=row.created_at,
        last_used_at=row.last_used_at,
    )


async def list_keys(store: Store, principal: Principal, query: PageQuery) -> GatewayKeyPage:
    """The live keys the caller may see (never a key or its hash), oldest first."""
    stmt = sa.select(*_SHOWN).where(_visible(principal))
    async with store.read() as conn:
        items, cursor = await keyset_page(conn, stmt, _k.id, query, _out, lambda key: key.id)
    return GatewayKeyPage(items=items, next_cursor=cursor)


async def get(store: Store, principal: Principal, key_id: str) -> GatewayKeyOut:
    """One live key the caller may see, else 404."""
    if not is_id(key_id, "gateway_key"):
        raise NotFound(f"no gateway key {key_id!r}")
    async with store.read() as conn:
        row = (
            await conn.execute(sa.select(*_SHOWN).where(_k.id == key_id, _visible(principal)))
        ).first()
    if row is None:
        raise NotFound(f"no gateway key {key_id!r}")
    return _out(row)


async def revoke(
    store: Store, principal: Principal, key_id: str, *, now: datetime | None = None
) -> None:
    """Mark one key the caller may see revoked (committed when this returns), else 404."""
    if not is_id(key_id, "gateway_key"):
        raise NotFound(f"no gateway key {key_id!r}")
    async with store.write() as conn:
        result = await conn.execute(
            sa.update(m.gateway_keys)
            .where(_k.id == key_id, _visible(principal))
            .values(revoked_at=now or utcnow())
        )
    if result.rowcount != 1:
        raise NotFound(f"no gateway key {key_id!r}")


async def live_keys(store: Store, now: datetime) -> dict[str, GatewayKey]:
    """Every key neither revoked nor expired at `now`, as the gateway reads it, by key id."""
    stmt = sa.select(
        _k.id,
        _k.tenant_id,
        _k.user_id,
        _k.name,
        _k.key_sha256,
        _k.models,
        _k.rpm,
        _k.tpm,
        _k.max_tokens_default,
        _k.expires_at,
    ).where(_k.revoked_at.is_(None), sa.or_(_k.expires_at.is_(None), _k.expires_at > now))
    async with store.read() as conn:
        rows = (await conn.execute(stmt)).all()
    return {
        r.id: GatewayKey(
            key_id=r.id,
            tenant_id=r.tenant_id,
            user_id=r.user_id,
            name=r.name,
            key_hash=r.key_sha256,
            models=_models(r.models),
            rpm=r.rpm,
            tpm=r.tpm,
            max_tokens_default=r.max_tokens_default,
            expires_at=r.expires_at,
        )
        for r in rows
    }
