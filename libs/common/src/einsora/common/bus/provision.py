"""Provisioning of every stream and KV bucket, idempotent: run twice, nothing changes; a changed
setting is updated in place.

KV buckets are declared as explicit streams rather than through nats-py's `create_key_value`,
because the `machines` bucket must refuse rollup headers (one `Nats-Rollup: all` from an agent
would purge every machine's keys) and bound its value size (DESIGN.md, "The bus contract").
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from einsora.common.bus import names

log = logging.getLogger("einsora.bus")

_DAY = 24 * 3600.0
MAX_WATCHERS = 100_000
"""Consumers a KV bucket's stream allows: one per agent watching its key, and then some."""


@dataclass(frozen=True)
class ProvisionReport:
    """What a provisioning pass did, stream by stream."""

    created: tuple[str, ...]
    updated: tuple[str, ...]
    unchanged: tuple[str, ...]


ALL_BUT_ROUTES: tuple[str, ...] = (
    *(s.name for s in names.STREAMS),
    *(b.stream for b in names.BUCKETS if b is not names.ROUTES),
)
"""What the api provisions: every stream but the routes bucket, which its identity cannot reach."""


ATOMIC_BATCHES: tuple[names.StreamName, ...] = (names.INTENTS, names.EVENTS)
"""The streams whose publishers send runs of messages as atomic batches."""


def stream_configs(replicas: int = 1) -> list[StreamConfig]:
    """The declared configuration of every stream, KV streams included."""
    limits = {
        names.INTENTS.name: (7 * _DAY, 1 << 30),
        names.EVENTS.name: (30 * _DAY, 2 << 30),
        names.USAGE.name: (30 * _DAY, 2 << 30),
    }
    configs = [
        StreamConfig(
            name=s.name,
            description=s.description,
            subjects=list(s.subjects),
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=limits[s.name][0],
            max_bytes=limits[s.name][1],
            max_msg_size=1024 * 1024,
            duplicate_window=300.0,
            num_replicas=replicas,
            discard=DiscardPolicy.OLD,
            # The api's anti-entropy asks for each waiting workload's last intent by subject
            # (ADR-0011); a direct get is answered by any replica, without the stream leader.
            allow_direct=True if s is names.INTENTS else None,
            # A burst's intents and events go out in atomic batches, one commit (one fsync)
            # each (bus/batch.py).
            allow_atomic=True if s in ATOMIC_BATCHES else None,
        )
        for s in names.STREAMS
    ]
    configs.extend(
        StreamConfig(
            name=b.stream,
            description=b.description,
            subjects=[f"{b.subject_prefix}>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_msgs_per_subject=1,
            max_msg_size=b.max_value_size,
            max_age=b.max_age_s or None,
            discard=DiscardPolicy.NEW,
            allow_direct=True,
            allow_rollup_hdrs=b.allow_rollup,
            deny_delete=True,
            deny_purge=False,
            duplicate_window=120.0,
            # Every agent watches its own key through a consumer of its own; the server's
            # default cap (1,000 per stream, and -1 is not "unlimited") would stop the 1,001st
            # machine of a region from ever seeing its desired state.
            max_consumers=MAX_WATCHERS,
            num_replicas=replicas,
        )
        for b in names.BUCKETS
    )
    return configs


def _differs(wanted: StreamConfig, current: StreamConfig) -> list[str]:
    """Fields we declare whose live value is not what we declare."""
    wanted_d: dict[str, Any] = wanted.as_dict()
    current_d: dict[str, Any] = current.as_dict()
    return sorted(k for k, v in wanted_d.items() if current_d.get(k) != v)


async def provision(
    js: JetStreamContext, *, replicas: int = 1, only: Collection[str] | None = None
) -> ProvisionReport:
    """Create missing streams and buckets; update those whose declared settings changed.

    `only` names the streams to look after (a service whose bus identity may not touch the
    others, ADR-0009); every stream when None.
    """
    created: list[str] = []
    updated: list[str] = []
    unchanged: list[str] = []
    for config in stream_configs(replicas):
        assert config.name is not None
        if only is not None and config.name not in only:
            continue
        try:
            info = await js.stream_info(config.name)
        except NotFoundError:
            await js.add_stream(config)
            created.append(config.name)
            log.info("stream created", extra={"stream": config.name})
            continue
        changed = _differs(config, info.config)
        if changed:
            await js.update_stream(config)
            updated.append(config.name)
            log.info("stream updated", extra={"stream": config.name, "fields": changed})
        else:
            unchanged.append(config.name)
    return ProvisionReport(tuple(created), tuple(updated), tuple(unchanged))
