"""Endpoint launches: the spec's check, and its model file's where the api can read it.

An endpoint names its model file and the runtime that serves it (`EndpointSpec`). Weights that
could run code when loaded (pickle: `.bin`, `.pt`, `.pth`, `.pkl`, …) are refused here, by
name, before anything is stored; a path this api can read (Solo, or a shared disk) is also
checked by content, so a renamed pickle is refused with a 422 at launch rather than a `failed`
state a minute later. A path only the machine can read is checked there, by the agent, before
the runtime loads it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from einsora.api.errors import field_error
from einsora.common import weights
from einsora.common.schemas import EndpointRuntime, EndpointSpec


def check_spec(spec: dict[str, Any]) -> EndpointSpec:
    """The endpoint's spec, or a 422 naming the field that is wrong."""
    try:
        endpoint = EndpointSpec.model_validate(spec)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise field_error(f"spec.{where}" if where else "spec", first["msg"]) from exc
    if endpoint.runtime is EndpointRuntime.command:
        if endpoint.command is None and "runtime" not in spec and endpoint.model is None:
            # Nothing to serve named at all: only the sim driver can run it (as it did before
            # runtimes); a real machine fails it, saying that it needs spec.command.
            return endpoint
        if endpoint.command is None:
            raise field_error(
                "spec.command",
                'the command runtime needs spec.command, the server to run, with "$PORT" '
                'where its port goes (e.g. ["my-server", "--port", "$PORT"])',
            )
    elif endpoint.model is None:
        raise field_error(
            "spec.model",
            f"the {endpoint.runtime.value} runtime needs spec.model: a local path or a URI of "
            "a .gguf or .safetensors file",
        )
    if endpoint.model is not None:
        try:
            weights.check_name(endpoint.model)
        except weights.WeightsRefused as exc:
            raise field_error("spec.model", exc.message, kind="weights_refused") from exc
    return endpoint


async def check_weights(endpoint: EndpointSpec) -> None:
    """A 422 when the model file is on this api's disk and is not what its name says. The
    check reads headers only (tens of milliseconds for a large GGUF), off the event loop."""
    model = endpoint.model
    if model is None or (weights.is_uri(model) and not model.startswith("file://")):
        return
    path = Path(model.removeprefix("file://"))
    try:
        if await asyncio.to_thread(path.exists):
            await asyncio.to_thread(weights.check_file, path)
    except weights.WeightsRefused as exc:
        raise field_error("spec.model", exc.message, kind="weights_refused") from exc
