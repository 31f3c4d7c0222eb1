"""No file oracle (issue 34): the api looks at a model path only inside the directories its
operator declared (`EINSORA_MODEL_DIRS`). Anywhere else a path is the user's word, checked by
the agent that runs it, and the api answers the same whether something is there or not."""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest_asyncio

from einsora.api.testing import Answer, RunningApi, running_api
from einsora.common.settings import Settings
from einsora.common.testing import Bus

SIM = {"kind": "endpoint", "class": "cpu-1c-2g"}


def launch(model: str, name: str) -> dict[str, Any]:
    return {**SIM, "name": name, "spec": {"runtime": "llamacpp", "model": model}}


def make_gguf(path: Path) -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def shape(answer: Answer) -> tuple[int, Any]:
    """What an answer says beyond what differs between any two launches (ids, names, times,
    the path given)."""
    body = answer.body
    if answer.status != 201:
        return answer.status, body
    kept = {
        k: v
        for k, v in body.items()
        if k not in ("id", "name", "created_at", "updated_at", "spec", "request_id")
    }
    return answer.status, {**kept, "spec": {**body["spec"], "model": None}}


@pytest_asyncio.fixture
async def declared(
    bus: Bus, sqlite_url: str, data_dir: Path, tmp_path: Path
) -> AsyncIterator[tuple[RunningApi, Path]]:
    """An api whose operator declared one model directory."""
    models = tmp_path / "models"
    models.mkdir()
    settings = Settings(
        nats_url=bus.url, database_url=sqlite_url, data_dir=data_dir, region="local"
    ).model_copy(update={"model_dirs": str(models)})
    async with running_api(settings) as running:
        yield running, models


async def test_a_path_outside_the_model_dirs_is_answered_alike_whether_it_exists_or_not(
    api: RunningApi, tmp_path: Path
) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.gguf").write_bytes(pickle.dumps({"not": "weights"}))
    make_gguf(host / "real.gguf")
    probes = [
        str(host / "secret.gguf"),  # a file there (a pickle, by its content)
        str(host / "real.gguf"),  # a good file there
        str(host / "absent.gguf"),  # nothing there
        str(host),  # a directory there (of no safetensors)
        str(host / "nowhere") + "/",  # no directory there
        f"file://{host / 'secret.gguf'}",
        f"file://{host / 'absent.gguf'}",
    ]
    answers = [
        await api.owner.post("/v1/workloads", launch(p, f"e{i}")) for i, p in enumerate(probes)
    ]
    shapes = {repr(shape(a)) for a in answers}
    assert len(shapes) == 1, [(p, a.status, a.body) for p, a in zip(probes, answers, strict=True)]
    assert answers[0].status == 201  # the user's word: its machine's agent checks it


async def test_inside_a_declared_model_dir_the_file_is_checked(
    declared: tuple[RunningApi, Path], tmp_path: Path
) -> None:
    api, models = declared
    good = make_gguf(models / "tiny.gguf")
    (models / "renamed.gguf").write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    assert (await api.owner.post("/v1/workloads", launch(str(good), "good"))).status == 201

    missing = await api.owner.post("/v1/workloads", launch(str(models / "absent.gguf"), "m"))
    assert missing.status == 422, missing.body
    assert missing.body["details"][0]["field"] == "spec.model"
    assert "does not exist" in missing.body["message"]
    assert missing.body["request_id"] == missing.request_id

    renamed = await api.owner.post("/v1/workloads", launch(f"file://{models}/renamed.gguf", "r"))
    assert renamed.status == 422
    assert renamed.body["details"][0]["type"] == "weights_refused"
    assert "pickle" in renamed.body["message"]

    # A way out of the directory by `..` is outside it: the user's word, not looked at.
    (tmp_path / "outside.gguf").write_bytes(pickle.dumps({"not": "weights"}))
    escaped = await api.owner.post("/v1/workloads", launch(f"{models}/../outside.gguf", "x"))
    assert escaped.status == 201, escaped.body
    names = {w["name"] for w in (await api.owner.get("/v1/workloads")).body["items"]}
    assert names == {"good", "x"}  # the refused launches changed nothing
