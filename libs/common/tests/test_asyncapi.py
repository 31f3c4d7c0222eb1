"""docs/asyncapi.json is the bus as the code has it: regenerated, it is the same file; it is a
valid AsyncAPI 3.0 document; every stream and bucket has its channels; and who it says writes
and reads each channel is what the identities' permissions allow.

The AsyncAPI 3.0.0 JSON Schema in tests/data is the one the AsyncAPI Initiative publishes in its
`@asyncapi/specs` package (Apache-2.0), vendored so the check needs no network.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from einsora.common.bus import asyncapi, identities, names
from einsora.common.bus.identities import Permissions

ROOT = Path(__file__).resolve().parents[3]
DOCUMENT = ROOT / "docs" / "asyncapi.json"
SCHEMA = Path(__file__).parent / "data" / "asyncapi-3.0.0.schema.json"


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, `>` the rest."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def may_publish(permissions: Permissions, subject: str) -> bool:
    allowed = any(matches(p, subject) for p in permissions.publish)
    return allowed and not any(matches(p, subject) for p in permissions.publish_deny)


def may_subscribe(permissions: Permissions, subject: str) -> bool:
    return any(matches(p, subject) for p in permissions.subscribe)


def permissions_of(identity: str) -> Permissions:
    if identity == asyncapi.AGENT:
        return identities.agent_permissions("m-1")
    return identities.service_permissions(identity)


def test_the_checked_in_document_is_the_codes() -> None:
    assert DOCUMENT.read_text() == asyncapi.render(), (
        "docs/asyncapi.json is stale: python -m einsora.common.bus.asyncapi > docs/asyncapi.json"
    )


def test_it_is_a_valid_asyncapi_3_document() -> None:
    schema = json.loads(SCHEMA.read_text())
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(asyncapi.document()))
    assert errors == [], [f"{list(e.path)}: {e.message[:200]}" for e in errors]


def test_every_stream_and_bucket_has_its_channels() -> None:
    samples = [c.sample for c in asyncapi.CHANNELS]
    for stream in names.STREAMS:
        for pattern in stream.subjects:
            assert any(matches(pattern, s) for s in samples), pattern
    for bucket in names.BUCKETS:
        assert any(s.startswith(bucket.subject_prefix) for s in samples), bucket.name
    for channel in asyncapi.CHANNELS:
        kind, _, name = channel.kind.partition(" ")
        if kind == "stream":
            (declared,) = [s for s in names.STREAMS if s.name == name]
            assert any(matches(p, channel.sample) for p in declared.subjects), channel.id
        elif kind == "kv":
            (bucket,) = [b for b in names.BUCKETS if b.name == name]
            assert channel.sample.startswith(bucket.subject_prefix), channel.id


@pytest.mark.parametrize("channel", asyncapi.CHANNELS, ids=lambda c: c.id)
def test_who_writes_and_reads_is_what_the_permissions_allow(channel: asyncapi.Channel) -> None:
    everyone = (*identities.SERVICES, asyncapi.AGENT)
    for identity in everyone:
        allowed = may_publish(permissions_of(identity), channel.sample)
        if identity in channel.writers:
            assert allowed, f"{identity} must be allowed to write {channel.sample}"
        elif channel.kind != "request/reply" or identity not in channel.readers:
            assert not allowed, f"{identity} may write {channel.sample} but is no writer"
    for reader in channel.readers:
        permissions = permissions_of(reader)
        kind, _, name = channel.kind.partition(" ")
        if kind == "kv":
            bucket = next(b for b in names.BUCKETS if b.name == name)
            if reader == asyncapi.AGENT:
                read = f"$JS.API.DIRECT.GET.{bucket.stream}.{channel.sample}"
            else:
                read = f"$JS.API.CONSUMER.CREATE.{bucket.stream}"
            assert may_publish(permissions, read), f"{reader} cannot read {channel.sample}"
        elif kind == "stream":
            read = f"$JS.API.CONSUMER.CREATE.{name}"
            assert may_publish(permissions, read), f"{reader} cannot consume {name}"
        else:
            assert may_subscribe(permissions, channel.sample), f"{reader} cannot answer"


def test_the_operators_guide_shows_every_channel() -> None:
    guide = (ROOT / "docs" / "operators.md").read_text()
    for channel in asyncapi.CHANNELS:
        assert f"`{channel.address}`" in guide, channel.id
