"""The gateway's HTTP application: OpenAI's API in front of every tenant's endpoints.

A request is authenticated by its key (in memory), read once, routed by `model` to a running
replica of the key's tenant, admitted against the key's limits (only when it has any), sent on
with failover, and counted, within what it could use (`einsora.gateway.caps`); its counts are
published off its path. `max_tokens` is set to the key's default when the client sends none, so
the reservation bounds the answer (and what an upstream may claim it used), and a stream
asks its upstream for usage even when the client did not (and then the usage chunk is removed).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry import trace

from einsora.common import logs, telemetry
from einsora.common.ids import new_id
from einsora.common.schemas import Route
from einsora.gateway import caps
from einsora.gateway.counting import Api, Count, Counter, answers_per_request
from einsora.gateway.errors import (
    RATE_LIMIT,
    SERVER,
    bad_request,
    error_response,
    invalid_key,
    model_not_found,
)
from einsora.gateway.fallbacks import ModelFallbacks
from einsora.gateway.forward import Forwarder, Outcome
from einsora.gateway.keys import Key, KeyTable
from einsora.gateway.limits import LimitBook, LimitsUnavailable, Refusal, Reservation
from einsora.gateway.routes import ModelTable
from einsora.gateway.usage import UsagePublisher, UsageRecord

log = logging.getLogger("einsora.gateway")

MAX_BODY = 4 * 1024 * 1024
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_JSON_SEPARATORS = (",", ":")
_LENGTH_FIELDS = {
    Api.chat: ("max_tokens", "max_completion_tokens"),
    Api.completions: ("max_tokens",),
    Api.embeddings: (),
}
"""The fields that bound an answer's length, by API."""
PATHS = ("/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings")
FALLBACK_HEADER = "X-Einsora-Fallback-Model"
"""On an answer from a model the asked one falls back to (ADR-0022): which model answered."""


@dataclass
class GatewayState:
    """What the handlers share."""

    keys: KeyTable
    models: ModelTable
    limits: LimitBook
    counter: Counter
    forwarder: Forwarder
    usage: UsagePublisher
    clock: Callable[[], float]
    fallbacks: ModelFallbacks = field(default_factory=ModelFallbacks)
    """Endpoints' model fallbacks (ADR-0022)."""


STATE = web.AppKey("state", GatewayState)


def request_id_of(request: web.Request) -> str:
    """The client's `X-Request-ID` when it is a sane token, else a new one; named on the
    request's server span while tracing is on."""
    incoming = request.headers.get("X-Request-ID")
    request_id = incoming if incoming and _REQUEST_ID.match(incoming) else new_id("request")
    if telemetry.ON:
        trace.get_current_span().set_attribute(telemetry.REQUEST_ID_ATTRIBUTE, request_id)
    return request_id


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    request_id = request_id_of(request)
    key = state.keys.authenticate(request.headers.get("Authorization"))
    if key is None:
        return invalid_key(request_id)
    tenant = key.value.tenant_id
    data = [
        {"id": model, "object": "model", "created": 0, "owned_by": tenant}
        for model in state.models.models(tenant)
        if key.may_use(model)
    ]
    return web.Response(
        body=json.dumps({"object": "list", "data": data}).encode(),
        content_type="application/json",
        headers={"X-Request-ID": request_id},
    )


def api_handler(api: Api) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _serve(request, api, request_id_of(request))

    return handler


async def _read_body(
    request: web.Request, request_id: str
) -> tuple[bytes, dict[str, Any]] | web.Response:
    """The body as sent and as parsed (once), or the error answer that says what is wrong."""
    too_large = error_response(
        413,
        f"The request body is larger than {MAX_BODY // (1024 * 1024)} MiB.",
        request_id,
        code="request_too_large",
    )
    length = request.content_length
    if length is not None and length > MAX_BODY:
        return too_large
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return too_large
    try:
        body = json.loads(raw)
    except ValueError:  # UnicodeDecodeError included
        return bad_request(
            "The request body is not valid JSON: send a JSON object with "
            "`Content-Type: application/json`.",
            request_id,
        )
    if not isinstance(body, dict):
        return bad_request("The request body must be a JSON object.", request_id)
    return raw, body


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


async def _serve(request: web.Request, api: Api, request_id: str) -> web.StreamResponse:
    state = request.app[STATE]
    key = state.keys.authenticate(request.headers.get("Authorization"))
    if key is None:
        return invalid_key(request_id)
    read = await _read_body(request, request_id)
    if isinstance(read, web.Response):
        return read
    raw, body = read
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return bad_request(
            "`model` is required: the name of one of your endpoints (GET /v1/models lists them).",
            request_id,
            param="model",
        )
    tenant = key.value.tenant_id
    if not key.may_use(model):
        return model_not_found(model, request_id)
    # The model's replicas, then its endpoint's model fallbacks' in order (ADR-0022), each
    # only if the key may use it: tried until one answers.
    candidates = [(model, state.models.replicas(tenant, model))] + [
        (other, state.models.replicas(tenant, other))
        for other in state.fallbacks.of(tenant, model)
        if key.may_use(other)
    ]
    candidates = [(m, r) for m, r in candidates if r]
    if not candidates:
        return model_not_found(model, request_id)
    replicas = candidates[0][1]
    # Bound once the tenant is known: nothing before this point logs.
    with logs.bind(request_id=request_id, tenant=tenant, subject=model):
        changed = False
        answer_tokens = 0
        if api is not Api.embeddings:
            bounds = _LENGTH_FIELDS[api]
            for field in bounds:
                value = body.get(field)
                if value is not None and not _positive_int(value):
                    return bad_request(
                        f"`{field}` must be a whole number of at least 1.", request_id, param=field
                    )
            given = [int(body[f]) for f in bounds if body.get(f) is not None]
            if given:
                max_tokens = max(given)  # whichever the upstream heeds, the answer fits
            else:
                # Bounds the answer, so the tokens reserved for it are all it can use.
                max_tokens = body["max_tokens"] = key.value.max_tokens_default
                changed = True
            n = body.get("n")
            if n is not None and not _positive_int(n):
                return bad_request(
                    "`n` must be a whole number of at least 1.", request_id, param="n"
                )
            answer_tokens = int(max_tokens) * answers_per_request(api, body)
        stream = api is not Api.embeddings and body.get("stream") is True
        drop_usage = False
        if stream:
            options = body.get("stream_options")
            if not isinstance(options, dict) or options.get("include_usage") is not True:
                body["stream_options"] = {
                    **(options if isinstance(options, dict) else {}),
                    "include_usage": True,
                }
                drop_usage = changed = True
        count_bounds = caps.bounds_of(api, body, len(raw), answer_tokens)
        prompt: Count | None = None
        reservation: Reservation | None = None
        if key.limited:
            if key.value.tpm is not None:
                prompt = await state.counter.prompt(replicas[0], api, body)
            # Counted by an upstream's tokenizer, perhaps: reserved within the bound too.
            reserved = min(prompt.tokens, count_bounds.prompt) if prompt is not None else 0
            admitted = await _admit(state, key, reserved, answer_tokens, request_id)
            if isinstance(admitted, web.Response):
                return admitted
            reservation = admitted
        at = state.clock()
        outcome: Outcome | None = None
        try:
            for served, served_replicas in candidates:
                payload = _payload(body, raw, changed, served, served_replicas)
                outcome = await state.forwarder.forward(
                    request,
                    request_id,
                    api,
                    served_replicas,
                    payload,
                    stream=stream,
                    drop_usage=drop_usage,
                    headers=None if served == model else {FALLBACK_HEADER: served},
                )
                if outcome.answered:
                    break
                if served != candidates[-1][0]:
                    log.info("no replica answered; trying the model's fallback")
        except BaseException:
            if reservation is not None:
                state.limits.settle(reservation, 0)
            raise
        assert outcome is not None  # there was a candidate
        await _account(
            state, key, model, api, body, request_id, at, outcome, prompt, count_bounds, reservation
        )
        return outcome.response


def _payload(
    body: dict[str, Any], raw: bytes, changed: bool, model: str, replicas: tuple[Route, ...]
) -> bytes:
    """The request as sent to `model`'s replicas: as the client sent it when nothing changed."""
    # mlx-lm's server loads whatever `model` names (a path or a Hub repo); its own model, the
    # one it was started with, is "default_model".
    name = "default_model" if replicas[0].runtime == "mlx" else model
    if name == body.get("model") and not changed:
        return raw
    return json.dumps({**body, "model": name}, separators=_JSON_SEPARATORS).encode()


async def _admit(
    state: GatewayState, key: Key, prompt_tokens: int, answer_tokens: int, request_id: str
) -> Reservation | web.Response:
    tokens = prompt_tokens + answer_tokens
    try:
        decision = await state.limits.reserve(
            key.value.key_id, key.value.rpm, key.value.tpm, tokens
        )
    except LimitsUnavailable:
        return error_response(
            503,
            "The gateway cannot check this key's rate limits right now (its bus is unavailable); "
            "try again shortly.",
            request_id,
            code="limits_unavailable",
            type_=SERVER,
        )
    if isinstance(decision, Refusal):
        return _refused(decision, tokens, request_id)
    return decision


def _refused(refusal: Refusal, tokens: int, request_id: str) -> web.Response:
    if refusal.too_large:
        return error_response(
            400,
            f"This request needs {tokens} tokens (its prompt plus max_tokens for each answer), "
            f"more than this key's limit of {refusal.allowed} tokens per minute: lower "
            "max_tokens or shorten the prompt.",
            request_id,
            code="request_too_large",
            param="max_tokens",
        )
    what = "requests" if refusal.limit == "requests" else "tokens (prompt plus max_tokens)"
    return error_response(
        429,
        f"Rate limit reached for this key: {refusal.allowed} {what} per minute. "
        f"Try again in {refusal.retry_after_s} s.",
        request_id,
        code="rate_limit_exceeded",
        type_=RATE_LIMIT,
        headers={"Retry-After": str(refusal.retry_after_s)},
    )


async def _account(
    state: GatewayState,
    key: Key,
    model: str,
    api: Api,
    body: dict[str, Any],
    request_id: str,
    at: float,
    outcome: Outcome,
    prompt: Count | None,
    bounds: caps.Bounds,
    reservation: Reservation | None,
) -> None:
    """Settle the reservation with the real count, sane, and queue the usage record."""
    route = outcome.route
    counted = caps.NOTHING
    if (
        outcome.answered
        and route is not None
        and (outcome.usage is not None or outcome.status in (200, 499, 502))
    ):
        # The upstream's usage where it claims a count; else what it was sent and generated.
        counted = await caps.count(
            state.counter, route, api, body, outcome.usage, outcome.text, prompt, bounds
        )
    if counted.capped and route is not None:
        log.warning(
            "token counts capped: %s",
            caps.described(counted),
            extra={"workload": route.workload_id, "machine": route.machine_id},
        )
    if reservation is not None:
        state.limits.settle(reservation, counted.tokens)
    if route is None:
        return
    state.usage.put(
        UsageRecord(
            request_id=request_id,
            tenant_id=key.value.tenant_id,
            key_id=key.value.key_id,
            endpoint=route.workload_id,
            model=model,
            prompt_tokens=counted.prompt.tokens,
            completion_tokens=counted.completion.tokens,
            source=counted.source,
            status=outcome.status,
            at=at,
            capped=counted.capped,
        )
    )


async def not_found(request: web.Request) -> web.Response:
    request_id = request_id_of(request)
    if request.path in PATHS:
        allowed = "GET" if request.path == "/v1/models" else "POST"
        return error_response(
            405,
            f"{request.method} is not allowed on {request.path}; use {allowed}.",
            request_id,
            code="method_not_allowed",
            headers={"Allow": allowed},
        )
    return error_response(
        404,
        "No such API here. The gateway serves " + ", ".join(PATHS) + ".",
        request_id,
        code="not_found",
    )


def create_app(state: GatewayState, middlewares: Sequence[Any] = ()) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY, middlewares=list(middlewares))
    app[STATE] = state
    app.router.add_get("/v1/models", list_models)
    for api in Api:
        app.router.add_post(f"/v1/{api.value}", api_handler(api))
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app
