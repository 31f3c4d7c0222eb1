"""A running api for tests: the real service on a free port, and a small JSON client.

Tests of this package, the CLI's and the cross-service tests use it the same way:
`async with running_api(settings) as api:` then `await api.owner.post("/v1/workloads", {...})`.
It needs aiohttp (a dev dependency), so only tests import it.
"""

from __future__ import annotations

import asyncio
import io
import json as jsonlib
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp
from multidict import CIMultiDict
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError

from einsora.api.service import ApiService
from einsora.common.bus import bind_bucket, names
from einsora.common.schemas import Enrolment
from einsora.common.settings import Settings
from einsora.common.sites import DASHBOARD_COOKIE


@dataclass
class Answer:
    """One HTTP answer: status, parsed JSON body (None when empty or not JSON), headers."""

    status: int
    body: Any
    headers: Mapping[str, str]
    text: str

    @property
    def request_id(self) -> str:
        return self.headers["X-Request-ID"]


class Client:
    """JSON over HTTP to the api, as one token (or none)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, token: str | None) -> None:
        self.session = session
        self.base_url = base_url
        self.token = token

    def as_token(self, token: str | None) -> Client:
        return Client(self.session, self.base_url, token)

    async def call(
        self,
        method: str,
        path: str,
        json: Any = None,
        *,
        data: bytes | BinaryIO | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Answer:
        sent: dict[str, str] = {}
        if isinstance(data, bytes) and len(data) > 1024 * 1024:
            data = io.BytesIO(data)  # aiohttp warns about big raw bytes
        if self.token is not None:
            sent["Authorization"] = f"Bearer {self.token}"
        if json is not None:
            data = jsonlib.dumps(json).encode()
            sent["Content-Type"] = "application/json"
        sent.update(headers or {})
        async with self.session.request(
            method, self.base_url + path, data=data, headers=sent, params=params
        ) as resp:
            text = await resp.text()
            try:
                body = jsonlib.loads(text) if text else None
            except ValueError:
                body = None
            return Answer(resp.status, body, CIMultiDict(resp.headers), text)

    async def get(
        self,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        **more: str,
    ) -> Answer:
        return await self.call("GET", path, headers=headers, params={**(params or {}), **more})

    async def post(self, path: str, json: Any = None, **kw: Any) -> Answer:
        return await self.call("POST", path, json, **kw)

    async def delete(self, path: str) -> Answer:
        return await self.call("DELETE", path)


MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class SessionClient(Client):
    """JSON over HTTP as the dashboard in a browser: the session cookie, the dashboard's own
    `Origin` on changes, and the session's CSRF token with them (each of which a test may
    leave out or replace through `headers`)."""

    def __init__(
        self, session: aiohttp.ClientSession, base_url: str, cookie: str, csrf: str
    ) -> None:
        super().__init__(session, base_url, None)
        self.cookie = cookie
        self.csrf = csrf

    async def call(
        self,
        method: str,
        path: str,
        json: Any = None,
        *,
        data: bytes | BinaryIO | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Answer:
        sent = {"Cookie": f"{DASHBOARD_COOKIE}={self.cookie}"}
        if method in MUTATING:
            sent.update({"Origin": self.base_url, "X-CSRF-Token": self.csrf})
        sent.update(headers or {})
        return await super().call(method, path, json, data=data, headers=sent, params=params)


def session_cookie_of(answer: Answer) -> str:
    """The session cookie an answer sets (its value)."""
    header = answer.headers["Set-Cookie"]
    name, _, rest = header.partition("=")
    assert name == DASHBOARD_COOKIE, header
    return rest.split(";", 1)[0]


async def sign_in(client: Client, path: str, body: Any) -> tuple[SessionClient, Answer]:
    """Begin a session at `path` (`/v1/sessions`, `/v1/sessions/link`, …) as the dashboard
    does: a client with its cookie and CSRF token, and the answer."""
    answer = await client.post(path, body, headers={"Origin": client.base_url})
    if answer.status != 201:
        raise AssertionError(f"sign-in refused: {answer.status} {answer.text}")
    signed_in = SessionClient(
        client.session, client.base_url, session_cookie_of(answer), answer.body["csrf_token"]
    )
    return signed_in, answer


def link_code(path: str) -> str:
    """The code of a sign-in link's path (`/sign-in#link=sil_…`)."""
    return path.rpartition("link=")[2]


@dataclass
class RunningApi:
    service: ApiService
    session: aiohttp.ClientSession
    owner: Client
    """A client with the owner's token (the operator)."""

    @property
    def url(self) -> str:
        return self.service.url

    def client(self, token: str | None) -> Client:
        return self.owner.as_token(token)


@asynccontextmanager
async def running_api(settings: Settings, **options: Any) -> AsyncIterator[RunningApi]:
    """An ApiService started on a free port, with an HTTP session; stopped afterwards."""
    service = ApiService(settings, port=0, **options)
    await service.start()
    token = service.owner_token_created
    if token is None:
        token = service.owner_token_path.read_text().strip()
    try:
        async with aiohttp.ClientSession() as session:
            yield RunningApi(service, session, Client(session, service.url, token))
    finally:
        await service.stop()


async def eventually(
    check: Callable[[], Awaitable[bool]],
    within_s: float = 10.0,
    *,
    what: str = "",
    every_s: float = 0.02,
) -> None:
    """Wait until `check()` is true (polled every `every_s`), or fail after `within_s` saying
    `what` was awaited."""
    deadline = time.monotonic() + within_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {within_s} s" + (f": {what}" if what else ""))
        await asyncio.sleep(every_s)


async def new_member(
    api: RunningApi,
    tenant_id: str,
    username: str,
    role: str = "member",
    *,
    by: Client | None = None,
) -> Client:
    """Invite a new user into a tenant and redeem the code as they would: a client as them."""
    inviter = by or api.owner
    made = await inviter.post(
        f"/v1/tenants/{tenant_id}/invitations", {"username": username, "role": role}
    )
    if made.status != 201 or not made.body.get("code"):
        raise AssertionError(f"invitation refused: {made.status} {made.text}")
    joined = await api.client(None).post("/v1/invitations/redeem", {"code": made.body["code"]})
    if joined.status != 201:
        raise AssertionError(f"redeeming the invitation failed: {joined.status} {joined.text}")
    return api.client(joined.body["token"]["token"])


async def new_tenant(api: RunningApi, name: str, admin: str) -> tuple[str, Client]:
    """A tenant made by the operator, and a client as its first admin (a new user)."""
    tenant = await api.owner.post("/v1/tenants", {"name": name})
    if tenant.status != 201:
        raise AssertionError(f"tenant refused: {tenant.status} {tenant.text}")
    return tenant.body["id"], await new_member(api, tenant.body["id"], admin, "admin")


EINSORA = str(Path(sys.executable).parent / "einsora")
"""The `einsora` command of this environment, as a user runs it."""


def cli_env(api: RunningApi, home: Path, token: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of an `einsora` command run against `api` as `token` (the owner's by
    default), with its own config and data dirs under `home` and no bus of its own."""
    token = token or api.owner.token
    assert token is not None
    env = dict(os.environ)
    env.pop("EINSORA_NATS_URL", None)
    env.update(
        EINSORA_API=api.url,
        EINSORA_TOKEN=token,
        EINSORA_DATA_DIR=str(home / "cli-data"),
        XDG_CONFIG_HOME=str(home / "config"),
        **extra,
    )
    return env


async def einsora(
    env: Mapping[str, str], *args: str, timeout_s: float = 120
) -> tuple[int, str, str]:
    """Run `einsora ARGS` as a process: its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        EINSORA,
        *args,
        env=dict(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def join_machine(api: RunningApi, admin: Client, *, sharing: str = "private") -> str:
    """A machine joined with a join token of the admin's tenant (reached directly, no tunnel):
    its id."""
    made = await admin.post("/v1/machines/join-tokens", {"tunnel": False, "sharing": sharing})
    assert made.status == 201, made.text
    joined = await api.client(None).post(
        "/v1/machines/join", {"token": made.body["token"], "hostname": "box"}
    )
    assert joined.status == 201, joined.text
    return str(joined.body["machine_id"])


async def enrolment_on_bus(js: JetStreamContext, machine_id: str) -> Enrolment | None:
    """The machine's enrolment as the `enrolments` bucket holds it (None: it holds none)."""
    try:
        entry = await bind_bucket(js, names.ENROLMENTS).get(names.enrolment_key(machine_id))
    except KeyNotFoundError:
        return None
    return None if entry.value is None else Enrolment.from_bytes(entry.value)
