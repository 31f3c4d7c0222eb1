"""What the fault tests of the leader lease check, from the bus's and the store's own record
(issue 35, F1): for test code only, never imported by the service.

`FrozenLeaderCheck` keeps every desired value written to the `machines` bucket in a stream of its
own (sourced from the bucket's stream, so a value the bucket replaced is still there), then
checks that each machine's desired generations only grew, that one generation always carried one
content, and that the bucket and the scheduler's store agree at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import sqlalchemy as sa
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy, StreamConfig, StreamSource
from nats.js.errors import KeyNotFoundError, NotFoundError

from einsora.common.bus import bind_bucket, names
from einsora.common.schemas import DesiredState, LeaderLease
from einsora.store import create_engine

T = TypeVar("T")

AUDIT_STREAM = "TEST_DESIRED_AUDIT"
"""The test's own stream: every desired value the bucket stored, kept."""


class FrozenLeaderCheck:
    """Records every desired write from `start()` on; `verify()` checks them."""

    def __init__(
        self, nc: NATS, js: JetStreamContext, database_url: str, *, replicas: int = 1
    ) -> None:
        self._nc = nc
        self._js = js
        self._database_url = database_url
        self._replicas = replicas

    async def start(self) -> None:
        with contextlib.suppress(NotFoundError):
            await self._js.delete_stream(AUDIT_STREAM)
        await self._js.add_stream(
            StreamConfig(
                name=AUDIT_STREAM,
                sources=[
                    StreamSource(name=names.MACHINES.stream, filter_subject=names.DESIRED_SUBJECTS)
                ],
                num_replicas=self._replicas,
            )
        )

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self._js.delete_stream(AUDIT_STREAM)

    # --- waiting on the cell --------------------------------------------------------------

    async def leader(self, region: str = "local") -> LeaderLease | None:
        kv = bind_bucket(self._js, names.MACHINES)
        try:
            entry = await kv.get(names.leader_term_key(region))
        except KeyNotFoundError:
            return None
        return LeaderLease.from_bytes(entry.value) if entry.value else None

    async def until_leader(self, data_dir: Path, within_s: float = 60.0) -> LeaderLease:
        """Until the scheduler with this data dir holds the lease."""
        holder = data_dir / "scheduler" / "holder-local"

        async def leads() -> LeaderLease | None:
            lease = await self.leader()
            if lease is not None and lease.holder == await asyncio.to_thread(_read, holder):
                return lease
            return None

        return await _until(leads, within_s, f"{data_dir.name} leads")

    async def until_holder_file(self, data_dir: Path, within_s: float = 60.0) -> None:
        """Until the scheduler with this data dir has started (it has named itself)."""
        holder = data_dir / "scheduler" / "holder-local"

        async def named() -> bool:
            return bool(await asyncio.to_thread(_read, holder))

        await _until(named, within_s, f"{data_dir.name} started")

    async def until_logged(self, log: Path, text: str, within_s: float = 30.0) -> None:
        async def logged() -> bool:
            return text in await asyncio.to_thread(_read, log)

        await _until(logged, within_s, f"{text!r} in {log.name}")

    async def placements(self) -> dict[str, list[tuple[str, str]]]:
        """Each workload in a desired state in the bucket now: [(machine, target)]."""
        kv = bind_bucket(self._js, names.MACHINES)
        info = await self._js.stream_info(
            names.MACHINES.stream, subjects_filter=names.DESIRED_SUBJECTS
        )
        found: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for subject in info.state.subjects or {}:
            try:
                entry = await kv.get(subject.removeprefix(names.MACHINES.subject_prefix))
            except KeyNotFoundError:
                continue
            if entry.value:
                desired = DesiredState.from_bytes(entry.value)
                for w in desired.workloads:
                    found[w.workload_id].append((desired.machine_id, w.target.value))
        return found

    async def until_placed(self, workload_ids: list[str], within_s: float = 60.0) -> None:
        """Until every one of these workloads is in some machine's desired state."""

        async def placed() -> bool:
            found = await self.placements()
            return all(found.get(w) for w in workload_ids)

        await _until(placed, within_s, f"{len(workload_ids)} workloads placed")

    # --- checking ---------------------------------------------------------------------------

    async def desired_history(self) -> dict[str, list[DesiredState]]:
        """Every desired value the bucket stored since `start()`, per machine, in order."""
        await _until(self._sourced_all, 30.0, "the audit stream caught up")
        info = await self._js.stream_info(AUDIT_STREAM)
        history: dict[str, list[DesiredState]] = defaultdict(list)
        if not info.state.messages:
            return history
        sub = await self._js.subscribe(
            names.DESIRED_SUBJECTS,
            stream=AUDIT_STREAM,
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        )
        try:
            for _ in range(info.state.messages):
                msg = await sub.next_msg(timeout=10)
                if msg.data:
                    desired = DesiredState.from_bytes(msg.data)
                    history[desired.machine_id].append(desired)
        finally:
            await sub.unsubscribe()
        return history

    async def _sourced_all(self) -> bool:
        audit = await self._js.stream_info(AUDIT_STREAM)
        return bool(audit.sources) and all(s.lag == 0 for s in audit.sources or [])

    async def verify(self, *, expect_machines: int) -> dict[str, list[int]]:
        """Raise AssertionError with the evidence when a generation went back, a generation
        carried two contents, or the bucket and the store disagree; else each machine's
        generations, in the order they were written."""
        history = await self.desired_history()
        generations = {m: [d.generation for d in values] for m, values in history.items()}
        for machine_id, values in history.items():
            gens = generations[machine_id]
            back = [(a, b) for a, b in itertools.pairwise(gens) if b < a]
            assert not back, f"{machine_id}: desired generation went back {back} in {gens}"
            contents: dict[int, str] = {}
            for desired in values:
                content = json.dumps(desired.model_dump(mode="json"), sort_keys=True)
                seen = contents.setdefault(desired.generation, content)
                assert seen == content, (
                    f"{machine_id}: generation {desired.generation} written with two contents"
                )
        await _until(lambda: self._agree(expect_machines), 15.0, "the store and bucket agree")
        return generations

    async def _agree(self, expect_machines: int) -> bool:
        stored = await self._stored_generations()
        kv = bind_bucket(self._js, names.MACHINES)
        in_kv: dict[str, int | None] = {}
        for machine_id in stored:
            try:
                entry = await kv.get(names.desired_key(machine_id))
            except KeyNotFoundError:
                in_kv[machine_id] = None
                continue
            in_kv[machine_id] = DesiredState.from_bytes(entry.value or b"").generation
        return len(stored) == expect_machines and all(in_kv[m] == g for m, g in stored.items())

    async def _stored_generations(self) -> dict[str, int]:
        engine = create_engine(self._database_url)
        try:
            async with engine.connect() as conn:
                rows = await conn.execute(
                    sa.text("SELECT machine_id, generation FROM scheduler_machines")
                )
                return {r.machine_id: int(r.generation) for r in rows}
        finally:
            await engine.dispose()


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


async def _until(check: Callable[[], Awaitable[T | None]], within_s: float, what: str) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within_s} s waiting for {what}")
        await asyncio.sleep(0.1)
