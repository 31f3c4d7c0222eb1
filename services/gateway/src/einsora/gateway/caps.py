"""Counts are sane: no request is counted more tokens than it could have used.

A machine that hosts another tenant's endpoint says whatever it likes in its `usage` (and in
llama.cpp's `/extras/tokenize`). The gateway believes an upstream only about its own answer, and
only within what the request allowed (issue 34, N8):

- a completion count is capped at what was reserved for the answer: `max_tokens` for each
  answer asked for (the gateway always sends a `max_tokens`, so an honest upstream never
  exceeds it; embeddings have no completion);
- a prompt count is capped at what the request's own size allows: a tokenizer makes at most one
  token of each byte, `PROMPT_ALLOWANCE` more covers the text a chat template adds, and
  `MEDIA_PART_TOKENS` each image, audio or video part. The gateway's own estimate of the prompt
  (reserved at admission) is not a bound: Chinese text is more tokens than one per four bytes;
- a claim that is no count at all (negative, 2^70, 1.5, "12", true) is not believed: the
  gateway counts that part itself, as when no usage came.

Every cap is noted on the request's usage message (`TokenUsage.capped`: which count, who
claimed what, why), logged once, and counted in `einsora_gateway_token_counts_capped_total`.
Counts are never raised: a claim below the bound is taken as it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from einsora.common.schemas import CountSource, Route
from einsora.common.schemas.endpoint import (
    MAX_CLAIM_LENGTH,
    MAX_TOKEN_COUNT,
    CapReason,
    CountCap,
    TokenKind,
)
from einsora.gateway.answers import Usage, count_of
from einsora.gateway.counting import Api, Count, Counter

PROMPT_ALLOWANCE = 1024
"""Prompt tokens a request may be counted beyond one per byte of its body: the text a chat
template adds around the messages (a default system prompt, tool-use instructions)."""
MEDIA_PART_TOKENS = 32_768
"""Prompt tokens one image, audio or video part of a chat message may cost: a URL is a few
bytes, its image up to 16,384 tokens (Qwen2-VL's largest)."""

_EXACTNESS = (CountSource.upstream, CountSource.tokenizer, CountSource.estimate)
"""Count sources from the most exact; a request's source is the least exact of its counts."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """The most tokens a request's prompt, and its answers, may be counted."""

    prompt: int
    completion: int

    def of(self, kind: TokenKind) -> int:
        return self.prompt if kind is TokenKind.prompt else self.completion


def bounds_of(api: Api, body: Mapping[str, Any], size: int, answer_tokens: int) -> Bounds:
    """A request's bounds: `size` is its body's length in bytes, `answer_tokens` what was
    reserved for its answers (`max_tokens` for each)."""
    media = _media_parts(body) if api is Api.chat else 0
    prompt = size + PROMPT_ALLOWANCE + media * MEDIA_PART_TOKENS
    return Bounds(min(prompt, MAX_TOKEN_COUNT), min(answer_tokens, MAX_TOKEN_COUNT))


def _media_parts(body: Mapping[str, Any]) -> int:
    """The parts of a chat request's messages that are not text (images, audio, video)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    return sum(
        1
        for message in messages
        if isinstance(message, Mapping) and isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, Mapping) and part.get("type") != "text"
    )


def claimed_text(claim: object) -> str:
    """A claim as the JSON it came as, short enough for a note (`CountCap.claimed`)."""
    if isinstance(claim, int) and not isinstance(claim, bool):
        digits = str(claim)
        if len(digits) <= MAX_CLAIM_LENGTH:
            return digits
        return f"a number of {len(digits)} digits"
    if isinstance(claim, str):
        claim = claim[:MAX_CLAIM_LENGTH]
    elif isinstance(claim, Mapping):
        return "an object"
    elif isinstance(claim, list):
        return "a list"
    return json.dumps(claim)[:MAX_CLAIM_LENGTH]


@dataclass(frozen=True, slots=True)
class Counted:
    """A request's counts, sane, and the caps that made them so."""

    prompt: Count
    completion: Count
    capped: tuple[CountCap, ...] = ()

    @property
    def source(self) -> CountSource:
        """Where the counts came from: the less exact of the two."""
        return max(self.prompt.source, self.completion.source, key=_EXACTNESS.index)

    @property
    def tokens(self) -> int:
        return self.prompt.tokens + self.completion.tokens


NOTHING = Counted(Count(0, CountSource.upstream), Count(0, CountSource.upstream))
"""The counts of a request no replica answered."""


async def count(
    counter: Counter,
    route: Route,
    api: Api,
    body: Mapping[str, Any],
    usage: Usage | None,
    text: str,
    prompt: Count | None,
    bounds: Bounds,
) -> Counted:
    """A request's counts: the upstream's `usage` where it claims a count, else the gateway's
    own (`prompt` when it counted it already, and the answer's `text`), each capped at its
    bound."""
    caps: list[CountCap] = []
    counts: dict[TokenKind, Count] = {}
    if usage is not None:
        for kind, claim in (
            (TokenKind.prompt, usage.prompt_tokens),
            (TokenKind.completion, usage.completion_tokens),
        ):
            tokens = count_of(claim)
            if tokens is not None:
                counts[kind] = Count(tokens, CountSource.upstream)
            else:
                caps.append(
                    _cap(kind, CountSource.upstream, claimed_text(claim), CapReason.not_a_count)
                )
    if TokenKind.prompt not in counts:
        counts[TokenKind.prompt] = (
            prompt if prompt is not None else await counter.prompt(route, api, body)
        )
    if TokenKind.completion not in counts:
        counts[TokenKind.completion] = await counter.completion(route, text)
    for kind, counted in list(counts.items()):
        bound = bounds.of(kind)
        if counted.tokens > bound:
            caps.append(_cap(kind, counted.source, str(counted.tokens), CapReason.above_request))
            counts[kind] = Count(bound, counted.source)
    return Counted(counts[TokenKind.prompt], counts[TokenKind.completion], tuple(caps))


def _cap(kind: TokenKind, source: CountSource, claimed: str, reason: CapReason) -> CountCap:
    return CountCap(kind=kind, source=source, claimed=claimed, reason=reason)


def described(counted: Counted) -> str:
    """The caps of a request in words, for its one log line."""
    return "; ".join(
        f"{cap.source.value} claimed {cap.claimed} {cap.kind.value} tokens ({cap.reason.value}), "
        f"counted {(counted.prompt if cap.kind is TokenKind.prompt else counted.completion).tokens}"
        for cap in counted.capped
    )
