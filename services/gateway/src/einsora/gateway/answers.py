"""What the gateway reads in an answer: the upstream's `usage`, and the text it generated.

A whole answer is read once (it is small and already in memory). A stream is read event by
event through `StreamReader`, which keeps the last usage it saw, collects only the generated text
of the deltas (to count it when no usage comes), and says which events to pass on: the usage
chunk the gateway asked for on the client's behalf is not passed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from einsora.common.schemas.endpoint import MAX_TOKEN_COUNT
from einsora.gateway.counting import Api
from einsora.gateway.sse import event_data

_DONE = b"[DONE]"


@dataclass(frozen=True, slots=True)
class Usage:
    """An upstream's `usage`: its prompt and completion tokens as it claimed them, any JSON value
    (`count_of` reads each; the gateway believes none as it came, `einsora.gateway.caps`)."""

    prompt_tokens: object
    completion_tokens: object

    @property
    def readable(self) -> bool:
        """Whether both claims are counts (if not, the gateway counts what is not itself)."""
        return count_of(self.prompt_tokens) is not None and (
            count_of(self.completion_tokens) is not None
        )


def count_of(claim: object) -> int | None:
    """A claimed number of tokens, or None when it is no count: not a whole number (a bool, a
    float, a string) or outside 0 to `MAX_TOKEN_COUNT`."""
    if isinstance(claim, bool) or not isinstance(claim, int):
        return None
    return claim if 0 <= claim <= MAX_TOKEN_COUNT else None


def usage_of(value: object) -> Usage | None:
    """The claims of a `usage` object, or None when there is none (no object, or no
    `prompt_tokens` in it). A missing `completion_tokens` is 0 (embeddings have none)."""
    if not isinstance(value, Mapping):
        return None
    prompt = value.get("prompt_tokens")
    if prompt is None:
        return None
    completion = value.get("completion_tokens")
    return Usage(prompt, 0 if completion is None else completion)


def _choice_text(api: Api, choice: Mapping[str, Any], part: str, pieces: list[str]) -> None:
    """Append what one choice generated (`part`: "message" whole, "delta" streamed)."""
    if api is Api.completions:
        text = choice.get("text")
        if isinstance(text, str):
            pieces.append(text)
        return
    message = choice.get(part)
    if not isinstance(message, Mapping):
        return
    for field in ("content", "reasoning_content"):
        text = message.get(field)
        if isinstance(text, str):
            pieces.append(text)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping) and isinstance(function.get("arguments"), str):
                pieces.append(function["arguments"])


def answer_text(api: Api, answer: Mapping[str, Any]) -> str:
    """The text a whole (not streamed) answer generated, all choices together."""
    pieces: list[str] = []
    choices = answer.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, Mapping):
                _choice_text(api, choice, "message", pieces)
    return "".join(pieces)


class StreamReader:
    """Reads a stream's events as they pass: usage, generated text, which to pass on."""

    __slots__ = ("_api", "_drop_usage", "pieces", "usage")

    def __init__(self, api: Api, *, drop_usage: bool) -> None:
        self._api = api
        self._drop_usage = drop_usage
        self.usage: Usage | None = None
        self.pieces: list[str] = []

    def read(self, event: bytes) -> bool:
        """Take note of one event; True if it goes on to the client."""
        data = event_data(event)
        if data is None or data == _DONE:
            return True
        try:
            chunk = json.loads(data)
        except ValueError:
            return True
        if not isinstance(chunk, dict):
            return True
        choices = chunk.get("choices")
        usage = usage_of(chunk.get("usage"))
        if usage is not None:
            self.usage = usage
            if self._drop_usage and not choices:
                return False  # the usage chunk the gateway asked for; the client did not
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, Mapping):
                    _choice_text(self._api, choice, "delta", self.pieces)
        return True

    def text(self) -> str:
        return "".join(self.pieces)
