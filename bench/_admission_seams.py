"""The seams of `bench/admission.py`: how launches are made and how their arrival is seen.

`IntentLauncher` publishes create intents straight onto INTENTS (the api's outbox relay's job);
`ApiLauncher` POSTs /v1/workloads to a real api. `KvObserver` watches the `machines` bucket;
`KvSimMachines` writes fake inventories when no sim agent runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Protocol

import aiohttp
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from einsora.common.bus import bind_bucket, message_headers, names
from einsora.common.bus.batch import BatchPublisher, Message
from einsora.common.ids import new_id
from einsora.common.schemas import Enrolment, Gpu, Inventory, WorkloadIntent, WorkloadKind

API_CLIENTS = 64
"""Requests in flight during the burst: a burst is many people (or one script) at once."""

API_LIMITS_OFF = {
    "EINSORA_API_REQUESTS_PER_MINUTE": "0",
    "EINSORA_API_LAUNCHES_PER_MINUTE": "0",
    "EINSORA_TENANT_MAX_WORKLOADS": "0",
}
"""The api's rate limits and workload cap, off: the bench launches thousands a minute as one
token, which is what the limits are there to refuse."""


RELAY_ROWS = 500
"""The most outbox rows the api's relay publishes together (OutboxRelay's `batch`)."""

TENANT = "t-bench"
"""The tenant of the intents IntentLauncher publishes."""


class Launcher(Protocol):
    """Launches workloads; `launched` records when each launch was accepted."""

    launched: dict[str, float]

    async def tenant(self) -> str:
        """The tenant its workloads belong to (the machines are enrolled as that tenant's)."""

    async def launch(self, workload_id: str, class_name: str) -> None: ...

    async def settle(self) -> None:
        """Wait until every launch so far is accepted."""


class DesiredObserver(Protocol):
    """Records when each workload was first seen in a machine's desired state."""

    seen: dict[str, float]
    machines: set[str]

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class IntentLauncher:
    """Publishes create intents as the api's outbox relay does: whatever has queued up since its
    last publish goes out together (up to its 500 rows), a run as atomic batches
    (bus/batch.py), the next run once that one is acked."""

    def __init__(self, nc: NATS, js: JetStreamContext, region: str = "local") -> None:
        self._region = region
        self._out = BatchPublisher(nc, js, stream=names.INTENTS.name)
        self.launched: dict[str, float] = {}
        self._queued: list[tuple[str, Message]] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._relay: asyncio.Task[None] | None = None

    async def tenant(self) -> str:
        return TENANT

    async def launch(self, workload_id: str, class_name: str) -> None:
        intent = WorkloadIntent.model_validate(
            {
                "intent_id": new_id("intent"),
                "action": "create",
                "workload_id": workload_id,
                "tenant_id": TENANT,
                "region": self._region,
                "kind": WorkloadKind.notebook,
                "class": class_name,
            }
        )
        headers = message_headers(request_id=new_id("request"), msg_id=intent.intent_id)
        subject = names.intent_subject(self._region, workload_id)
        self._queued.append((workload_id, (subject, intent.to_bytes(), headers)))
        self._idle.clear()
        self._wake.set()
        if self._relay is None:
            self._relay = asyncio.create_task(self._run())
        await asyncio.sleep(0)  # as a request would: the relay gets its turn between launches

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queued:
                run, self._queued = self._queued[:RELAY_ROWS], self._queued[RELAY_ROWS:]
                outcomes = await self._out.publish([message for _, message in run])
                now = time.perf_counter()
                for (workload_id, _), outcome in zip(run, outcomes, strict=True):
                    if isinstance(outcome, BaseException):
                        raise outcome
                    self.launched.setdefault(workload_id, now)
            if not self._wake.is_set():
                self._idle.set()

    async def settle(self) -> None:
        if self._relay is None:
            return
        idle = asyncio.ensure_future(self._idle.wait())
        try:
            # The relay only ends by failing: then why, raised here, instead of waiting on.
            await asyncio.wait((idle, self._relay), return_when=asyncio.FIRST_COMPLETED)
        finally:
            idle.cancel()
        if self._relay.done():
            self._relay.result()


class ApiLauncher:
    """POSTs /v1/workloads to a real `einsora api` process; the clock starts at its 201.

    At most `in_flight` requests are outstanding, as a handful of busy clients would send them.
    """

    def __init__(self, base: str, token: str, in_flight: int = API_CLIENTS) -> None:
        self._base = base
        self._headers = {"Authorization": f"Bearer {token}"}
        self._slots = asyncio.Semaphore(in_flight)
        self._http: aiohttp.ClientSession | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self.launched: dict[str, float] = {}

    async def tenant(self) -> str:
        async with (
            aiohttp.ClientSession(headers=self._headers) as http,
            http.get(f"{self._base}/v1/me") as resp,
        ):
            me = await resp.json()
        return str(me["tenant"]["id"])

    async def launch(self, workload_id: str, class_name: str) -> None:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), headers=self._headers
            )
        await self._slots.acquire()
        task = asyncio.create_task(self._post(class_name))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _post(self, class_name: str) -> None:
        assert self._http is not None
        try:
            async with self._http.post(
                f"{self._base}/v1/workloads", json={"kind": "notebook", "class": class_name}
            ) as resp:
                body = await resp.json()
                if resp.status != 201:
                    raise RuntimeError(f"POST /v1/workloads answered {resp.status}: {body}")
                self.launched[body["id"]] = time.perf_counter()
        finally:
            self._slots.release()

    async def settle(self) -> None:
        await asyncio.gather(*list(self._pending))

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


class KvObserver:
    """Watches every `<machine>.<kind>` key: when each workload first appears in one.

    On `desired` keys it is what the machines' agents each see of their own; on `observed`
    keys, when an agent first reports each workload.
    """

    def __init__(self, kv: KeyValue, kind: str) -> None:
        self._kv = kv
        self._pattern = f"*.{kind}"
        self.seen: dict[str, float] = {}
        self.machines: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        watcher = await self._kv.watch(self._pattern)
        self._task = asyncio.create_task(self._pump(watcher))

    async def _pump(self, watcher: KeyValue.KeyWatcher) -> None:
        async for entry in watcher:
            if entry is None or not entry.value:
                continue
            now = time.perf_counter()
            value = json.loads(entry.value)
            self.machines.add(value["machine_id"])
            for workload in value["workloads"]:
                self.seen.setdefault(workload["workload_id"], now)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def enrol(js: JetStreamContext, machine_ids: list[str], owner_tenant_id: str) -> None:
    """Enrol the sim machines as the api does (the scheduler counts only enrolled machines)."""
    kv = bind_bucket(js, names.ENROLMENTS)
    for machine_id in machine_ids:
        enrolment = Enrolment(
            machine_id=machine_id, owner_tenant_id=owner_tenant_id, region="local"
        )
        await kv.put(names.enrolment_key(machine_id), enrolment.to_bytes())


def sim_machine_ids(count: int) -> list[str]:
    """The ids KvSimMachines writes."""
    return [f"m-sim{i:05d}" for i in range(count)]


class KvSimMachines:
    """Writes fake machines' inventories, as sim agents would."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def join(self, count: int) -> None:
        for machine_id in sim_machine_ids(count):
            inventory = Inventory(
                machine_id=machine_id,
                region="local",
                hostname=machine_id,
                os="linux",
                arch="x86_64",
                cpus=64,
                memory_mib=512 * 1024,
                gpus=[
                    Gpu(
                        index=g, uuid=f"GPU-{machine_id}-{g}", model="NVIDIA L40S", memory_mib=46068
                    )
                    for g in range(4)
                ],
                drivers=["sim"],
            )
            await self._kv.put(names.inventory_key(machine_id), inventory.to_bytes())
