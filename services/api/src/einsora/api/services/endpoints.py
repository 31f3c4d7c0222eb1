"""Endpoint launches: the spec's check, and its model file's where the operator lets the api look.

An endpoint names its model file and the runtime that serves it (`EndpointSpec`). Weights that
could run code when loaded (pickle: `.bin`, `.pt`, `.pth`, `.pkl`, …) are refused here, by
name, before anything is stored. A path inside the directories the operator declared
(`EINSORA_MODEL_DIRS`: Solo's model store, a disk shared with the machines) is also checked by
content, so a renamed pickle or a missing file is a 422 at launch rather than a `failed` state a
minute later.

Any other path is the user's word: the agent of the machine that runs it checks it there, before
the runtime loads it. The api never looks at it, so a launch is answered the same whether
something is at that path on the api's host or not: the api (root, in Solo) is no oracle of its
host's files. Whether a path is inside a declared directory is decided by its name alone
(`..` resolved as text), before any file is touched.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import ValidationError

from einsora.api.errors import field_error
from einsora.common import weights
from einsora.common.schemas import EndpointRuntime, EndpointSpec

ModelDirs = Sequence[Path]
"""The directories the operator lets the api look into (`Settings.model_dir_paths`)."""


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


async def check_weights(endpoint: EndpointSpec, model_dirs: ModelDirs) -> None:
    """A 422 when the model is in one of the operator's `model_dirs` and is missing or not what
    its name says; nothing at all for a model anywhere else. The check reads headers only (tens
    of milliseconds for a large GGUF), off the event loop."""
    path = declared_path(endpoint.model, model_dirs)
    if path is None:
        return
    try:
        await asyncio.to_thread(weights.check_file, path)
    except weights.WeightsRefused as exc:
        raise field_error("spec.model", exc.message, kind="weights_refused") from exc


def declared_path(model: str | None, model_dirs: ModelDirs) -> Path | None:
    """`model` as a path inside one of `model_dirs` (normalised by name), or None when it is
    not a local path there (a URI, another host's file, a relative path, anywhere else)."""
    if model is None or not model_dirs:
        return None
    if weights.is_uri(model):
        parts = urlsplit(model)
        if parts.scheme.lower() != "file" or parts.netloc not in ("", "localhost"):
            return None
        model = unquote(parts.path)
    if not model.startswith("/"):
        return None
    path = Path(os.path.normpath(model))
    return path if any(path.is_relative_to(d) for d in model_dirs) else None
