"""Model endpoints and the inference gateway: an endpoint's spec, gateway keys, token usage.

An endpoint is a workload of kind `endpoint` whose spec names a model file and a runtime that
serves it through the OpenAI API. Its workload `name` is the model name clients send to the
gateway. The api publishes each gateway key (its hash, never the key) to the `gateway_keys`
bucket; the gateway serves from a mirror of it and reports every request's token counts on
`usage.tokens.<tenant>`.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from einsora.common.schemas.base import Message, utcnow
from einsora.common.vocab import EndpointRuntime

MAX_REPLICAS = 16


class SimEndpoint(Message):
    """How a simulated endpoint behaves (`spec.sim` on the `sim` driver).

    Its text is deterministic (a function of the prompt), its `usage` exact by
    `einsora.common.simtext`'s tokenizer.
    """

    start_delay_s: float = Field(default=0.0, ge=0)
    latency_ms: float = Field(default=0.0, ge=0)
    """Before the first token (or the whole answer, not streaming)."""
    tokens_per_s: float = Field(default=0.0, ge=0)
    """Pace of the tokens after the first; 0 is as fast as it can."""
    completion_tokens: int = Field(default=16, ge=1)
    """Tokens of an answer when the request's `max_tokens` allows that many."""
    fail_rate: float = Field(default=0.0, ge=0, le=1)
    """The share of requests answered 500 (deterministic by the request's prompt)."""
    stream_usage: bool = True
    """Whether a stream sends the usage chunk when asked (llama.cpp's server never does)."""


class EndpointSpec(Message):
    """`spec` of an endpoint workload.

    `model` is a local path or a URI of a `.gguf` or `.safetensors` file (a directory of
    safetensors for vLLM and MLX); the `command` runtime may leave it out and names its server
    in `command` instead, with `$PORT` where the port goes.
    """

    model: str | None = Field(default=None, min_length=1, max_length=4096)
    runtime: EndpointRuntime = EndpointRuntime.command
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    args: list[str] = Field(default_factory=list, max_length=64)
    context_length: int | None = Field(default=None, ge=16, le=1 << 22)
    command: list[str] | None = Field(default=None, min_length=1, max_length=64)
    readiness_path: str | None = None


class GatewayKey(Message):
    """`gateway_keys/<key id>`: what the gateway needs to accept one key; absent once revoked.

    `key_hash` is the SHA-256 (hex) of the whole `esk_…` key: the gateway hashes what a client
    presents and looks it up; the key itself is shown once, at creation, and stored nowhere.
    `models` None means every endpoint of the tenant; limits None mean none.
    """

    key_id: str
    tenant_id: str
    user_id: str
    name: str
    key_hash: str
    models: list[str] | None = None
    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    max_tokens_default: int = Field(default=1024, ge=1)
    expires_at: datetime | None = None


class CountSource(StrEnum):
    """Where a token count came from; a count is never presented as more exact than it is."""

    upstream = "upstream"
    """The upstream's own `usage`."""
    tokenizer = "tokenizer"
    """The served model's tokenizer, counted by the gateway."""
    estimate = "estimate"
    """Neither was available: an estimate from the text's length."""


MAX_TOKEN_COUNT = 2**31 - 1
"""The most tokens one request's prompt or completion count may be: far above any model's
context, and small enough that the store's 64-bit sums of them never overflow. A number outside
0 to this is no count (issue 34, N8)."""

MAX_CLAIM_LENGTH = 64
"""`CountCap.claimed` is cut to this many characters."""


class TokenKind(StrEnum):
    """The two counts of a request."""

    prompt = "prompt"
    completion = "completion"


class CapReason(StrEnum):
    """Why the gateway did not take a count as its source gave it."""

    above_request = "above_request"
    """More than the request could use: a completion above `max_tokens` for each answer asked
    for, a prompt above what the request's size allows. Capped at that."""
    not_a_count = "not_a_count"
    """Not a whole number from 0 to `MAX_TOKEN_COUNT` (negative, 2^70, 1.5, "12", true): the
    gateway counted that part itself, as when no usage comes."""


class CountCap(Message):
    """One count of a request the gateway capped: which, who claimed what, and why.

    An upstream is believed only about its own answer, within what the request could use; the
    count in the `TokenUsage` is the capped one, this is what was claimed.
    """

    kind: TokenKind
    source: CountSource
    """Who claimed it: the upstream's `usage`, or the upstream's tokenizer."""
    claimed: str = Field(max_length=MAX_CLAIM_LENGTH)
    """What it claimed, as JSON (`2000000`, `-3`, `"12"`), cut to `MAX_CLAIM_LENGTH`."""
    reason: CapReason


TokenCount = Annotated[int, Field(strict=True, ge=0, le=MAX_TOKEN_COUNT)]
"""A number of tokens: a whole number (JSON `5.0`, `"5"` and `true` are not) from 0 to
`MAX_TOKEN_COUNT`; a message with any other is poison."""


class TokenUsage(Message):
    """`usage.tokens.<tenant>`: one gateway request's tokens (`Nats-Msg-Id` = `request_id`)."""

    request_id: str
    tenant_id: str
    key_id: str
    endpoint: str
    """The replica (workload id) that answered."""
    model: str
    prompt_tokens: TokenCount
    completion_tokens: TokenCount
    source: CountSource
    status: int = Field(default=200, strict=True, ge=100, le=999)
    """The HTTP status of the answer (499: the client went away; 502: the stream was cut)."""
    at: datetime = Field(default_factory=utcnow)
    capped: list[CountCap] = Field(default_factory=list, max_length=len(TokenKind) * len(CapReason))
    """The counts the gateway capped, and what was claimed (none: each taken as it came)."""
