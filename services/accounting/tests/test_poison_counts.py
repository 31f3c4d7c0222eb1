"""A token count that is no count is poison: consumed once, never retried for ever (issue 34, N8).

A count out of range (2^70 does not fit the store; 2^62 is a 64-bit number that sums overflow),
not a whole number ("12", true, 5.0), or a status no HTTP answer has, is terminated the first
time accounting sees it, logged once with its subject and sequence, counted, and stored
nowhere; the next good count is still counted. On a real nats-server, fetched in a batch with
good counts and alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

import pytest
from nats.js.errors import NotFoundError

from einsora.accounting.service import TOKENS_CONSUMER
from einsora.accounting.testing import T0, GatewayPlayer, ask_report, hours
from einsora.common.bus import message_headers, names
from einsora.common.schemas import ReportGroup, TokenUsage, UsageReportRequest
from einsora.common.testing import Bus

if TYPE_CHECKING:
    from services.accounting.tests.conftest import StartAccounting

POISON: list[tuple[str, Any]] = [
    ("prompt_tokens", 2**70),
    ("completion_tokens", 2**62),
    ("prompt_tokens", 2**31),
    ("prompt_tokens", "12"),
    ("completion_tokens", True),
    ("prompt_tokens", 5.0),
    ("status", 2**40),
]


async def _send(bus: Bus, usage: TokenUsage, **poison: Any) -> int:
    """Publish a count as the gateway does, with `poison` in place of its fields; its sequence."""
    payload = {**json.loads(usage.to_bytes()), **poison}
    ack = await bus.js.publish(
        names.usage_tokens_subject(usage.tenant_id),
        json.dumps(payload).encode(),
        headers=message_headers(request_id=usage.request_id, msg_id=usage.request_id),
    )
    return ack.seq


async def _taken_in(bus: Bus, seq: int) -> None:
    """Until accounting has acknowledged (or terminated) every count up to `seq`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:
        with contextlib.suppress(NotFoundError):
            info = await bus.js.consumer_info(names.USAGE.name, TOKENS_CONSUMER)
            if info.ack_floor is not None and (info.ack_floor.stream_seq or 0) >= seq:
                return
        if loop.time() > deadline:
            raise AssertionError(f"{TOKENS_CONSUMER} did not take in seq {seq} within 20 s")
        await asyncio.sleep(0.02)


async def _good_tokens(bus: Bus) -> list[tuple[str, int, int]]:
    window = (T0 - hours(1), T0 + hours(1))
    request = UsageReportRequest.model_validate(
        {"group_by": ReportGroup.key, "from": window[0], "to": window[1], "now": window[1]}
    )
    reply = await ask_report(bus.nc, request)
    return [(i.group, i.prompt_tokens, i.completion_tokens) for i in reply.items]


async def test_a_count_that_is_no_count_is_terminated_once_and_the_next_is_counted(
    bus: Bus,
    gateway: GatewayPlayer,
    start_accounting: StartAccounting,
    store_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="einsora")
    # Fetched together: poison among good counts in one batch.
    for field, value in POISON:
        await _send(bus, gateway.usage(T0, key_id="gk-poison"), **{field: value})
        seq = await _send(bus, gateway.usage(T0, key_id="gk-good", prompt=10, completion=5))
    accounting = await start_accounting(store_url)
    await _taken_in(bus, seq)
    # And one alone, then the next good count.
    await _taken_in(
        bus, await _send(bus, gateway.usage(T0, key_id="gk-poison"), prompt_tokens=2**70)
    )
    await _taken_in(
        bus, await _send(bus, gateway.usage(T0, key_id="gk-good", prompt=1, completion=1))
    )

    assert await _good_tokens(bus) == [("gk-good", 10 * len(POISON) + 1, 5 * len(POISON) + 1)]
    consumer = next(c for c in accounting._consumers if c._durable == TOKENS_CONSUMER)
    assert sum(consumer.terminated.values()) == len(POISON) + 1
    assert sum(consumer.redelivered.values()) == 0
    terminated = accounting.metrics.registry.get_sample_value(
        "einsora_bus_messages_terminated_total",
        {"consumer": TOKENS_CONSUMER, "reason": "non_retryable"},
    )
    assert terminated == len(POISON) + 1
    # Each logged once, with its subject and stream sequence; no traceback.
    logged = [r for r in caplog.records if r.getMessage().startswith("message terminated")]
    assert len(logged) == len(POISON) + 1
    assert len({getattr(r, "stream_seq", None) for r in logged}) == len(POISON) + 1
    assert all(getattr(r, "subject", "").startswith("usage.tokens.") for r in logged)
    assert not [r for r in caplog.records if r.exc_info]
