"""`/v1/tokens`: make, list and revoke the caller's API tokens."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
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
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.tokens import TokenCreate, TokenCreated, TokenPage
from einsora.api.services import tokens

router = APIRouter(tags=["tokens"], generate_unique_id_function=operation_id)


@router.post(
    "/v1/tokens",
    summary="Make an API token (its secret is shown only in this answer); it never outlives "
    "the credential that makes it, and a user holds at most `api_tokens_per_user` live ones",
    response_model=TokenCreated,
    status_code=201,
    responses=errors(*AUTH_ERRORS, *BODY_ERRORS, 409),
)
async def create_token(
    call: Me, body: Annotated[TokenCreate, Depends(JsonBody(TokenCreate))]
) -> Response:
    ctx = call.ctx
    made = await tokens.create(
        ctx.store,
        call.me,
        body,
        now=ctx.clock(),
        max_live=ctx.settings.api_tokens_per_user,
    )
    return reply(made, 201)


@router.get(
    "/v1/tokens",
    summary="List your API tokens (never their secrets)",
    response_model=TokenPage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS),
)
async def list_tokens(call: Me, query: Annotated[PageQuery, Query()]) -> Response:
    return reply(await tokens.list_tokens(call.ctx.store, call.me, query))


@router.delete(
    "/v1/tokens/{id}",
    summary="Revoke one of your API tokens, at once",
    status_code=204,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404),
)
async def revoke_token(call: Me, token_id: Annotated[str, Path(alias="id")]) -> Response:
    await tokens.revoke(call.ctx.store, call.me, token_id)
    await call.ctx.revoked([token_id])  # refused from the next request on, on every replica
    return no_content()
