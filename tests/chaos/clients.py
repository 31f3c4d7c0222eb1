"""The workload mix: several clients launch, park, resume and remove through the api, seeded.

Each client launches its share of notebooks at a steady pace (GPU and CPU classes, some with a
fallback chain) and, between launches, acts on one of its own workloads: parks one it believes
running, resumes or removes one it parked. Some launches carry an Idempotency-Key: those are
retried with the same key until the api answers (through an api SIGKILL or SIGSTOP), and some
are sent twice on purpose; a launch without a key that gets no answer is not retried (its fate
is unknown, so it is not counted). Every request and its answer is recorded (`Request`), which
is what I3 judges.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from tests.chaos.model import Action, Request

LAUNCHES: tuple[tuple[int, dict[str, Any]], ...] = (
    (35, {"kind": "notebook", "class": "l40s-48gb"}),
    (30, {"kind": "notebook", "class": "cpu-2c-4g"}),
    (20, {"kind": "notebook", "class": "a100-80gb", "fallback": [{"class": "l40s-48gb"}]}),
    (
        15,
        {
            "kind": "notebook",
            "class": "h100-80gb",
            "fallback": [{"class": "a100-80gb"}, {"class": "cpu-4c-16g"}],
        },
    ),
)
"""(weight, body): the cell has L40S GPUs and cores only, so a chain walks to what it has."""

REQUEST_TIMEOUT_S = 20.0

KEEPALIVE_S = 1.0
"""How long a client keeps an idle connection to the api: well under uvicorn's 5 s, so it never
sends a request on a connection the api is closing (which reads as the api having dropped it)."""


def session(total_s: float) -> aiohttp.ClientSession:
    """An HTTP session for the cell's api, each request bounded by `total_s`."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=total_s),
        connector=aiohttp.TCPConnector(keepalive_timeout=KEEPALIVE_S),
    )


KEYED_RETRY_S = 90.0
"""How long a keyed launch is retried with its key before the client gives it up."""


@dataclass(frozen=True)
class Mix:
    launches: int
    clients: int
    duration_s: float
    """Over how long the launches are spread."""
    keyed: float = 0.3
    """Share of launches with an Idempotency-Key."""
    twice: float = 0.3
    """Share of keyed launches sent once more after their answer."""
    act: float = 0.7
    """Chance of an action on one of its workloads after each launch."""


class Client:
    """One client of the api, with its own connection pool and its own workloads."""

    def __init__(
        self, index: int, api_url: str, token: str, rng: random.Random, log: list[Request]
    ) -> None:
        self.index = index
        self.api_url = api_url
        self.headers = {"Authorization": f"Bearer {token}"}
        self.rng = rng
        self.log = log
        self.mine: dict[str, str] = {}
        """Its workloads, as it believes them: `live`, `parked`, `removed`, or `unknown` once
        a request about it went unanswered (it leaves those alone)."""
        self.acked_launches = 0

    async def run(self, mix: Mix, share: int, seed: int) -> None:
        pace = mix.duration_s / max(share, 1)
        deadline = time.monotonic() + mix.duration_s * 3
        async with session(REQUEST_TIMEOUT_S) as http:
            n = 0
            while self.acked_launches < share and time.monotonic() < deadline:
                began = time.monotonic()
                n += 1
                if self.rng.random() < mix.keyed:
                    await self._keyed_launch(http, f"chaos-{seed}-{self.index}-{n}", mix)
                else:
                    await self._launch(http, None)
                if self.rng.random() < mix.act:
                    await self._act(http)
                spent = time.monotonic() - began
                await asyncio.sleep(max(0.0, pace * self.rng.uniform(0.5, 1.5) - spent))

    async def _post(
        self, http: aiohttp.ClientSession, request: Request, path: str, **kw: Any
    ) -> dict[str, Any] | None:
        self.log.append(request)
        method = http.delete if request.action is Action.remove else http.post
        try:
            async with method(f"{self.api_url}{path}", headers=self._headers(request), **kw) as r:
                body = await r.json(content_type=None) if r.content_length != 0 else None
                request.status, request.answered = r.status, time.time()
                request.replayed = r.headers.get("Idempotent-Replayed") == "true"
        except (aiohttp.ClientError, TimeoutError):
            return None
        return body if isinstance(body, dict) else None

    def _headers(self, request: Request) -> dict[str, str]:
        if request.key is None:
            return self.headers
        return {**self.headers, "Idempotency-Key": request.key}

    def _body(self) -> dict[str, Any]:
        weights = [w for w, _ in LAUNCHES]
        return dict(self.rng.choices([b for _, b in LAUNCHES], weights)[0])

    async def _launch(self, http: aiohttp.ClientSession, key: str | None) -> Request:
        request = Request(self.index, Action.create, None, time.time(), key=key)
        body = await self._post(http, request, "/v1/workloads", json=self._body())
        if request.status == 201 and body is not None:
            request.workload = str(body["id"])
            if not request.replayed:
                self.acked_launches += 1
            self.mine[request.workload] = "live"
        return request

    async def _keyed_launch(self, http: aiohttp.ClientSession, key: str, mix: Mix) -> None:
        body = self._body()
        give_up = time.monotonic() + KEYED_RETRY_S
        while True:
            request = Request(self.index, Action.create, None, time.time(), key=key)
            answer = await self._post(http, request, "/v1/workloads", json=body)
            if request.status == 201 and answer is not None:
                request.workload = str(answer["id"])
                break
            if request.status is not None and request.status < 500:
                return  # refused: nothing to retry
            if time.monotonic() > give_up:
                return
            await asyncio.sleep(1.0)
        if not request.replayed:
            self.acked_launches += 1
        self.mine[request.workload] = "live"
        if self.rng.random() < mix.twice:
            again = Request(self.index, Action.create, None, time.time(), key=key)
            answer = await self._post(http, again, "/v1/workloads", json=body)
            if again.status == 201 and answer is not None:
                again.workload = str(answer["id"])

    async def _act(self, http: aiohttp.ClientSession) -> None:
        choices = sorted(w for w, s in self.mine.items() if s in ("live", "parked"))
        if not choices:
            return
        workload = self.rng.choice(choices)
        roll = self.rng.random()
        if self.mine[workload] == "live":
            action = Action.park if roll < 0.6 else Action.remove if roll < 0.8 else None
        else:
            action = Action.resume if roll < 0.7 else Action.remove
        if action is None:
            return
        request = Request(self.index, action, workload, time.time())
        path = f"/v1/workloads/{workload}" + ("" if action is Action.remove else f"/{action}")
        await self._post(http, request, path)
        if request.status == 202:
            self.mine[workload] = {"park": "parked", "resume": "live", "remove": "removed"}[
                action.value
            ]
        elif request.uncertain:
            self.mine[workload] = "unknown"


async def drive(api_url: str, token: str, mix: Mix, seed: int, log: list[Request]) -> list[Client]:
    """Every client's launches and actions, together; the clients (their counts) when done."""
    clients = [
        Client(i, api_url, token, random.Random(f"{seed}-client-{i}"), log)
        for i in range(mix.clients)
    ]
    shares = [
        mix.launches // mix.clients + (1 if i < mix.launches % mix.clients else 0)
        for i in range(mix.clients)
    ]
    await asyncio.gather(*(c.run(mix, s, seed) for c, s in zip(clients, shares, strict=True)))
    return clients
