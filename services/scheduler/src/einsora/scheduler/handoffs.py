"""Publishing the intents this scheduler hands to other regions' schedulers (ADR-0022).

A hand-over (or an intent passed on) is stored with the cycle that decided it; once the cycle's
events are out, it is published to the other region's intent subject with `Nats-Msg-Id` = its
intent id, and forgotten by a later commit. A scheduler that dies in between publishes it again
at its next start (the stored rows are loaded with the book): the same id, so JetStream drops
the copy within its window and the other scheduler, which records the intents it applied,
ignores it after that. Like the rest of a cycle's projection, a hand-over that cannot be
published now is tried again with every later projection; the intents of the cycle that decided
it are acked at its commit (ADR-0004), since the store holds it from then on.
"""

from __future__ import annotations

import asyncio
import logging

from nats.js import JetStreamContext

from einsora.common.bus import message_headers, names
from einsora.common.errors import EinsoraError
from einsora.scheduler.book import Changes, Handoff

log = logging.getLogger("einsora.scheduler.handoffs")


class HandoffsFailed(EinsoraError):
    """A hand-over could not be published yet; it stays stored and is tried again."""

    code = "handoff_failed"
    retryable = True


class HandoffSender:
    """Stored hand-overs waiting to be published, and those published since the last commit."""

    def __init__(self, js: JetStreamContext, *, publish_timeout_s: float = 5.0) -> None:
        self._js = js
        self._timeout = publish_timeout_s
        self._lock = asyncio.Lock()
        self.pending: dict[str, Handoff] = {}
        self.sent: list[str] = []
        """Published hand-overs whose stored rows the next commit forgets."""

    def load(self, handoffs: list[Handoff]) -> None:
        """What the store still holds (at start, and after a reload)."""
        self.pending = {h.intent.intent_id: h for h in handoffs}

    def take(self, changes: Changes) -> None:
        """A committed cycle's hand-overs, to publish."""
        for handoff in changes.handoffs:
            self.pending[handoff.intent.intent_id] = handoff

    def forget_sent(self, changes: Changes) -> None:
        """Give the next commit the rows of what was published (it deletes them)."""
        changes.handoffs_sent.extend(self.sent)
        self.sent = []

    async def send(self) -> None:
        """Publish every pending hand-over; raises HandoffsFailed if any is still pending."""
        if not self.pending:
            return
        async with self._lock:
            failed: list[str] = []
            error: Exception | None = None
            for intent_id, handoff in list(self.pending.items()):
                intent = handoff.intent
                subject = names.intent_subject(intent.region, intent.workload_id)
                headers = message_headers(request_id=handoff.request_id, msg_id=intent_id)
                try:
                    await self._js.publish(
                        subject, intent.to_bytes(), headers=headers, timeout=self._timeout
                    )
                except Exception as exc:  # recorded below; each is tried again next time
                    failed.append(intent_id)
                    error = exc
                    continue
                if self.pending.pop(intent_id, None) is not None:
                    self.sent.append(intent_id)
            if failed:
                log.warning(
                    "hand-overs to other regions are not published yet; retrying",
                    extra={"intent_ids": failed[:10], "failed": len(failed), "error": repr(error)},
                )
                raise HandoffsFailed(f"{len(failed)} hand-overs not yet published: {error!r}")
