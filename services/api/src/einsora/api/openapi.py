"""The OpenAPI 3.1 document, generated from the declared operations and their pydantic models.

Nothing here is written by hand: the paths come from the route table, the schemas from the
same models that validate requests and shape responses, so the document and the behaviour
cannot disagree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaValue, models_json_schema

from einsora.api.middleware import MAX_BODY_BYTES
from einsora.api.operation import Operation
from einsora.api.schemas.common import ErrorBody, NoQuery

REF = "#/components/schemas/{model}"
_PATH_PARAM = re.compile(r"{(\w+)}")

_ERROR_TEXT = {
    400: "Malformed JSON",
    401: "Missing, unknown, revoked or expired API token",
    403: "Not allowed to do this",
    404: "No such object in this tenant",
    409: "The object's state or an existing object forbids this",
    413: f"Body over {MAX_BODY_BYTES // 1024} KiB",
    422: "A field breaks the schema; `details` names it",
    429: "Over a rate limit of this API token (`details` names it); retry after `Retry-After` s",
    503: "The store or the bus cannot answer now",
}

Mode = Literal["validation", "serialization"]
Refs = Mapping[tuple[Any, Mode], JsonSchemaValue]


def openapi_document(
    operations: Sequence[Operation], *, title: str = "Einsora API", version: str = "1"
) -> dict[str, Any]:
    documented = [op for op in operations if op.in_schema]
    wanted: dict[tuple[type[BaseModel], Mode], None] = {(ErrorBody, "serialization"): None}
    for op in documented:
        if op.body is not None:
            wanted[(op.body, "validation")] = None
        if op.query is not NoQuery:
            wanted[(op.query, "validation")] = None
        if op.response is not None:
            wanted[(op.response, "serialization")] = None
        for model in op.extra_responses.values():
            wanted[(model, "serialization")] = None
    refs, defs = models_json_schema(list(wanted), ref_template=REF)
    components: dict[str, Any] = defs.get("$defs", {})

    paths: dict[str, dict[str, Any]] = {}
    for op in documented:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, refs, components)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _json(schema: JsonSchemaValue) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _operation(
    op: Operation,
    refs: Refs,
    components: dict[str, Any],
) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PATH_PARAM.findall(op.path)
    ]
    if op.query is not NoQuery:
        schema = components[op.query.__name__]
        required = set(schema.get("required", []))
        for name, prop in schema.get("properties", {}).items():
            parameters.append(
                {
                    "name": name,
                    "in": "query",
                    "required": name in required,
                    "schema": _without_null(prop),
                }
            )
    for header in op.headers:
        parameters.append(
            {
                "name": header.name,
                "in": "header",
                "required": False,
                "description": header.description,
                "schema": {"type": "string", "pattern": header.pattern},
            }
        )
    responses: dict[str, Any] = {}
    if op.response is None:
        responses[str(op.status)] = {"description": "Done"}
    else:
        responses[str(op.status)] = {
            "description": "Done",
            "content": _json(refs[(op.response, "serialization")]),
        }
    for status, model in op.extra_responses.items():
        responses[str(status)] = {
            "description": _ERROR_TEXT.get(status, "Answer"),
            "content": _json(refs[(model, "serialization")]),
        }
    errors = set(op.errors)
    if op.auth:
        errors |= {401, 429, 503}
    if op.body is not None:
        errors |= {400, 413, 422}
    if op.query is not NoQuery or op.headers:
        errors.add(422)
    error_ref = refs[(ErrorBody, "serialization")]
    for status in sorted(errors - set(op.extra_responses)):
        responses[str(status)] = {"description": _ERROR_TEXT[status], "content": _json(error_ref)}
    document: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": [op.tag],
        "parameters": parameters,
        "responses": responses,
    }
    if op.body is not None:
        document["requestBody"] = {
            "required": True,
            "content": _json(refs[(op.body, "validation")]),
        }
    if op.auth:
        document["security"] = [{"bearer": []}]
    return document


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A query parameter is absent rather than null: drop the `null` branch of an optional."""
    branches = schema.get("anyOf")
    if not branches:
        return schema
    kept = [b for b in branches if b.get("type") != "null"]
    if len(kept) != 1:
        return schema
    rest = {k: v for k, v in schema.items() if k not in ("anyOf", "default")}
    return {**kept[0], **rest}
