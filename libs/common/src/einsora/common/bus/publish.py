"""Publishing messages with the headers every message carries.

Every message says which request caused it (`Einsora-Request-Id`), carries trace context
(`traceparent`), and, when the publish may be retried, a `Nats-Msg-Id` so JetStream drops the
duplicate.

The trace context is the request's, never made up per message when there is one: while tracing
is on, that of the span sending the message (so the receiver's spans join the same trace); while
it is off, the `traceparent` the caller carried along (the one the request came with, kept in the
outbox or on the workload). Only a message no request caused gets a fresh one.
"""

from __future__ import annotations

import secrets

from nats.js import JetStreamContext
from nats.js.api import PubAck

from einsora.common import telemetry
from einsora.common.bus import names
from einsora.common.schemas.base import Message


def new_traceparent() -> str:
    """A fresh W3C `traceparent` (version 00, sampled)."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def message_headers(
    *, request_id: str, msg_id: str | None = None, traceparent: str | None = None
) -> dict[str, str]:
    """The headers of a message caused by `request_id`, in the trace of the span sending it
    (tracing on), else of `traceparent`."""
    if telemetry.ON:
        traceparent = telemetry.current_traceparent() or traceparent
    headers = {
        names.REQUEST_ID_HEADER: request_id,
        names.TRACEPARENT_HEADER: traceparent or new_traceparent(),
    }
    if msg_id is not None:
        headers[names.MSG_ID_HEADER] = msg_id
    return headers


async def publish(
    js: JetStreamContext,
    subject: str,
    message: Message,
    *,
    request_id: str,
    msg_id: str | None,
    traceparent: str | None = None,
    ack_timeout: float = 5.0,
) -> PubAck:
    """Publish `message` to a stream and wait for its ack (`ack.duplicate` when de-duplicated)."""
    return await js.publish(
        subject,
        message.to_bytes(),
        timeout=ack_timeout,
        headers=message_headers(request_id=request_id, msg_id=msg_id, traceparent=traceparent),
    )


def request_id_of(headers: dict[str, str] | None) -> str | None:
    """The request ID a received message carries, if any."""
    if not headers:
        return None
    return headers.get(names.REQUEST_ID_HEADER)


def traceparent_of(headers: dict[str, str] | None) -> str | None:
    """The trace context a received message carries, if any."""
    if not headers:
        return None
    return headers.get(names.TRACEPARENT_HEADER)
