"""`/v1/tokens`: make, list and revoke the caller's API tokens."""

from __future__ import annotations

from einsora.api.operation import Call, Operation
from einsora.api.schemas.common import NoBody, NoQuery, PageQuery
from einsora.api.schemas.tokens import TokenCreate, TokenCreated, TokenPage
from einsora.api.services import tokens


async def create_token(call: Call[TokenCreate, NoQuery]) -> TokenCreated:
    return await tokens.create(call.ctx.store, call.me, call.body)


async def list_tokens(call: Call[NoBody, PageQuery]) -> TokenPage:
    return await tokens.list_tokens(call.ctx.store, call.me, call.query)


async def revoke_token(call: Call[NoBody, NoQuery]) -> None:
    await tokens.revoke(call.ctx.store, call.me, call.path("id"))


OPERATIONS = [
    Operation(
        "POST",
        "/v1/tokens",
        create_token,
        "Make an API token (its secret is shown only in this answer)",
        "tokens",
        response=TokenCreated,
        status=201,
        body=TokenCreate,
    ),
    Operation(
        "GET",
        "/v1/tokens",
        list_tokens,
        "List your API tokens (never their secrets)",
        "tokens",
        response=TokenPage,
        query=PageQuery,
    ),
    Operation(
        "DELETE",
        "/v1/tokens/{id}",
        revoke_token,
        "Revoke one of your API tokens, at once",
        "tokens",
        status=204,
        errors=(404,),
    ),
]
