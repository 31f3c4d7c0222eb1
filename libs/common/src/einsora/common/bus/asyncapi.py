"""The bus, documented for operators: an AsyncAPI 3.0 document made from the code.

Every channel's address comes from `names` (the one module that spells the bus), every payload's
schema from the pydantic message it carries, every header from `names`; what this module adds
is who writes and who reads each channel, checked against the identities' permissions by
tests/test_asyncapi.py. `docs/asyncapi.json` is this document, regenerated with

    python -m einsora.common.bus.asyncapi > docs/asyncapi.json

and a test fails when the checked-in file and the code part.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from einsora.common.bus import names
from einsora.common.schemas import (
    AccessRedeemReply,
    AccessRedeemRequest,
    DesiredState,
    Enrolment,
    GatewayKey,
    Inventory,
    LeaderLease,
    ModelFallback,
    ObservedState,
    RegionStatus,
    Route,
    TenantQuota,
    TenantUsage,
    TokensRevoked,
    TokenUsage,
    UsageReportReply,
    UsageReportRequest,
    WorkloadEvent,
    WorkloadIntent,
)

AGENT = "agent"
"""Every machine's agent (its own keys only: `identities.agent_permissions`)."""


@dataclass(frozen=True)
class Channel:
    """One subject (or KV key) pattern of the bus: what it carries, who writes, who reads."""

    id: str
    address: str
    """The subject, `{parameters}` in braces."""
    sample: str
    """A concrete subject of it, for the permission checks."""
    description: str
    payload: type[BaseModel] | None
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    kind: str
    """`stream <NAME>`, `kv <bucket>`, `request/reply` or `core`."""
    parameters: dict[str, str] = field(default_factory=dict)
    reply: type[BaseModel] | None = None
    nats_cli: str = ""
    """How an operator reads it with the `nats` CLI."""


def _kv(bucket: names.BucketName, key: str) -> str:
    return bucket.key_subject(key)


M, W, R, T = "{machine}", "{workload}", "{region}", "{tenant}"

CHANNELS: tuple[Channel, ...] = (
    Channel(
        "intents",
        names.intent_subject("REGION", "WORKLOAD").replace("REGION", R).replace("WORKLOAD", W),
        names.intent_subject("local", "w-1"),
        names.INTENTS.description,
        WorkloadIntent,
        # The scheduler too: a region step hands the workload to the next region's scheduler,
        # and an intent that reached the region that no longer holds it is passed on (ADR-0022).
        writers=("api", "scheduler"),
        readers=("scheduler",),
        kind=f"stream {names.INTENTS.name}",
        parameters={"region": "the workload's region", "workload": "the workload's id"},
        nats_cli="nats stream view INTENTS; "
        "nats stream get INTENTS --last-for intent.local.workload.<id>",
    ),
    Channel(
        "events",
        names.event_subject("WORKLOAD").replace("WORKLOAD", W),
        names.event_subject("w-1"),
        names.EVENTS.description,
        WorkloadEvent,
        writers=("scheduler",),
        readers=("api", "accounting", "gateway"),
        kind=f"stream {names.EVENTS.name}",
        parameters={"workload": "the workload's id"},
        nats_cli="nats stream view EVENTS; nats stream view EVENTS --subject event.workload.<id>",
    ),
    Channel(
        "usage-tokens",
        names.usage_tokens_subject("TENANT").replace("TENANT", T),
        names.usage_tokens_subject("t-1"),
        "Each gateway request's token counts, and where they came from.",
        TokenUsage,
        writers=("gateway",),
        readers=("accounting", "api"),  # the api keeps each gateway key's last use (ADR-0019)
        kind=f"stream {names.USAGE.name}",
        parameters={"tenant": "the key's tenant"},
        nats_cli="nats stream view USAGE --subject usage.tokens.<tenant>",
    ),
    Channel(
        "usage-allocations",
        names.usage_allocation_subject("TENANT").replace("TENANT", T),
        names.usage_allocation_subject("t-1"),
        "Reserved for accounting's allocations: declared in the USAGE stream and permitted to "
        "accounting; no service publishes it yet.",
        None,
        writers=("accounting",),
        readers=(),
        kind=f"stream {names.USAGE.name}",
        parameters={"tenant": "the allocation's tenant"},
    ),
    Channel(
        "machine-desired",
        _kv(names.MACHINES, names.desired_key("MACHINE")).replace("MACHINE", M),
        _kv(names.MACHINES, names.desired_key("m-1")),
        "A machine's complete desired state, at a generation (level-triggered).",
        DesiredState,
        writers=("scheduler",),
        readers=(AGENT, "scheduler"),
        kind=f"kv {names.MACHINES.name}",
        parameters={"machine": "the machine's id"},
        nats_cli="nats kv get machines <machine>.desired",
    ),
    Channel(
        "machine-observed",
        _kv(names.MACHINES, names.observed_key("MACHINE")).replace("MACHINE", M),
        _kv(names.MACHINES, names.observed_key("m-1")),
        "What a machine runs, and the generation it applied (its heartbeat too).",
        ObservedState,
        writers=(AGENT,),
        readers=("scheduler", "api"),
        kind=f"kv {names.MACHINES.name}",
        parameters={"machine": "the machine's id"},
        nats_cli="nats kv get machines <machine>.observed",
    ),
    Channel(
        "machine-inventory",
        _kv(names.MACHINES, names.inventory_key("MACHINE")).replace("MACHINE", M),
        _kv(names.MACHINES, names.inventory_key("m-1")),
        "What a machine has: OS, CPUs, memory, GPUs, drivers.",
        Inventory,
        writers=(AGENT,),
        readers=("scheduler", "api"),
        kind=f"kv {names.MACHINES.name}",
        parameters={"machine": "the machine's id"},
        nats_cli="nats kv get machines <machine>.inventory",
    ),
    Channel(
        "leader-term",
        _kv(names.MACHINES, names.leader_term_key("REGION")).replace("REGION", R),
        _kv(names.MACHINES, names.leader_term_key("local")),
        "Which scheduler leads a region, in which term; its revision fences the leader's "
        "writes (ADR-0021).",
        LeaderLease,
        writers=("scheduler",),
        readers=("scheduler",),
        kind=f"kv {names.MACHINES.name}",
        parameters={"region": "the region"},
        nats_cli="nats kv get machines _leader.<region>.term",
    ),
    Channel(
        "leader-heartbeat",
        _kv(names.MACHINES, names.leader_heartbeat_key("REGION")).replace("REGION", R),
        _kv(names.MACHINES, names.leader_heartbeat_key("local")),
        "The leading scheduler's heartbeat; a standby takes over after a lease without one.",
        LeaderLease,
        writers=("scheduler",),
        readers=("scheduler",),
        kind=f"kv {names.MACHINES.name}",
        parameters={"region": "the region"},
        nats_cli="nats kv get machines _leader.<region>.heartbeat",
    ),
    Channel(
        "routes",
        _kv(names.ROUTES, names.route_key("WORKLOAD")).replace("WORKLOAD", W),
        _kv(names.ROUTES, names.route_key("w-1")),
        names.ROUTES.description,
        Route,
        writers=("scheduler",),
        readers=("proxy", "gateway"),
        kind=f"kv {names.ROUTES.name}",
        parameters={"workload": "the workload's id"},
        nats_cli="nats kv get routes <workload>  (holds the workload's token: proxy and gateway "
        "only)",
    ),
    Channel(
        "tenant-usage",
        _kv(names.USAGE_KV, names.tenant_usage_key("TENANT")).replace("TENANT", T),
        _kv(names.USAGE_KV, names.tenant_usage_key("t-1")),
        "A tenant's recent, decayed usage, for fair share.",
        TenantUsage,
        writers=("accounting",),
        readers=("scheduler", "api"),
        kind=f"kv {names.USAGE_KV.name}",
        parameters={"tenant": "the tenant's id"},
        nats_cli="nats kv get usage tenant.<tenant>",
    ),
    Channel(
        "tenant-quota",
        _kv(names.USAGE_KV, names.tenant_quota_key("TENANT")).replace("TENANT", T),
        _kv(names.USAGE_KV, names.tenant_quota_key("t-1")),
        "A tenant's quota, as the api's store holds it.",
        TenantQuota,
        writers=("api",),
        readers=("scheduler",),
        kind=f"kv {names.USAGE_KV.name}",
        parameters={"tenant": "the tenant's id"},
        nats_cli="nats kv get usage quota.<tenant>",
    ),
    Channel(
        "gateway-keys",
        _kv(names.GATEWAY_KEYS, names.gateway_key_key("KEY")).replace("KEY", "{key}"),
        _kv(names.GATEWAY_KEYS, names.gateway_key_key("k-1")),
        names.GATEWAY_KEYS.description,
        GatewayKey,
        writers=("api",),
        readers=("gateway",),
        kind=f"kv {names.GATEWAY_KEYS.name}",
        parameters={"key": "the gateway key's id"},
        nats_cli="nats kv get gateway_keys <key id>",
    ),
    Channel(
        "gateway-limits",
        _kv(names.GATEWAY_LIMITS, "KEY.MINUTE")
        .replace("KEY", "{key}")
        .replace("MINUTE", "{minute}"),
        _kv(names.GATEWAY_LIMITS, names.gateway_limit_key("k-1", 29000000)),
        names.GATEWAY_LIMITS.description + " A small JSON object of counts, no versioned message.",
        None,
        writers=("gateway",),
        readers=("gateway",),
        kind=f"kv {names.GATEWAY_LIMITS.name}",
        parameters={"key": "the gateway key's id", "minute": "Unix minutes"},
        nats_cli="nats kv get gateway_limits <key id>.<minute>",
    ),
    Channel(
        "enrolments",
        _kv(names.ENROLMENTS, names.enrolment_key("MACHINE")).replace("MACHINE", M),
        _kv(names.ENROLMENTS, names.enrolment_key("m-1")),
        names.ENROLMENTS.description,
        Enrolment,
        writers=("api",),
        readers=("scheduler", "proxy"),
        kind=f"kv {names.ENROLMENTS.name}",
        parameters={"machine": "the machine's id"},
        nats_cli="nats kv get enrolments <machine>",
    ),
    Channel(
        "regions",
        _kv(names.REGIONS, names.region_key("REGION")).replace("REGION", R),
        _kv(names.REGIONS, names.region_key("local")),
        names.REGIONS.description,
        RegionStatus,
        writers=("scheduler",),
        readers=("api", "scheduler"),
        kind=f"kv {names.REGIONS.name}",
        parameters={"region": "the region's name"},
        nats_cli="nats kv get regions <region>",
    ),
    Channel(
        "model-fallbacks",
        _kv(names.MODEL_FALLBACKS, names.model_fallback_key("WORKLOAD")).replace("WORKLOAD", W),
        _kv(names.MODEL_FALLBACKS, names.model_fallback_key("w-1")),
        names.MODEL_FALLBACKS.description,
        ModelFallback,
        writers=("api",),
        readers=("gateway",),
        kind=f"kv {names.MODEL_FALLBACKS.name}",
        parameters={"workload": "the endpoint's workload id"},
        nats_cli="nats kv get model_fallbacks <workload>",
    ),
    Channel(
        "access-redeem",
        names.ACCESS_REDEEM_SUBJECT,
        names.ACCESS_REDEEM_SUBJECT,
        "The proxy redeems an access ticket; one api replica answers (queue group `api`).",
        AccessRedeemRequest,
        writers=("proxy",),
        readers=("api",),
        kind="request/reply",
        reply=AccessRedeemReply,
    ),
    Channel(
        "accounting-report",
        names.ACCOUNTING_REPORT_SUBJECT,
        names.ACCOUNTING_REPORT_SUBJECT,
        "The api asks accounting for a usage report (queue group `accounting`).",
        UsageReportRequest,
        writers=("api",),
        readers=("accounting",),
        kind="request/reply",
        reply=UsageReportReply,
    ),
    Channel(
        "tokens-revoked",
        names.TOKENS_REVOKED_SUBJECT,
        names.TOKENS_REVOKED_SUBJECT,
        "API tokens revoked: every api replica drops them from its cache at once.",
        TokensRevoked,
        writers=("api",),
        readers=("api",),
        kind="core",
    ),
)
"""Every channel of the bus. The tests check each against `names` and `identities`."""

HEADERS: dict[str, str] = {
    names.REQUEST_ID_HEADER: "The request that caused the message (the `X-Request-ID` of the "
    "API call), on every message it causes.",
    names.TRACEPARENT_HEADER: "W3C trace context: the trace of that request (ADR-0020).",
    names.MSG_ID_HEADER: "JetStream's de-duplication id, on every publish that may be retried.",
    names.EXPECTED_LAST_SUBJECT_SEQUENCE_HEADER: "On a leader's writes: the revision of its "
    "lease's term key they are fenced on (ADR-0021).",
    names.EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT_HEADER: "The lease's term key that revision is "
    "of.",
}


def _models() -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    for channel in CHANNELS:
        for model in (channel.payload, channel.reply):
            if model is not None and model not in found:
                found.append(model)
    return found


def document(version: str = "0.1.0") -> dict[str, Any]:
    """The AsyncAPI 3.0 document of the bus."""
    _, top = models_json_schema(
        [(m, "serialization") for m in _models()],
        ref_template="#/components/schemas/{model}",
    )
    schemas: dict[str, Any] = dict(top.get("$defs", {}))
    schemas["Headers"] = {
        "type": "object",
        "properties": {name: {"type": "string", "description": d} for name, d in HEADERS.items()},
    }
    messages: dict[str, Any] = {}
    for model in _models():
        messages[model.__name__] = {
            "name": model.__name__,
            "title": model.__name__,
            "summary": (model.__doc__ or "").strip().splitlines()[0],
            "contentType": "application/json",
            "headers": {"$ref": "#/components/schemas/Headers"},
            "payload": {"$ref": f"#/components/schemas/{model.__name__}"},
        }
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for c in CHANNELS:
        channel: dict[str, Any] = {
            "address": c.address,
            "description": c.description,
            "messages": {},
            "x-einsora-kind": c.kind,
            "x-einsora-writers": list(c.writers),
            "x-einsora-readers": list(c.readers),
        }
        if c.nats_cli:
            channel["x-einsora-nats-cli"] = c.nats_cli
        if c.parameters:
            channel["parameters"] = {k: {"description": v} for k, v in c.parameters.items()}
        for carried in (c.payload, c.reply):
            if carried is not None:
                channel["messages"][carried.__name__] = {
                    "$ref": f"#/components/messages/{carried.__name__}"
                }
        channels[c.id] = channel
        sent = [{"$ref": f"#/channels/{c.id}/messages/{c.payload.__name__}"}] if c.payload else []
        for writer in c.writers:
            operation: dict[str, Any] = {
                "action": "send",
                "channel": {"$ref": f"#/channels/{c.id}"},
                "messages": sent,
            }
            if c.reply is not None:
                operation["reply"] = {
                    "channel": {"$ref": f"#/channels/{c.id}"},
                    "messages": [{"$ref": f"#/channels/{c.id}/messages/{c.reply.__name__}"}],
                }
            operations[f"{writer}-sends-{c.id}"] = operation
        for reader in c.readers:
            operations[f"{reader}-receives-{c.id}"] = {
                "action": "receive",
                "channel": {"$ref": f"#/channels/{c.id}"},
                "messages": sent,
            }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Einsora's bus",
            "version": version,
            "description": "Every stream, subject, KV key and header of one Einsora cell's NATS "
            "JetStream bus, who writes each and who reads it. Generated from "
            "`einsora.common.bus.names` and the message schemas; docs/operators.md shows how "
            "to read each with the `nats` CLI.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "cell": {
                "host": "nats:4222",
                "protocol": "nats",
                "description": "The cell's NATS (a 3-node cluster in Lab); every client "
                "authenticates (ADR-0009, ADR-0016).",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"schemas": schemas, "messages": messages},
        "x-einsora-streams": [
            {"name": s.name, "subjects": list(s.subjects), "description": s.description}
            for s in names.STREAMS
        ],
        "x-einsora-buckets": [
            {
                "name": b.name,
                "stream": b.stream,
                "description": b.description,
                "max_value_size": b.max_value_size,
            }
            for b in names.BUCKETS
        ],
    }


def render() -> str:
    """The document as it is checked in: JSON, 2-space indented, keys in the code's order."""
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
