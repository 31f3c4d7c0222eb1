"""Prometheus metrics of the gateway, in a registry of its own.

- `einsora_gateway_requests_total{api,status}`: requests answered, by API (`chat/completions`,
  `models`, ... or `other`) and HTTP status;
- `einsora_gateway_tokens_total{kind,source}`: tokens counted, prompt or completion, by whether
  the upstream's `usage` said so or they were estimated;
- `einsora_gateway_token_counts_capped_total{kind,source,reason}`: counts the gateway did not take
  as they came (`einsora.gateway.caps`): prompt or completion, who claimed it, and whether it was
  above what the request could use or no count at all;
- `einsora_gateway_usage_pending`: token counts not yet acknowledged by the USAGE stream.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import Counter, Gauge

from einsora.common import metrics
from einsora.common.schemas import CountSource
from einsora.common.schemas.endpoint import CapReason, TokenKind
from einsora.gateway.usage import UsageRecord

_APIS = frozenset({"models", "chat/completions", "completions", "embeddings"})


def api_of(request: web.Request) -> str:
    """The API a request asked for: one of a fixed few, so the series stay bounded."""
    name = request.path.removeprefix("/v1/")
    return name if name in _APIS else "other"


class GatewayMetrics:
    """The gateway's counters."""

    def __init__(self, pending: Callable[[], int]) -> None:
        self.registry = metrics.new_registry()
        self.requests = Counter(
            "einsora_gateway_requests",
            "Requests the gateway answered, by API and status",
            ["api", "status"],
            registry=self.registry,
        )
        self.tokens = Counter(
            "einsora_gateway_tokens",
            "Tokens counted, by kind (prompt, completion) and where the count came from",
            ["kind", "source"],
            registry=self.registry,
        )
        # Every series exists from the start, at zero: a rate over a fresh gateway is 0, not
        # absent, and a dashboard's query names a series the gateway really serves.
        self._tokens = {
            (kind, source): self.tokens.labels(kind, source.value)
            for kind in ("prompt", "completion")
            for source in CountSource
        }
        capped = Counter(
            "einsora_gateway_token_counts_capped",
            "Token counts capped to what the request could use, or counted by the gateway "
            "because the claim was no count, by kind, who claimed it and why",
            ["kind", "source", "reason"],
            registry=self.registry,
        )
        self._capped = {
            (kind, source, reason): capped.labels(kind.value, source.value, reason.value)
            for kind in TokenKind
            for source in CountSource
            for reason in CapReason
        }
        pending_gauge = Gauge(
            "einsora_gateway_usage_pending",
            "Token counts not yet acknowledged by the USAGE stream",
            registry=self.registry,
        )
        pending_gauge.set_function(lambda: float(pending()))

    def counted(self, record: UsageRecord) -> None:
        self._tokens["prompt", record.source].inc(record.prompt_tokens)
        self._tokens["completion", record.source].inc(record.completion_tokens)
        for cap in record.capped:
            self._capped[cap.kind, cap.source, cap.reason].inc()
