"""Limits: request bodies bounded while they are read, rate limits per account (429 with
Retry-After), and the operator's cap on a tenant's workloads (409 naming the cap and the count).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa

from einsora.api.auth import Principal
from einsora.api.errors import RateLimited
from einsora.api.middleware import MAX_BODY_BYTES
from einsora.api.services.limits import RateLimits
from einsora.api.testing import RunningApi, new_member, new_tenant, running_api
from einsora.common.settings import Settings
from einsora.common.testing import Bus

NOTEBOOK = {"kind": "notebook", "class": "cpu-1c-2g"}
MB = 1_000_000


def _settings(bus: Bus, store_url: str, data_dir: Path, **limits: Any) -> Settings:
    return Settings(
        nats_url=bus.url, database_url=store_url, data_dir=data_dir, region="local", **limits
    )


@pytest_asyncio.fixture
async def capped_api(bus: Bus, store_url: str, data_dir: Path) -> AsyncIterator[RunningApi]:
    """The api on each engine, where a tenant may have 3 workloads unless the operator says."""
    settings = _settings(bus, store_url, data_dir, tenant_max_workloads=3)
    async with running_api(settings) as running:
        yield running


async def _count(api: RunningApi, table: str) -> int:
    assert api.service.store is not None
    async with api.service.store.read() as conn:
        return int(await conn.scalar(sa.text(f"SELECT count(*) FROM {table}")) or 0)  # noqa: S608


# Raw HTTP, so a test controls the bytes and sees whether the server closes the connection.


async def _exchange(port: int, head: bytes, body: bytes = b"", *, within_s: float = 20.0) -> bytes:
    """Send `head` then `body`, and return every byte the server sent until it closed.

    The body is sent alongside, and a write the server stops reading is given up (a server that
    answers early may close before the client is done). Fails if the server keeps the
    connection open."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))

    async def write() -> None:
        with contextlib.suppress(OSError):
            await loop.sock_sendall(sock, head)
            for i in range(0, len(body), 65536):
                await loop.sock_sendall(sock, body[i : i + 65536])

    writer = asyncio.create_task(write())
    received = bytearray()
    try:
        async with asyncio.timeout(within_s):
            while True:
                try:
                    data = await loop.sock_recv(sock, 65536)
                except ConnectionResetError:
                    break  # closed with our bytes unread: what it sent before is all here
                if not data:
                    break
                received += data
    except TimeoutError:
        raise AssertionError(
            f"the connection was kept open; received {bytes(received)!r}"
        ) from None
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
        sock.close()
    return bytes(received)


def _responses(data: bytes) -> list[tuple[int, dict[str, str], Any]]:
    """The HTTP responses in `data`: status, headers (lower-case names), body as JSON."""
    answers = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        length = int(headers.get("content-length", "0"))
        body, data = data[:length], data[length:]
        answers.append((int(status_line.split()[1]), headers, json.loads(body) if body else None))
    return answers


def _post_head(token: str | None, *framing: str) -> bytes:
    lines = ["POST /v1/workloads HTTP/1.1", "Host: api", "Content-Type: application/json"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join([*lines, *framing]) + "\r\n\r\n").encode()


def _chunked(body: bytes, size: int = 16384) -> bytes:
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks)


def _spec_body(total: int) -> bytes:
    """A launch whose body is `total` bytes of valid JSON."""
    start, end = b'{"kind":"vm","class":"cpu-1c-2g","spec":{"x":"', b'"}}'
    return start + b"y" * (total - len(start) - len(end)) + end


def _assert_too_large(answer: tuple[int, dict[str, str], Any]) -> None:
    status, headers, body = answer
    assert status == 413, answer
    assert body["error"] == "payload_too_large"
    assert str(MAX_BODY_BYTES) in body["message"]
    assert body["request_id"] == headers["x-request-id"]


async def test_a_burst_of_oversized_bodies_is_refused_and_launches_go_on(api: RunningApi) -> None:
    port = api.service.port
    assert port is not None
    token = api.owner.token
    big = _spec_body(MB)
    before = await _count(api, "workloads")

    async def declared() -> bytes:
        return await _exchange(port, _post_head(token, f"Content-Length: {len(big)}"), big)

    async def streamed() -> bytes:
        head = _post_head(token, "Transfer-Encoding: chunked")
        return await _exchange(port, head, _chunked(big) + b"0\r\n\r\n")

    burst = [declared() for _ in range(40)] + [streamed() for _ in range(10)]
    answers, launched = await asyncio.gather(
        asyncio.gather(*burst), api.owner.post("/v1/workloads", NOTEBOOK)
    )
    for data in answers:
        [answer] = _responses(data)  # one answer, then the connection is closed
        _assert_too_large(answer)
    assert launched.status == 201, launched.text
    after = await api.owner.post("/v1/workloads", NOTEBOOK)
    assert after.status == 201, after.text
    assert await _count(api, "workloads") == before + 2


async def test_a_streamed_body_is_cut_off_as_it_passes_the_limit(api: RunningApi) -> None:
    """The body never ends (no last chunk): the answer comes once the limit is passed."""
    assert api.service.port is not None
    head = _post_head(api.owner.token, "Transfer-Encoding: chunked")
    data = await _exchange(api.service.port, head, _chunked(b"{" + b" " * MAX_BODY_BYTES))
    [answer] = _responses(data)
    _assert_too_large(answer)
    assert await _count(api, "workloads") == 0


async def test_a_declared_length_over_the_limit_is_refused_before_authentication(
    api: RunningApi,
) -> None:
    assert api.service.port is not None
    head = _post_head(None, f"Content-Length: {50 * MB}")
    [answer] = _responses(await _exchange(api.service.port, head, b"{"))
    _assert_too_large(answer)


async def test_a_body_at_the_limit_is_read(api: RunningApi) -> None:
    """At the limit exactly, the body is parsed: its spec is then refused by its own limit."""
    answer = await api.owner.call("POST", "/v1/workloads", data=_spec_body(MAX_BODY_BYTES))
    assert answer.status == 422, answer.text
    assert answer.body["details"][0]["field"] == "spec"


# Rate limits per account (a user in a tenant).


async def test_requests_past_a_tokens_limit_get_429_with_retry_after(
    bus: Bus, sqlite_url: str, data_dir: Path
) -> None:
    settings = _settings(bus, sqlite_url, data_dir, api_requests_per_minute=5)
    async with running_api(settings) as api:
        other = await api.owner.post("/v1/tokens", {"name": "another"})  # request 1 of 5
        assert other.status == 201, other.text
        for _ in range(4):
            assert (await api.owner.get("/v1/me")).status == 200
        refused = await api.owner.get("/v1/me")
        assert refused.status == 429, refused.text
        retry_after = int(refused.headers["Retry-After"])
        assert 1 <= retry_after <= 60
        assert refused.body["error"] == "rate_limited"
        assert refused.body["request_id"] == refused.request_id
        assert [d["field"] for d in refused.body["details"]] == ["requests_per_minute"]
        assert "5 requests per minute" in refused.body["message"]
        # Another token of the same user shares the count (issue 34, N12).
        assert (await api.client(other.body["token"]).get("/v1/me")).status == 429
        # Refused requests change nothing.
        again = await api.owner.post("/v1/workloads", NOTEBOOK)
        assert again.status == 429
        assert await _count(api, "workloads") == 0


async def test_launches_past_a_tokens_limit_get_429_and_other_requests_go_on(
    bus: Bus, sqlite_url: str, data_dir: Path
) -> None:
    settings = _settings(bus, sqlite_url, data_dir, api_launches_per_minute=2)
    async with running_api(settings) as api:
        for _ in range(2):
            assert (await api.owner.post("/v1/workloads", NOTEBOOK)).status == 201
        refused = await api.owner.post("/v1/workloads", NOTEBOOK)
        assert refused.status == 429, refused.text
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert [d["field"] for d in refused.body["details"]] == ["launches_per_minute"]
        assert "2 launches per minute" in refused.body["message"]
        assert refused.body["request_id"] == refused.request_id
        assert (await api.owner.get("/v1/workloads")).status == 200
        assert await _count(api, "workloads") == 2


async def test_a_limit_of_zero_is_off() -> None:
    limits = RateLimits(requests_per_minute=0, launches_per_minute=0)
    token = _principal("tok-1")
    for _ in range(5000):
        await limits.check(token, launch=True)
    limited = RateLimits(requests_per_minute=3, launches_per_minute=0)
    for _ in range(3):
        await limited.check(token, launch=True)
    with pytest.raises(RateLimited, match="3 requests per minute") as refused:
        await limited.check(token, launch=False)
    assert 1 <= int(refused.value.headers["Retry-After"]) <= 60


def _principal(token_id: str) -> Principal:
    return Principal(
        token_id=token_id,
        user_id="u-1",
        username="u",
        tenant_id="t-1",
        tenant_name="t",
        role="admin",
        is_operator=False,
    )


# The operator's cap on a tenant's workloads.


async def test_a_launch_past_the_default_cap_is_refused_naming_the_cap_and_count(
    capped_api: RunningApi,
) -> None:
    api = capped_api
    _, alice = await new_tenant(api, "capped", "alice")
    ids = []
    for _ in range(3):
        created = await alice.post("/v1/workloads", NOTEBOOK)
        assert created.status == 201, created.text
        ids.append(created.body["id"])
    before = await _count(api, "workloads")
    refused = await alice.post("/v1/workloads", NOTEBOOK)
    assert refused.status == 409, refused.text
    assert refused.body["error"] == "workload_cap_reached"
    assert "3 workloads" in refused.body["message"]
    assert "cap is 3" in refused.body["message"]
    assert [d["field"] for d in refused.body["details"]] == ["max_workloads"]
    assert refused.body["request_id"] == refused.request_id
    assert await _count(api, "workloads") == before
    # Removing is not enough: a workload holds its place until it is removed.
    assert (await alice.delete(f"/v1/workloads/{ids[0]}")).status == 202
    assert (await alice.post("/v1/workloads", NOTEBOOK)).status == 409
    assert api.service.store is not None
    async with api.service.store.write() as conn:  # as the scheduler's event would
        await conn.execute(
            sa.text("UPDATE workloads SET state = 'removed' WHERE id = :id"), {"id": ids[0]}
        )
    assert (await alice.post("/v1/workloads", NOTEBOOK)).status == 201


async def test_concurrent_launches_never_pass_the_cap(capped_api: RunningApi) -> None:
    api = capped_api
    _, alice = await new_tenant(api, "burst", "alice")
    answers = await asyncio.gather(*(alice.post("/v1/workloads", NOTEBOOK) for _ in range(12)))
    assert sorted(a.status for a in answers) == [201] * 3 + [409] * 9
    listed = await alice.get("/v1/workloads")
    assert len(listed.body["items"]) == 3


async def test_a_retried_launch_at_the_cap_answers_its_first_result(
    capped_api: RunningApi,
) -> None:
    api = capped_api
    _, alice = await new_tenant(api, "retry", "alice")
    for _ in range(2):
        assert (await alice.post("/v1/workloads", NOTEBOOK)).status == 201
    key = {"Idempotency-Key": "launch-3"}
    first = await alice.post("/v1/workloads", NOTEBOOK, headers=key)
    assert first.status == 201
    retried = await alice.post("/v1/workloads", NOTEBOOK, headers=key)
    assert retried.status == 201
    assert retried.headers["Idempotent-Replayed"] == "true"
    assert retried.body["id"] == first.body["id"]
    assert (
        await alice.post("/v1/workloads", NOTEBOOK, headers={"Idempotency-Key": "4"})
    ).status == 409


async def test_the_operator_sets_a_tenants_cap_and_its_members_see_it(
    capped_api: RunningApi,
) -> None:
    api = capped_api
    tenant_id, alice = await new_tenant(api, "team", "alice")
    bob = await new_member(api, tenant_id, "bob", by=alice)
    other_id, mallory = await new_tenant(api, "other", "mallory")
    path = f"/v1/tenants/{tenant_id}/limits"

    shown = await bob.get(path)
    assert shown.status == 200, shown.text
    assert shown.body["max_workloads"] == 3
    assert shown.body["source"] == "default"
    assert shown.body["workloads"] == 0
    assert shown.body["requests_per_minute"] == 1200
    assert shown.body["launches_per_minute"] == 300

    # The tenant's own admin may not raise it; another tenant does not see it at all.
    refused = await alice.call("PUT", path, {"max_workloads": 50})
    assert refused.status == 403, refused.text
    assert refused.body["request_id"] == refused.request_id
    assert (await mallory.get(path)).status == 404
    assert (await mallory.call("PUT", path, {"max_workloads": 50})).status == 404
    assert (await alice.get(f"/v1/tenants/{other_id}/limits")).status == 404
    assert (await bob.get(path)).body["source"] == "default"

    set_ = await api.owner.call("PUT", path, {"max_workloads": 1})
    assert set_.status == 200, set_.text
    assert set_.body["max_workloads"] == 1
    assert set_.body["source"] == "tenant"
    assert set_.body["updated_at"] is not None
    assert (await alice.post("/v1/workloads", NOTEBOOK)).status == 201
    refused = await bob.post("/v1/workloads", NOTEBOOK)
    assert refused.status == 409
    assert "cap is 1" in refused.body["message"]
    assert (await bob.get(path)).body["workloads"] == 1
    # Other tenants keep the default.
    assert (await mallory.get(f"/v1/tenants/{other_id}/limits")).body["max_workloads"] == 3

    lifted = await api.owner.call("PUT", path, {"max_workloads": None})
    assert lifted.status == 200
    assert lifted.body["max_workloads"] is None
    for _ in range(4):  # past the default of 3 as well
        assert (await bob.post("/v1/workloads", NOTEBOOK)).status == 201


async def test_without_a_default_an_operators_cap_still_applies(
    bus: Bus, sqlite_url: str, data_dir: Path
) -> None:
    settings = _settings(bus, sqlite_url, data_dir, tenant_max_workloads=0)
    async with running_api(settings) as api:
        tenant_id, alice = await new_tenant(api, "solo", "alice")
        path = f"/v1/tenants/{tenant_id}/limits"
        assert (await alice.get(path)).body["max_workloads"] is None
        assert (await api.owner.call("PUT", path, {"max_workloads": 2})).status == 200
        answers = await asyncio.gather(*(alice.post("/v1/workloads", NOTEBOOK) for _ in range(5)))
        assert sorted(a.status for a in answers) == [201, 201, 409, 409, 409]
