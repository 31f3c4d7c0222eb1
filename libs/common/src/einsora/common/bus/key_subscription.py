"""An agent's watch of its own key: a plain subscription to the key's subject (issue 34, N17).

A machine creates no consumer: a consumer's config names where the server delivers, and no
subject permission can hold that to the machine's own inbox (nats-server checks a deliver
subject only for wildcards and cycles). Every put of the key is a message on its subject, which
a plain subscription receives, headers (a delete's `KV-Operation`) included; what it misses
while the connection is away, the direct get that follows every (re)connect, and the agent's
periodic resync, read again (ADR-0028). It must never be used where every revision matters.
"""

from __future__ import annotations

from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from einsora.common.bus.names import BucketName


async def subscribe_key(js: JetStreamContext, bucket: BucketName, key: str) -> Subscription:
    """Each later put or delete of `key`, as it is written; subscribed before this returns (the
    SUB precedes on the connection whatever the caller sends next, such as its direct get)."""
    # nats-py gives a JetStream context no public way back to its connection.
    return await js._nc.subscribe(bucket.key_subject(key))


__all__ = ["subscribe_key"]
