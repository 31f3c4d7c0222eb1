"""Token counts the gateway makes itself, each with its source.

Counts come from the upstream's `usage` where it gives one. The gateway counts for itself the
prompt of a request it must reserve tokens for, and the answer of a stream whose upstream sent
no usage (llama.cpp's server never does). It uses the served model's own tokenizer where it has
one: the sim model's rules (`einsora.common.simtext`, exact) for `sim` routes, the upstream's
`/extras/tokenize` for `llamacpp` routes (llama.cpp's server tokenizes with the GGUF's own
vocabulary). Only otherwise does it estimate (a token per 4 bytes of UTF-8), and says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiohttp

from einsora.common import simtext
from einsora.common.schemas import CountSource, Route
from einsora.common.tunnel_clients import TunnelClients

SIM = "sim"
LLAMACPP = "llamacpp"
TOKENIZE_PATH = "/extras/tokenize"
TOKENIZE_TIMEOUT_S = 2.0


class Api(StrEnum):
    """The OpenAI APIs the gateway serves, by the path after `/v1/`."""

    chat = "chat/completions"
    completions = "completions"
    embeddings = "embeddings"


@dataclass(frozen=True, slots=True)
class Count:
    """A number of tokens and where it came from."""

    tokens: int
    source: CountSource


def estimate(text: str) -> int:
    """About how many tokens `text` is, without a tokenizer: one per 4 bytes of UTF-8."""
    return math.ceil(len(text.encode()) / 4)


def _texts(value: object) -> list[str]:
    """The strings of a `prompt` or an `input`: a string or a list of them (token ids: none)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence):
        return [v for v in value if isinstance(v, str)]
    return []


def _messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, Mapping)]


def prompt_text(api: Api, body: Mapping[str, Any]) -> tuple[str, int]:
    """A request's prompt as one text, and how many chat messages it has (each costs
    `MESSAGE_OVERHEAD` more: its role and separators)."""
    if api is Api.chat:
        messages = _messages(body)
        return "\n".join(simtext.content_text(m.get("content")) for m in messages), len(messages)
    key = "prompt" if api is Api.completions else "input"
    return "\n".join(_texts(body.get(key))), 0


def answers_per_request(api: Api, body: Mapping[str, Any]) -> int:
    """How many answers a request asks for: `n` for each prompt (a completion request may send
    several prompts at once)."""
    n = body.get("n")
    per_prompt = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
    prompt = body.get("prompt") if api is Api.completions else None
    prompts = len(prompt) if isinstance(prompt, list) and prompt and not _is_ids(prompt) else 1
    return per_prompt * prompts


def _is_ids(prompt: list[Any]) -> bool:
    """Whether a list prompt is one prompt of token ids (rather than several prompts)."""
    return all(isinstance(p, int) for p in prompt)


def sim_prompt_tokens(api: Api, body: Mapping[str, Any]) -> int:
    """The exact prompt tokens of a request to a sim endpoint."""
    if api is Api.chat:
        return simtext.chat_prompt_tokens(_messages(body))
    key = "prompt" if api is Api.completions else "input"
    return simtext.completion_prompt_tokens(body.get(key))


class Counter:
    """Counts prompts and answers with each route's tokenizer, or estimates them."""

    def __init__(
        self,
        client: aiohttp.ClientSession,
        *,
        tunnels: TunnelClients | None = None,
        timeout_s: float = TOKENIZE_TIMEOUT_S,
    ):
        self._client = client
        self._tunnels = tunnels
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._added: dict[tuple[str, int, bool], int] = {}
        """Tokens each upstream's tokenizer adds to any text (llama.cpp's: a BOS token)."""

    async def prompt(self, route: Route, api: Api, body: Mapping[str, Any]) -> Count:
        if route.runtime == SIM:
            return Count(sim_prompt_tokens(api, body), CountSource.tokenizer)
        text, messages = prompt_text(api, body)
        overhead = messages * simtext.MESSAGE_OVERHEAD
        if route.runtime == LLAMACPP:
            counted = await self.tokenize(route, text)
            if counted is not None:
                return Count(counted + overhead, CountSource.tokenizer)
        return Count(estimate(text) + overhead, CountSource.estimate)

    async def completion(self, route: Route, text: str) -> Count:
        if route.runtime == SIM:
            return Count(simtext.count(text), CountSource.tokenizer)
        if route.runtime == LLAMACPP:
            counted = await self.tokenize(route, text)
            if counted is not None:
                return Count(counted, CountSource.tokenizer)
        return Count(estimate(text), CountSource.estimate)

    async def tokenize(self, route: Route, text: str) -> int | None:
        """How many tokens the upstream's own tokenizer makes of `text` (None: it did not say),
        less the ones it adds to any text (llama.cpp's server prepends BOS), which the text
        itself is not."""
        if not text:
            return 0
        # Tunnelled replicas all answer at 127.0.0.1, each on its own machine.
        where = (route.machine_id if route.via_tunnel else route.host, route.port, route.via_tunnel)
        added = self._added.get(where)
        if added is None:
            added = await self._tokens(route, "")
            if added is None:
                return None
            self._added[where] = added
        counted = await self._tokens(route, text)
        return None if counted is None else max(0, counted - added)

    async def _tokens(self, route: Route, text: str) -> int | None:
        headers = {"Authorization": f"Bearer {route.token}"} if route.token else None
        client = self._client
        if route.via_tunnel:
            if self._tunnels is None:
                return None  # never this host's own 127.0.0.1:<port>, with the workload's token
            client = await self._tunnels.session(route)
        url = f"http://{route.host}:{route.port}{TOKENIZE_PATH}"
        try:
            async with client.post(
                url, json={"input": text}, headers=headers, timeout=self._timeout
            ) as response:
                if response.status != 200:
                    return None
                data = await response.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return None
        tokens = data.get("tokens") if isinstance(data, dict) else None
        return len(tokens) if isinstance(tokens, list) else None
