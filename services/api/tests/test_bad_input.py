"""Bad input: a clear 4xx with the error body, never a 500, and nothing stored."""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa

from einsora.api.middleware import MAX_BODY_BYTES
from einsora.api.testing import RunningApi

OK = {"kind": "notebook", "class": "cpu-1c-2g"}

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
        "count a numeric string",
        "POST",
        "/v1/workloads",
        {**OK, "count": "1"},
        {},
        422,
        "validation_error",
        "count",
    ),
    (
        "count true",
        "POST",
        "/v1/workloads",
        {**OK, "count": True},
        {},
        422,
        "validation_error",
        "count",
    ),
    (
        "count 1.0",
        "POST",
        "/v1/workloads",
        {**OK, "count": 1.0},
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
        "name with a C1 control",
        "POST",
        "/v1/workloads",
        {**OK, "name": "a\u0085b"},
        {},
        422,
        "validation_error",
        "name",
    ),
    (
        "name with U+202E",
        "POST",
        "/v1/workloads",
        {**OK, "name": "invoice\u202efdp.exe"},
        {},
        422,
        "validation_error",
        "name",
    ),
    (
        "name with a bidi isolate",
        "POST",
        "/v1/workloads",
        {**OK, "name": "a\u2067b"},
        {},
        422,
        "validation_error",
        "name",
    ),
    (
        "name with U+2028",
        "POST",
        "/v1/workloads",
        {**OK, "name": "one\u2028two"},
        {},
        422,
        "validation_error",
        "name",
    ),
    (
        "token name with U+2029",
        "POST",
        "/v1/tokens",
        {"name": "a\u2029b"},
        {},
        422,
        "validation_error",
        "name",
    ),
    (
        "token name with ESC",
        "POST",
        "/v1/tokens",
        {"name": "\u001b[31mred"},
        {},
        422,
        "validation_error",
        "name",
    ),
    (
        "unknown region",
        "POST",
        "/v1/workloads",
        {**OK, "region": "mars"},
        {},
        422,
        "validation_error",
        "region",
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
    (
        "trailing slash, not a redirect",
        "GET",
        "/v1/workloads/",
        None,
        {"Host": "evil.example"},
        404,
        "not_found",
        None,
    ),
    ("metrics not on the API port", "GET", "/metrics", None, {}, 404, "not_found", None),
    (
        "tenant cap zero",
        "PUT",
        "/v1/tenants/{tenant}/limits",
        {"max_workloads": 0},
        {},
        422,
        "validation_error",
        "max_workloads",
    ),
    (
        "tenant cap a string",
        "PUT",
        "/v1/tenants/{tenant}/limits",
        {"max_workloads": "5"},
        {},
        422,
        "validation_error",
        "max_workloads",
    ),
    (
        "tenant cap missing",
        "PUT",
        "/v1/tenants/{tenant}/limits",
        {},
        {},
        422,
        "validation_error",
        "max_workloads",
    ),
    ("wrong method", "PATCH", "/v1/workloads", OK, {}, 405, "method_not_allowed", None),
    (
        "body over the limit",
        "POST",
        "/v1/workloads",
        b"{" + b" " * MAX_BODY_BYTES + b"}",
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
        for table in (
            "workloads",
            "timeline",
            "outbox",
            "api_tokens",
            "tenants",
            "members",
            "tenant_limits",
        ):
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


async def test_a_streamed_body_over_the_limit_is_refused(shared_api: RunningApi) -> None:
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
        assert body["request_id"] == resp.headers["X-Request-ID"]
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


# Requests that are not well-formed HTTP/1.1, sent as raw bytes: (name, framing headers and what
# follows the head, error code). Each gets a JSON 400 with a request ID, and the connection is
# closed: a GET smuggled after the body is never answered.
SMUGGLED = b"GET /v1/me HTTP/1.1\r\nHost: x\r\n\r\n"
RAW_CASES: list[tuple[str, bytes, str]] = [
    (
        "Content-Length and Transfer-Encoding",
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
        "ambiguous_framing",
    ),
    (
        "Transfer-Encoding and Content-Length",
        b"Transfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\n" + SMUGGLED,
        "ambiguous_framing",
    ),
    ("negative Content-Length", b"Content-Length: -1\r\n\r\n" + SMUGGLED, "malformed_request"),
    ("Content-Length not digits", b"Content-Length: 1e3\r\n\r\n{}", "malformed_request"),
    (
        "two Content-Lengths",
        b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        "malformed_request",
    ),
]


async def _raw(port: int, request: bytes) -> bytes:
    """Send `request`; every byte answered until the server closed (fails if it does not)."""
    loop = asyncio.get_running_loop()
    with socket.socket() as sock:
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, request)
        received = b""
        async with asyncio.timeout(20):  # the connection must close: no keep-alive after this
            while data := await loop.sock_recv(sock, 65536):
                received += data
    return received


@pytest.mark.parametrize(("name", "rest", "code"), RAW_CASES, ids=[c[0] for c in RAW_CASES])
async def test_malformed_http_is_refused_as_json_and_the_connection_closed(
    shared_api: RunningApi, name: str, rest: bytes, code: str
) -> None:
    api = shared_api
    assert api.service.port is not None
    before = await _stored(api)
    head = (
        b"POST /v1/workloads HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {api.owner.token}\r\n".encode()
    )
    data = await _raw(api.service.port, head + rest)
    status_line, _, data = data.partition(b"\r\n")
    headers, _, body = data.partition(b"\r\n\r\n")
    assert status_line.split()[1] == b"400", status_line
    fields = dict(line.split(b": ", 1) for line in headers.split(b"\r\n"))
    assert fields[b"content-type"].startswith(b"application/json")
    answer = json.loads(body[: int(fields[b"content-length"])])
    assert answer["error"] == code
    assert answer["message"]
    assert answer["request_id"] == fields[b"x-request-id"].decode()
    assert body[int(fields[b"content-length"]) :] == b""  # nothing more: the GET went unanswered
    assert await _stored(api) == before


async def test_an_unknown_region_names_the_known_ones(shared_api: RunningApi) -> None:
    answer = await shared_api.owner.post("/v1/workloads", {**OK, "region": "mars"})
    assert answer.status == 422
    assert "'mars'" in answer.body["message"]
    assert "local" in answer.body["message"]
