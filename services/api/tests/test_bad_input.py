"""Bad input: a clear 4xx with the error body, never a 500, and nothing stored."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa

from einsora.api.testing import RunningApi

OK = {"kind": "notebook", "class": "cpu-1c-2g"}
MiB = 1024 * 1024

# (name, method, path, raw body or JSON, headers, status, error code, field named)
CASES: list[tuple[str, str, str, object, dict[str, str], int, str, str | None]] = [
    ("malformed JSON", "POST", "/v1/workloads", b'{"kind": ', {}, 400, "malformed_json", None),
    ("not UTF-8", "POST", "/v1/workloads", b"\xff\xfe{}", {}, 400, "malformed_json", None),
    ("empty body", "POST", "/v1/workloads", b"", {}, 400, "malformed_json", None),
    (
        "lone surrogate",
        "POST",
        "/v1/tokens",
        b'{"name": "\\ud800"}',
        {},
        400,
        "malformed_json",
        None,
    ),
    ("a list, not an object", "POST", "/v1/workloads", [OK], {}, 422, "validation_error", "body"),
    (
        "missing class",
        "POST",
        "/v1/workloads",
        {"kind": "vm"},
        {},
        422,
        "validation_error",
        "class",
    ),
    (
        "unknown kind",
        "POST",
        "/v1/workloads",
        {**OK, "kind": "rocket"},
        {},
        422,
        "validation_error",
        "kind",
    ),
    (
        "unknown class",
        "POST",
        "/v1/workloads",
        {**OK, "class": "tpu-v9"},
        {},
        422,
        "validation_error",
        "class",
    ),
    ("count 0", "POST", "/v1/workloads", {**OK, "count": 0}, {}, 422, "validation_error", "count"),
    (
        "count huge",
        "POST",
        "/v1/workloads",
        {**OK, "count": 10**30},
        {},
        422,
        "validation_error",
        "count",
    ),
    (
        "count a string",
        "POST",
        "/v1/workloads",
        {**OK, "count": "many"},
        {},
        422,
        "validation_error",
        "count",
    ),
    (
        "spec not an object",
        "POST",
        "/v1/workloads",
        {**OK, "spec": [1]},
        {},
        422,
        "validation_error",
        "spec",
    ),
    (
        "spec NaN",
        "POST",
        "/v1/workloads",
        b'{"kind":"vm","class":"cpu-1c-2g","spec":{"x":NaN}}',
        {},
        422,
        "validation_error",
        "spec",
    ),
    (
        "spec too big",
        "POST",
        "/v1/workloads",
        {**OK, "spec": {"x": "y" * 70000}},
        {},
        422,
        "validation_error",
        "spec",
    ),
    (
        "region with a dot",
        "POST",
        "/v1/workloads",
        {**OK, "region": "a.b"},
        {},
        422,
        "validation_error",
        "region",
    ),
    (
        "name with NUL",
        "POST",
        "/v1/workloads",
        {**OK, "name": "a\u0000b"},
        {},
        422,
        "validation_error",
        "name",
    ),
    (
        "fallback not a list",
        "POST",
        "/v1/workloads",
        {**OK, "fallback": "cpu-2c-4g"},
        {},
        422,
        "validation_error",
        "fallback",
    ),
    (
        "unknown field",
        "POST",
        "/v1/workloads",
        {**OK, "clas": "x"},
        {},
        422,
        "validation_error",
        "clas",
    ),
    ("token without a name", "POST", "/v1/tokens", {}, {}, 422, "validation_error", "name"),
    (
        "token expiry negative",
        "POST",
        "/v1/tokens",
        {"name": "a", "expires_in_days": -1},
        {},
        422,
        "validation_error",
        "expires_in_days",
    ),
    (
        "tenant name with spaces",
        "POST",
        "/v1/tenants",
        {"name": "a b"},
        {},
        422,
        "validation_error",
        "name",
    ),
    (
        "member role unknown",
        "POST",
        "/v1/tenants/{tenant}/invitations",
        {"username": "x", "role": "god"},
        {},
        422,
        "validation_error",
        "role",
    ),
    ("limit 0", "GET", "/v1/workloads?limit=0", None, {}, 422, "validation_error", "limit"),
    (
        "limit not a number",
        "GET",
        "/v1/workloads?limit=ten",
        None,
        {},
        422,
        "validation_error",
        "limit",
    ),
    (
        "state unknown",
        "GET",
        "/v1/workloads?state=sleepy",
        None,
        {},
        422,
        "validation_error",
        "state",
    ),
    (
        "cursor forged",
        "GET",
        "/v1/workloads?cursor=!!!",
        None,
        {},
        422,
        "validation_error",
        "cursor",
    ),
    (
        "cursor of JSON junk",
        "GET",
        "/v1/workloads?cursor=WzEsMl0",
        None,
        {},
        422,
        "validation_error",
        "cursor",
    ),
    (
        "timeline cursor forged",
        "GET",
        "/v1/workloads/{workload}/events?cursor=WzEsMl0",
        None,
        {},
        422,
        "validation_error",
        "cursor",
    ),
    (
        "idempotency key unsafe",
        "POST",
        "/v1/workloads",
        OK,
        {"Idempotency-Key": "a b"},
        422,
        "validation_error",
        "Idempotency-Key",
    ),
    (
        "unknown workload",
        "GET",
        "/v1/workloads/w-0000000000000000000a",
        None,
        {},
        404,
        "not_found",
        None,
    ),
    ("malformed workload id", "GET", "/v1/workloads/..%2F..", None, {}, 404, "not_found", None),
    ("unknown route", "GET", "/v1/rockets", None, {}, 404, "not_found", None),
    ("wrong method", "PATCH", "/v1/workloads", OK, {}, 405, "method_not_allowed", None),
    (
        "body over 1 MiB",
        "POST",
        "/v1/workloads",
        b"{" + b" " * MiB + b"}",
        {},
        413,
        "payload_too_large",
        None,
    ),
]


async def _stored(api: RunningApi) -> dict[str, int]:
    assert api.service.store is not None
    counts = {}
    async with api.service.store.read() as conn:
        for table in ("workloads", "timeline", "outbox", "api_tokens", "tenants", "members"):
            counts[table] = int(await conn.scalar(sa.text(f"SELECT count(*) FROM {table}")) or 0)  # noqa: S608
    return counts


@pytest.mark.parametrize(
    ("name", "method", "path", "body", "headers", "status", "code", "field"),
    CASES,
    ids=[c[0] for c in CASES],
)
async def test_bad_input_is_refused_clearly(
    shared_api: RunningApi,
    name: str,
    method: str,
    path: str,
    body: object,
    headers: dict[str, str],
    status: int,
    code: str,
    field: str | None,
) -> None:
    api = shared_api
    tenant = await api.owner.post("/v1/tenants", {"name": f"target-{secrets.token_hex(4)}"})
    workload = await api.owner.post("/v1/workloads", OK)
    path = path.format(tenant=tenant.body["id"], workload=workload.body["id"])
    before = await _stored(api)
    if isinstance(body, bytes):
        answer = await api.owner.call(method, path, data=body, headers=headers)
    else:
        answer = await api.owner.call(method, path, body, headers=headers)
    assert answer.status == status, answer.text
    assert answer.body["error"] == code
    assert answer.body["request_id"] == answer.request_id
    assert answer.body["message"]
    if field is not None:
        assert field in [d["field"] for d in answer.body["details"]], answer.body
        assert field in answer.body["message"]
    assert await _stored(api) == before


async def test_a_streamed_body_over_1_mib_is_refused(shared_api: RunningApi) -> None:
    """No Content-Length (chunked): the bytes are counted as they arrive."""
    api = shared_api

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"kind": "vm", "class": "cpu-1c-2g", "spec": {"x": "'
        for _ in range(20):
            yield b"y" * 65536
            await asyncio.sleep(0)
        yield b'"}}'

    before = await _stored(api)
    async with api.session.post(
        api.url + "/v1/workloads",
        data=chunks(),
        headers={"Authorization": f"Bearer {api.owner.token}"},
    ) as resp:
        assert resp.status == 413
        body = await resp.json()
    assert body["error"] == "payload_too_large"
    assert await _stored(api) == before


async def test_a_lying_content_length_is_refused_before_reading(shared_api: RunningApi) -> None:
    api = shared_api
    reader, writer = await asyncio.open_connection("127.0.0.1", api.service.port)
    writer.write(
        b"POST /v1/workloads HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {api.owner.token}\r\n".encode()
        + b"Content-Type: application/json\r\nContent-Length: 5000000\r\n\r\n{"
    )
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    await writer.wait_closed()
    assert b" 413 " in status_line


async def test_a_wrong_method_lists_the_allowed_ones(shared_api: RunningApi) -> None:
    answer = await shared_api.owner.call("PUT", "/v1/tokens")
    assert answer.status == 405
    assert set(answer.headers["Allow"].replace(" ", "").split(",")) == {"GET", "HEAD", "POST"}
