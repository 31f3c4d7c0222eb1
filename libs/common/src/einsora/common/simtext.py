"""The simulated model's tokenizer and text, shared by the sim endpoint and the gateway.

A sim endpoint answers with deterministic text and exact `usage`; the gateway counts a sim
route's prompts with the same rules, so its reservations are exact there, as they are with a
real model's own tokenizer. The rules are simple on purpose, so a test can work out a count by
hand: a token is a run of word characters or one other non-space character; each chat message
costs its content's tokens plus `MESSAGE_OVERHEAD` (role and separators), and a chat prompt
`REPLY_OVERHEAD` more (the assistant's turn).
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

MESSAGE_OVERHEAD = 4
REPLY_OVERHEAD = 2
EMBEDDING_DIMENSIONS = 8

_TOKEN = re.compile(r"\w+|[^\w\s]")

VOCABULARY = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]


def tokens(text: str) -> list[str]:
    """`text` as the sim model's tokens."""
    return _TOKEN.findall(text)


def count(text: str) -> int:
    """How many tokens `text` is."""
    return sum(1 for _ in _TOKEN.finditer(text))


def content_text(content: object) -> str:
    """A chat message's content as text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return " ".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return ""


def chat_prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """The prompt tokens of a chat completion request's `messages`."""
    return REPLY_OVERHEAD + sum(
        MESSAGE_OVERHEAD + count(content_text(m.get("content"))) for m in messages
    )


def completion_prompt_tokens(prompt: object) -> int:
    """The prompt tokens of a completion request's `prompt` (a string or a list of them)."""
    if isinstance(prompt, str):
        return count(prompt)
    if isinstance(prompt, Sequence):
        return sum(count(p) for p in prompt if isinstance(p, str))
    return 0


def _stream(seed: str) -> Iterator[int]:
    block = 0
    while True:
        digest = hashlib.sha256(f"{block}:{seed}".encode()).digest()
        yield from digest
        block += 1


def answer_words(seed: str, n: int) -> list[str]:
    """The `n` words the sim model answers to a prompt (`seed`): one token each."""
    stream = _stream(seed)
    return [VOCABULARY[next(stream) % len(VOCABULARY)] for _ in range(n)]


def answer(seed: str, n: int) -> str:
    """The sim model's answer of `n` tokens."""
    return " ".join(answer_words(seed, n))


def embedding(text: str) -> list[float]:
    """A deterministic unit-free vector for `text`."""
    digest = hashlib.sha256(text.encode()).digest()
    values = struct.unpack(f"<{EMBEDDING_DIMENSIONS}i", digest[: 4 * EMBEDDING_DIMENSIONS])
    return [v / 2**31 for v in values]


def fails(seed: str, rate: float) -> bool:
    """Whether the request with this prompt is one of the share `rate` that fail."""
    if rate <= 0:
        return False
    digest = hashlib.sha256(f"fail:{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < rate
