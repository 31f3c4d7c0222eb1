"""`/v1/gateway/keys`: make, list, show and revoke keys for the inference gateway."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.responses import Response

from einsora.api.deps import (
    AUTH_ERRORS,
    BODY_ERRORS,
    PARAM_ERRORS,
    JsonBody,
    Me,
    errors,
    no_content,
    operation_id,
    reply,
)
from einsora.api.projections.gateway_keys import GatewayKeysSync
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.gateway_keys import (
    GatewayKeyCreate,
    GatewayKeyCreated,
    GatewayKeyOut,
    GatewayKeyPage,
)
from einsora.api.services import gateway_keys

router = APIRouter(tags=["gateway keys"], generate_unique_id_function=operation_id)

KeyId = Annotated[str, Path(alias="id")]


def _bus(request: Request) -> GatewayKeysSync | None:
    """The service's key sync (`service.py` sets it); None for an app without a bus, whose keys
    reach KV with the first pass of a service that has one."""
    sync: GatewayKeysSync | None = request.app.state.ctx.gateway_keys
    return sync


@router.post(
    "/v1/gateway/keys",
    summary="Make a gateway key (its secret is shown only in this answer)",
    response_model=GatewayKeyCreated,
    status_code=201,
    responses=errors(*AUTH_ERRORS, *BODY_ERRORS),
)
async def create_gateway_key(
    call: Me,
    request: Request,
    body: Annotated[GatewayKeyCreate, Depends(JsonBody(GatewayKeyCreate))],
) -> Response:
    created, published = await gateway_keys.create(
        call.ctx.store, call.me, body, now=call.ctx.clock()
    )
    sync = _bus(request)
    if sync is not None:
        await sync.published(published)  # the gateway knows the key before the client does
    return reply(created, 201)


@router.get(
    "/v1/gateway/keys",
    summary="List gateway keys: your own, or every key of the tenant for its admin",
    response_model=GatewayKeyPage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS),
)
async def list_gateway_keys(call: Me, query: Annotated[PageQuery, Query()]) -> Response:
    return reply(await gateway_keys.list_keys(call.ctx.store, call.me, query))


@router.get(
    "/v1/gateway/keys/{id}",
    summary="Show one gateway key (never its secret)",
    response_model=GatewayKeyOut,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404),
)
async def get_gateway_key(call: Me, key_id: KeyId) -> Response:
    return reply(await gateway_keys.get(call.ctx.store, call.me, key_id))


@router.delete(
    "/v1/gateway/keys/{id}",
    summary="Revoke a gateway key, at once",
    status_code=204,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404),
)
async def revoke_gateway_key(call: Me, request: Request, key_id: KeyId) -> Response:
    await gateway_keys.revoke(call.ctx.store, call.me, key_id, now=call.ctx.clock())
    sync = _bus(request)
    if sync is not None:
        await sync.revoked(key_id)  # refused by the gateway before the 204 is sent
    return no_content()
