"""The bus: names (the only place they are spelled), connection, provisioning, publishing."""

from einsora.common.bus import identities, names
from einsora.common.bus.connect import CredentialRefused, connect, connect_as, tls_trusting
from einsora.common.bus.consumer import DurableConsumer
from einsora.common.bus.kv import bind_bucket, watch_key
from einsora.common.bus.mirror import KvMirror
from einsora.common.bus.provision import ProvisionReport, provision, stream_configs
from einsora.common.bus.publish import message_headers, new_traceparent, publish, request_id_of

__all__ = [
    "CredentialRefused",
    "DurableConsumer",
    "KvMirror",
    "ProvisionReport",
    "bind_bucket",
    "connect",
    "connect_as",
    "identities",
    "message_headers",
    "names",
    "new_traceparent",
    "provision",
    "publish",
    "request_id_of",
    "stream_configs",
    "tls_trusting",
    "watch_key",
]
