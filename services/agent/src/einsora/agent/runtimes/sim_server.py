"""The sim endpoint: an OpenAI-compatible server that simulates a model, for the `sim` driver.

Its answers are deterministic (`einsora.common.simtext`: the same prompt gets the same text) and
its `usage` exact by the sim tokenizer, which the gateway counts with too. Latency before the
first byte, the pace of a stream's tokens, the share of requests that fail and whether a stream
sends its usage chunk are settable (`SimEndpoint`), so the gateway's limits, counts and failover
can be exercised on any machine. It speaks like the servers it stands in for: vLLM's refusal of
a model it does not serve, llama-cpp-python's `/extras/tokenize`.

`stop()` is abrupt on purpose: a killed replica drops its connections mid-stream, and failover
is tested against exactly that.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from einsora.common import simtext
from einsora.common.schemas.endpoint import SimEndpoint

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SHUTDOWN_TIMEOUT_S = 1.0
"""What aiohttp may still wait, at stop, for a connection that is already cut."""


class ApiError(Exception):
    """A request answered with OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code

    def response(self) -> web.Response:
        body = {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }
        return web.json_response(body, status=self.status)


@dataclass(frozen=True)
class _Choice:
    """One answer to make: its index, its prompt (the seed of its text) and its length."""

    index: int
    seed: str
    words: list[str]
    finish_reason: str


class SimEndpointServer:
    """An OpenAI-compatible server that simulates a model (aiohttp.web)."""

    def __init__(
        self,
        model: str,
        options: SimEndpoint | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.model = model
        self.options = options or SimEndpoint()
        self.host = host
        self.port = port
        self.requests = 0
        """Requests answered so far (any route)."""
        self._runner: web.AppRunner | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._created = int(time.time())

    async def start(self) -> int:
        """Bind and serve; the bound port."""
        # As large a body as the gateway lets through (4 MiB), and some.
        app = web.Application(middlewares=[self._count_and_catch], client_max_size=8 << 20)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/extras/tokenize", self._tokenize)
        app.router.add_post("/extras/tokenize/count", self._tokenize_count)
        app.router.add_get("/health", self._health)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        """Stop listening and cut every open connection now, a stream in progress too.
        Idempotent."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        for site in list(runner.sites):
            await site.stop()  # closes the listener: later connects are refused
        server = runner.server
        if server is not None:
            for connection in list(server.connections):
                if connection.transport is not None:
                    connection.transport.abort()  # not close(): nothing more is flushed
        # aiohttp would wait for a handler still sleeping (latency, pacing) to finish: cut it.
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await runner.cleanup()

    # --- plumbing ---------------------------------------------------------------------------

    @web.middleware
    async def _count_and_catch(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        self.requests += 1
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except web.HTTPNotFound:
            return ApiError(404, f"no route {request.path}", code="not_found").response()
        except web.HTTPMethodNotAllowed:
            return ApiError(405, f"{request.method} is not allowed on {request.path}").response()
        finally:
            if task is not None:
                self._handlers.discard(task)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model:
            raise ApiError(
                404,
                f"The model `{model}` does not exist; this server serves `{self.model}`.",
                param="model",
                code="model_not_found",
            )
        return body

    def _limit(self, body: Mapping[str, Any], *keys: str) -> tuple[int, bool]:
        """The answer's length in tokens, and whether `max_tokens` cut it."""
        wanted = self.options.completion_tokens
        for key in keys:
            value = body.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ApiError(400, f"{key} must be a whole number ≥ 1, not {value!r}", param=key)
            return (value, True) if value < wanted else (wanted, False)
        return wanted, False

    async def _before_answer(self, seed: str) -> None:
        if simtext.fails(seed, self.options.fail_rate):
            raise ApiError(
                500,
                "the sim endpoint failed this request on purpose (spec.sim.fail_rate)",
                kind="server_error",
                code="sim_failure",
            )
        if self.options.latency_ms:
            await asyncio.sleep(self.options.latency_ms / 1000)

    def _choices(self, seeds: Sequence[str], n: int, cut: bool) -> list[_Choice]:
        reason = "length" if cut else "stop"
        return [
            _Choice(i, seed, simtext.answer_words(seed, n), reason) for i, seed in enumerate(seeds)
        ]

    def _pace(self) -> float:
        tps = self.options.tokens_per_s
        return 1.0 / tps if tps > 0 else 0.0

    def _head(self, kind: str, prefix: str) -> dict[str, Any]:
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model,
        }

    @staticmethod
    def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    @staticmethod
    def _wants_usage(body: Mapping[str, Any]) -> bool:
        options = body.get("stream_options")
        return isinstance(options, Mapping) and options.get("include_usage") is True

    async def _after_first(self, choices: Sequence[_Choice]) -> None:
        """A whole answer takes as long as its tokens would have streamed."""
        pace = self._pace()
        tokens = sum(len(c.words) for c in choices)
        if pace and tokens > 1:
            await asyncio.sleep(pace * (tokens - 1))

    async def _stream(
        self,
        request: web.Request,
        body: Mapping[str, Any],
        choices: Sequence[_Choice],
        chunk: Callable[[int, str, bool], dict[str, Any]],
        final: Callable[[_Choice], dict[str, Any]],
        prompt_tokens: int,
    ) -> web.StreamResponse:
        """SSE: a chunk per token as it is made (each written at once), each choice's finish,
        then the usage chunk when asked for and this endpoint sends one, then `[DONE]`."""
        include_usage = self._wants_usage(body)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        pace = self._pace()
        loop = asyncio.get_running_loop()
        start = loop.time()
        sent = 0
        for choice in choices:
            for position, word in enumerate(choice.words):
                if sent and pace:  # on a timetable, so slow writes do not add up
                    delay = start + sent * pace - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                text = word if position == 0 else " " + word
                data = chunk(choice.index, text, position == 0)
                if include_usage:
                    data["usage"] = None
                await _send(response, data)
                sent += 1
            data = final(choice)
            if include_usage:
                data["usage"] = None
            await _send(response, data)
        if include_usage and self.options.stream_usage:
            usage = self._usage(prompt_tokens, sent)
            await _send(response, {**final(choices[-1]), "choices": [], "usage": usage})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    # --- routes -----------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": self.model, "object": "model", "created": self._created, "owned_by": "sim"}
        return web.json_response({"object": "list", "data": [model]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) for m in messages)
        ):
            raise ApiError(400, "messages must be a non-empty list of objects", param="messages")
        seed = "\n".join(simtext.content_text(m.get("content")) for m in messages)
        n, cut = self._limit(body, "max_completion_tokens", "max_tokens")
        prompt_tokens = simtext.chat_prompt_tokens(messages)
        await self._before_answer(seed)
        choices = self._choices([seed], n, cut)
        head = self._head("chat.completion.chunk", "chatcmpl")

        def chunk(index: int, text: str, first: bool) -> dict[str, Any]:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            return {
                **head,
                "choices": [
                    {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
                ],
            }

        def final(choice: _Choice) -> dict[str, Any]:
            return {
                **head,
                "choices": [
                    {
                        "index": choice.index,
                        "delta": {},
                        "logprobs": None,
                        "finish_reason": choice.finish_reason,
                    }
                ],
            }

        if body.get("stream") is True:
            return await self._stream(request, body, choices, chunk, final, prompt_tokens)
        await self._after_first(choices)
        return web.json_response(
            {
                **head,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": c.index,
                        "message": {"role": "assistant", "content": " ".join(c.words)},
                        "logprobs": None,
                        "finish_reason": c.finish_reason,
                    }
                    for c in choices
                ],
                "usage": self._usage(prompt_tokens, n * len(choices)),
            }
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            seeds = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            seeds = list(prompt)
        else:
            raise ApiError(
                400, "prompt must be a string or a non-empty list of strings", param="prompt"
            )
        n, cut = self._limit(body, "max_tokens")
        prompt_tokens = simtext.completion_prompt_tokens(prompt)
        await self._before_answer("\n".join(seeds))
        choices = self._choices(seeds, n, cut)
        head = self._head("text_completion", "cmpl")

        def chunk(index: int, text: str, first: bool) -> dict[str, Any]:
            return {
                **head,
                "choices": [
                    {"index": index, "text": text, "logprobs": None, "finish_reason": None}
                ],
            }

        def final(choice: _Choice) -> dict[str, Any]:
            return {
                **head,
                "choices": [
                    {
                        "index": choice.index,
                        "text": "",
                        "logprobs": None,
                        "finish_reason": choice.finish_reason,
                    }
                ],
            }

        if body.get("stream") is True:
            return await self._stream(request, body, choices, chunk, final, prompt_tokens)
        await self._after_first(choices)
        return web.json_response(
            {
                **head,
                "choices": [
                    {
                        "index": c.index,
                        "text": " ".join(c.words),
                        "logprobs": None,
                        "finish_reason": c.finish_reason,
                    }
                    for c in choices
                ],
                "usage": self._usage(prompt_tokens, n * len(choices)),
            }
        )

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        given = body.get("input")
        if isinstance(given, str):
            texts = [given]
        elif isinstance(given, list) and given and all(isinstance(t, str) for t in given):
            texts = list(given)
        else:
            raise ApiError(
                400, "input must be a string or a non-empty list of strings", param="input"
            )
        await self._before_answer("\n".join(texts))
        tokens = sum(simtext.count(t) for t in texts)
        return web.json_response(
            {
                "object": "list",
                "model": self.model,
                "data": [
                    {"object": "embedding", "index": i, "embedding": simtext.embedding(t)}
                    for i, t in enumerate(texts)
                ],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _tokenize_input(self, request: web.Request) -> list[str]:
        body = await self._body(request)
        text = body.get("input")
        if not isinstance(text, str):
            raise ApiError(400, "input must be a string", param="input")
        return simtext.tokens(text)

    async def _tokenize(self, request: web.Request) -> web.Response:
        # A token's id is stable (a checksum of its text), as a real vocabulary's would be.
        tokens = await self._tokenize_input(request)
        return web.json_response({"tokens": [zlib.crc32(t.encode()) for t in tokens]})

    async def _tokenize_count(self, request: web.Request) -> web.Response:
        return web.json_response({"count": len(await self._tokenize_input(request))})


async def _send(response: web.StreamResponse, data: Mapping[str, Any]) -> None:
    # `write` hands the bytes to the transport at once (it waits only when the socket is
    # backed up), so each token leaves as it is made.
    await response.write(b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n")
