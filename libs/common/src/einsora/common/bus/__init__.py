"""The bus: names (the only place they are spelled), connection, provisioning, publishing."""

from einsora.common.bus import identities, names
from einsora.common.bus.connect import (
    CredentialRefused,
    close_quietly,
    connect,
    connect_as,
    tls_trusting,
)
from einsora.common.bus.consumer import DurableConsumer
from einsora.common.bus.kv import (
    KeyState,
    ShortRead,
    bind_bucket,
    check_whole,
    key_count,
    read_bucket,
    read_records,
    watch_key,
)
from einsora.common.bus.mirror import KvMirror
from einsora.common.bus.provision import ProvisionReport, provision, stream_configs
from einsora.common.bus.publish import (
    message_headers,
    new_traceparent,
    publish,
    request_id_of,
    traceparent_of,
)
from einsora.common.bus.reconnects import Reconnects, reconnects

__all__ = [
    "CredentialRefused",
    "DurableConsumer",
    "KeyState",
    "KvMirror",
    "ProvisionReport",
    "Reconnects",
    "ShortRead",
    "bind_bucket",
    "check_whole",
    "close_quietly",
    "connect",
    "connect_as",
    "identities",
    "key_count",
    "message_headers",
    "names",
    "new_traceparent",
    "provision",
    "publish",
    "read_bucket",
    "read_records",
    "reconnects",
    "request_id_of",
    "stream_configs",
    "tls_trusting",
    "traceparent_of",
    "watch_key",
]
