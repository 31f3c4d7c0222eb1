"""Token usage from the gateway: one row per request, and the sums per hour reports read.

A request is stored once (its `request_id` is the primary key, and the `Nats-Msg-Id` of its
publish), so a redelivered or republished count adds nothing; the hour sums grow only by the
rows actually inserted, in the same transaction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from einsora.accounting import tables as t
from einsora.accounting.periods import day_of, floor_hour
from einsora.accounting.rollups import upsert_adding
from einsora.common.schemas import TokenUsage


def add_token_usage(conn: sa.Connection, usages: Sequence[TokenUsage]) -> list[TokenUsage]:
    """Store the counts not stored before (a unit of work); those it stored."""
    first: dict[str, TokenUsage] = {}
    for u in usages:
        first.setdefault(u.request_id, u)
    if not first:
        return []
    known = set(
        conn.execute(
            sa.select(t.token_usage.c.request_id).where(t.token_usage.c.request_id.in_(list(first)))
        ).scalars()
    )
    new = [u for r, u in first.items() if r not in known]
    if not new:
        return []
    conn.execute(t.token_usage.insert(), [_row(u) for u in new])
    sums: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0, 0])
    for u in new:
        key = (floor_hour(u.at), u.tenant_id, u.key_id, u.endpoint, u.model, u.source.value)
        sums[key][0] += u.prompt_tokens
        sums[key][1] += u.completion_tokens
        sums[key][2] += 1
    upsert_adding(
        conn,
        t.token_hours,
        [
            {
                "hour": hour,
                "tenant_id": tenant,
                "key_id": key_id,
                "endpoint": endpoint,
                "model": model,
                "source": source,
                "day": day_of(hour),
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "requests": requests,
            }
            for (hour, tenant, key_id, endpoint, model, source), (
                prompt,
                completion,
                requests,
            ) in sums.items()
        ],
        ("prompt_tokens", "completion_tokens", "requests"),
    )
    return new


def _row(u: TokenUsage) -> dict[str, Any]:
    return {
        "request_id": u.request_id,
        "tenant_id": u.tenant_id,
        "key_id": u.key_id,
        "endpoint": u.endpoint,
        "model": u.model,
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "source": u.source.value,
        "status": u.status,
        "at": u.at,
    }
