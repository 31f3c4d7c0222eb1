"""Reading the messages accounting consumes, refusing for good what can never be stored.

A message that does not parse, came on another subject than its content names, or holds a
field too long for the tables (or a NUL, which Postgres refuses) is poison: the consumer
terminates it at once with the reason, rather than retrying it for ever. A token count that is
not a whole number from 0 to `MAX_TOKEN_COUNT` does not parse (`TokenUsage`).
"""

from __future__ import annotations

from nats.aio.msg import Msg
from pydantic import ValidationError

from einsora.common.bus import names
from einsora.common.errors import EinsoraError
from einsora.common.schemas import EventKind, TokenUsage, WorkloadEvent, what_is_wrong


class BadMessage(EinsoraError):
    """A message accounting can never take in."""

    code = "bad_message"
    retryable = False


def _check(field: str, value: str, limit: int) -> None:
    if len(value) > limit or "\x00" in value:
        raise BadMessage(f"{field} is longer than {limit} characters or holds a NUL")


def _check_token(field: str, value: str) -> None:
    if not names.is_subject_token(value, 64):
        raise BadMessage(f"{field} {value[:64]!r} is not an id (letters, digits, - and _)")


def event_of(msg: Msg) -> WorkloadEvent:
    """The workload event a message carries."""
    try:
        event = WorkloadEvent.from_bytes(msg.data)
    except ValidationError as exc:
        raise BadMessage(f"not a workload event: {what_is_wrong(exc)}") from exc
    _check_token("workload_id", event.workload_id)
    if msg.subject != names.event_subject(event.workload_id):
        raise BadMessage(f"event for {event.workload_id!r} came on {msg.subject}")
    if event.kind is EventKind.transition:
        _check_token("tenant_id", event.tenant_id)
        _check("event_id", event.event_id, 160)
        held = event.metered
        if held is not None:
            for field, value in (
                ("metered.class_name", held.class_name),
                ("metered.placed_class", held.placed_class),
                ("metered.region", held.region),
                ("metered.machine", held.machine),
            ):
                _check(field, value, 64)
            for gpu in held.gpus:
                _check("metered.gpus", gpu, 128)
            if held.cpus < 0 or held.memory_mib < 0:
                raise BadMessage("metered.cpus and metered.memory_mib cannot be negative")
    return event


def token_usage_of(msg: Msg) -> TokenUsage:
    """The token counts a message carries."""
    try:
        usage = TokenUsage.from_bytes(msg.data)
    except ValidationError as exc:
        raise BadMessage(f"not a token usage: {what_is_wrong(exc)}") from exc
    _check_token("tenant_id", usage.tenant_id)
    if msg.subject != names.usage_tokens_subject(usage.tenant_id):
        raise BadMessage(f"token usage of tenant {usage.tenant_id!r} came on {msg.subject}")
    _check("request_id", usage.request_id, 128)
    _check("key_id", usage.key_id, 64)
    _check("endpoint", usage.endpoint, 64)
    _check("model", usage.model, 256)
    return usage
