"""The owner, made on the first start: a user, a tenant, the admin role and a token.

The owner is the operator (it may create tenants). Its token's secret is written once to
`<data_dir>/owner.token` (mode 0600) and returned, so Solo can show it once; the store keeps
only its hash. The file is written before the transaction commits: if the commit fails, the
next start makes the owner again and overwrites the file, so the file never names a token the
store does not have.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from einsora.api import models as m
from einsora.api.services import tokens
from einsora.api.store import Store
from einsora.common.ids import new_id
from einsora.common.schemas import utcnow

OWNER_USERNAME = "owner"
OWNER_TENANT = "owner"
OWNER_TOKEN_FILE = "owner.token"  # noqa: S105 (a file name)


async def ensure_owner(store: Store, data_dir: Path) -> str | None:
    """Make the owner if there is none; the new token's secret, or None if it existed."""
    now = utcnow()
    try:
        async with store.write() as conn:
            exists = await conn.scalar(
                sa.select(m.users.c.id).where(m.users.c.username == OWNER_USERNAME)
            )
            if exists is not None:
                return None
            user_id, tenant_id = new_id("user"), new_id("tenant")
            await conn.execute(
                sa.insert(m.users).values(
                    id=user_id, username=OWNER_USERNAME, is_operator=True, created_at=now
                )
            )
            await conn.execute(
                sa.insert(m.tenants).values(id=tenant_id, name=OWNER_TENANT, created_at=now)
            )
            await conn.execute(
                sa.insert(m.members).values(
                    tenant_id=tenant_id, user_id=user_id, role="admin", created_at=now
                )
            )
            token = await tokens.issue(
                conn, tenant_id=tenant_id, user_id=user_id, name="owner", operator=True
            )
            write_secret(data_dir / OWNER_TOKEN_FILE, token.token)
    except IntegrityError:
        return None  # another replica made the owner at the same moment
    return token.token


def write_secret(path: Path, secret: str) -> None:
    """Write `secret` to `path` with mode 0600, atomically (never readable by others)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.replace(partial, path)


async def owner_tenant_id(store: Store) -> str | None:
    """The id of the owner's own tenant (Solo's machines belong to it), or None before bootstrap."""
    async with store.read() as conn:
        found: str | None = await conn.scalar(
            sa.select(m.tenants.c.id)
            .join(m.members, m.members.c.tenant_id == m.tenants.c.id)
            .join(m.users, m.users.c.id == m.members.c.user_id)
            .where(m.tenants.c.name == OWNER_TENANT, m.users.c.username == OWNER_USERNAME)
        )
    return found
