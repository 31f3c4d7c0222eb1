"""Watching the whole `machines` bucket: inventories, observed states, and our own desired keys.

The scheduler is a trusted client, so it watches every key with nats-py's `watchall`. It starts
with a snapshot of every key's latest value, then follows changes. Because the bucket is only a
projection, it may be deleted: an audit checks the bucket's stream every few seconds, recreates
it when it is gone (`provision`), and restarts the watch with a fresh snapshot when the stream
is a new one, so the engine rewrites every desired state from the store. The audit also lists
which desired keys exist, because a key purged from the stream leaves no trace a watch sees, and
restarts the watch after the client reconnected (nats-py's ordered consumer otherwise takes tens
of seconds to notice that a restarted server forgot it).

Machines' own values (inventories and observed states) reach the engine through a `Pacer`: one
machine rewriting its keys in a loop costs the engine one value per interval, the latest, and
never holds up another machine's or tenant's work (issue 34, N7). A first value, and a heartbeat
seconds after the last, pass at once. Desired keys (ours) are never held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from einsora.common.bus import ShortRead, check_whole, key_count, names, provision, reconnects
from einsora.common.bus.pace import MACHINE_REPORT_EVERY_S, Pacer
from einsora.common.failures import log_failure
from einsora.common.runloop import raise_if_cancelled

log = logging.getLogger("einsora.scheduler.watch")

SNAPSHOT_ATTEMPTS = 5
"""Reads of the bucket a snapshot may take before the caller is told (nats.py#842)."""


@dataclass(frozen=True)
class MachineKey:
    """One value (or deletion) of one key of the `machines` bucket."""

    machine_id: str
    kind: str
    value: bytes
    revision: int
    deleted: bool
    stored_at: datetime | None = None
    """When the bus stored it (the server's clock, never the agent's): a machine's last sign
    of life, for a value read again after a takeover or a reload (issue 35, F7)."""


def _parse(entry: KeyValue.Entry) -> MachineKey | None:
    try:
        machine_id, kind = names.split_machine_key(entry.key)
    except ValueError:
        return None
    created: object = entry.created  # nats-py types it int; a watch gives the stored datetime
    return MachineKey(
        machine_id=machine_id,
        kind=kind,
        value=entry.value or b"",
        revision=entry.revision or 0,
        deleted=entry.operation in (KV_DEL, KV_PURGE),
        stored_at=created if isinstance(created, datetime) else None,
    )


class MachinesWatch:
    """Feeds every change of the bucket to `on_key`, after a snapshot given to `on_snapshot`."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        *,
        on_snapshot: Callable[[list[MachineKey]], Awaitable[None]],
        on_key: Callable[[MachineKey], None],
        on_present: Callable[[set[str]], None],
        audit_s: float = 2.0,
        replicas: int = 1,
    ) -> None:
        self._nc = nc
        self._js = js
        self._replicas = replicas
        self._reconnects = 0
        self._on_snapshot = on_snapshot
        self._on_key = on_key
        self._on_present = on_present
        self._audit_s = audit_s
        self._watcher: KeyValue.KeyWatcher | None = None
        self._pump: asyncio.Task[None] | None = None
        self._audit: asyncio.Task[None] | None = None
        self._created: datetime | None = None
        self._pacer: Pacer[tuple[str, str], MachineKey] = Pacer(
            lambda _, key: self._on_key(key), lambda k: MACHINE_REPORT_EVERY_S[k[1]]
        )

    @property
    def machine_values_read(self) -> int:
        """Machines' values handed to the engine (at their pace) since the start."""
        return self._pacer.delivered

    async def start(self) -> None:
        await self._watch()
        self._audit = asyncio.create_task(self._audit_loop(), name="machines audit")

    async def stop(self) -> None:
        audit, self._audit = self._audit, None
        if audit is not None:
            audit.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await audit
        await self._unwatch()

    async def _watch(self) -> None:
        # What this read covers is recorded only once it is applied and followed: a read that
        # fails half-way (JetStream still coming back, a store outage failing the snapshot)
        # leaves no pump, and the next audit reads again (see `_check`).
        seen = reconnects(self._nc).count
        kv = await self._js.key_value(names.MACHINES.name)
        info = await self._js.stream_info(names.MACHINES.stream)
        for attempt in range(1, SNAPSHOT_ATTEMPTS + 1):
            try:
                watcher, snapshot = await self._read_snapshot(kv)
                break
            except ShortRead as exc:
                # A new leader that took a short read for the bucket would write desired
                # states over ones it never saw: read again.
                if attempt == SNAPSHOT_ATTEMPTS:
                    raise
                log.warning(str(exc), extra={"attempt": attempt})
        self._watcher = watcher
        log.info("machines bucket snapshot read", extra={"keys": len(snapshot)})
        await self._on_snapshot(snapshot)
        self._pump = asyncio.create_task(self._pump_loop(watcher), name="machines watch")
        self._reconnects = seen
        self._created = info.created

    async def _read_snapshot(self, kv: KeyValue) -> tuple[KeyValue.KeyWatcher, list[MachineKey]]:
        """A watch of the whole bucket and every key it held (raises ShortRead when the watch
        delivered fewer keys than the bucket's stream holds)."""
        expected = await key_count(self._js, names.MACHINES)
        watcher = await kv.watchall()
        snapshot: list[MachineKey] = []
        delivered = 0
        try:
            while True:
                entry = await watcher.updates(timeout=30)  # type: ignore[no-untyped-call]
                if entry is None:
                    break
                delivered += 1
                key = _parse(entry)
                if key is not None:
                    snapshot.append(key)
            check_whole(names.MACHINES, delivered, expected)
        except BaseException:
            with contextlib.suppress(nats.errors.Error, OSError):
                await watcher.stop()  # type: ignore[no-untyped-call]
            raise
        return watcher, snapshot

    async def _unwatch(self) -> None:
        self._pacer.clear()  # the next read's snapshot has each key's latest value
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            with contextlib.suppress(nats.errors.Error, OSError):
                await watcher.stop()  # type: ignore[no-untyped-call]

    async def _pump_loop(self, watcher: KeyValue.KeyWatcher) -> None:
        async for entry in watcher:
            if entry is None:
                continue
            key = _parse(entry)
            if key is None:
                continue
            if key.kind in MACHINE_REPORT_EVERY_S:
                self._pacer.offer((key.machine_id, key.kind), key)
            else:
                self._on_key(key)

    async def _audit_loop(self) -> None:
        signal = reconnects(self._nc)
        seen = signal.count
        while True:
            raise_if_cancelled()
            # Each audit period, or at once after a reconnect (which the check then sees). A
            # reconnect cuts one wait short, never more: a check that fails is tried again a
            # period later, not at once, however long the bus takes to answer again.
            await signal.passed(seen, self._audit_s)
            seen = signal.count
            try:
                await self._check()
            except Exception as exc:
                raise_if_cancelled()
                # Whatever it was, the audit goes on: a transient failure is said without its
                # traceback, anything else with it.
                log_failure(log, "machines bucket audit failed; retrying", exc)

    async def _check(self) -> None:
        # Only the desired keys: a third of the bucket, so a thousand machines' audit stays cheap.
        try:
            info = await self._js.stream_info(
                names.MACHINES.stream, subjects_filter=names.DESIRED_SUBJECTS
            )
        except NotFoundError:
            log.warning("the machines bucket is gone; recreating it and rewriting desired states")
            await provision(self._js, replicas=self._replicas)
            info = await self._js.stream_info(names.MACHINES.stream)
        if self._pump is None or self._pump.done():
            log.warning("the machines watch is not running; reading the bucket again")
            await self._unwatch()
            await self._watch()
            return
        if info.created != self._created:
            log.warning("the machines bucket is new; rereading it and rewriting desired states")
            await self._unwatch()
            await self._watch()
            return
        if reconnects(self._nc).count != self._reconnects:
            log.info("reconnected to NATS; rereading the machines bucket")
            await self._unwatch()
            await self._watch()
            return
        present = set()
        for subject in info.state.subjects or {}:
            with contextlib.suppress(ValueError):
                machine_id, kind = names.split_machine_key(
                    subject.removeprefix(names.MACHINES.subject_prefix)
                )
                if kind == "desired":
                    present.add(machine_id)
        self._on_present(present)
