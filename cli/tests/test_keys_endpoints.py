"""`einsora keys` and `einsora endpoints`, run as real subprocesses against a real api.

A gateway key is printed once, with a line saying it will not be shown again, and never by
`keys list`; revoking it twice is refused with the api's message and request ID. An endpoint
launched from the command line is the workload of kind `endpoint` the api stores, with the spec
the flags describe, and the gateway's URL (its port from the settings) is printed with it.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import sqlalchemy as sa

from einsora.api.testing import RunningApi, cli_env, einsora

GATEWAY_PORT = "18082"
GATEWAY = f"http://127.0.0.1:{GATEWAY_PORT}/v1"


def _tiny_gguf(path: Path) -> Path:
    """A real, valid GGUF file (a few bytes of weights), as the api's check reads it."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny")
    writer.add_context_length(2048)
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


async def _endpoints(api: RunningApi) -> list[dict[str, Any]]:
    listed = await api.owner.get("/v1/workloads", kind="endpoint", limit="200")
    assert listed.status == 200, listed.text
    items: list[dict[str, Any]] = listed.body["items"]
    return items


async def test_a_key_is_printed_once_and_never_listed(api: RunningApi, tmp_path: Path) -> None:
    env = cli_env(api, tmp_path, EINSORA_GATEWAY_PORT=GATEWAY_PORT)
    code, out, err = await einsora(
        env,
        *("keys", "create", "ci", "--models", "llama,qwen", "--rpm", "5", "--tpm", "100"),
        *("--max-tokens-default", "64", "--expires-in-days", "7"),
    )
    assert code == 0, err
    [key] = [line for line in out.splitlines() if line.startswith("esk_")]
    assert "will not be shown again" in out
    assert GATEWAY in out
    assert api.service.store is not None
    async with api.service.store.read() as conn:
        row = (await conn.execute(sa.text("SELECT * FROM gateway_keys"))).mappings().one()
    assert row["key_sha256"] == hashlib.sha256(key.encode()).hexdigest()
    shown = (await api.owner.get(f"/v1/gateway/keys/{row['id']}")).body
    assert shown["models"] == ["llama", "qwen"]
    assert (shown["rpm"], shown["tpm"], shown["max_tokens_default"]) == (5, 100, 64)
    assert shown["expires_at"] is not None

    code, out, err = await einsora(env, "keys", "list")
    assert code == 0, err
    assert row["id"] in out
    assert "llama,qwen" in out
    assert key not in out
    code, out, err = await einsora(env, "keys", "ls", "--json")
    assert code == 0, err
    [listed] = json.loads(out)
    assert listed["id"] == row["id"]
    assert "key" not in listed
    assert key not in out

    code, out, err = await einsora(env, "keys", "revoke", row["id"])
    assert code == 0, err
    assert f"gateway key {row['id']} revoked" in out
    code, out, err = await einsora(env, "keys", "list")
    assert code == 0, err
    assert "(none)" in out
    code, out, err = await einsora(env, "keys", "revoke", row["id"])
    assert code == 1
    assert "not_found" in err
    assert "HTTP 404" in err
    assert "request ID: req-" in err


async def test_a_key_the_api_refuses_names_the_field(api: RunningApi, tmp_path: Path) -> None:
    code, out, err = await einsora(
        cli_env(api, tmp_path, EINSORA_GATEWAY_PORT=GATEWAY_PORT),
        "keys",
        "create",
        "ci",
        "--rpm",
        "0",
    )
    assert code == 1
    assert out == ""
    assert "rpm" in err
    assert "HTTP 422" in err


async def test_endpoints_are_launched_with_their_spec_and_listed(
    api: RunningApi, tmp_path: Path
) -> None:
    env = cli_env(api, tmp_path, EINSORA_GATEWAY_PORT=GATEWAY_PORT)
    model = _tiny_gguf(tmp_path / "tiny.gguf")
    code, out, err = await einsora(
        env,
        *("endpoints", "launch", "tiny", "--model", str(model), "--runtime", "llamacpp"),
        *("--context-length", "2048", "--replicas", "2", "--arg=--n-gpu-layers", "--arg", "0"),
    )
    assert code == 0, err
    assert GATEWAY in out
    assert "model tiny" in out
    code, out, err = await einsora(
        env,
        *("endpoints", "launch", "echo", "--json", "--runtime", "command"),
        *("--command", sys.executable, "-m", "http.server", "$PORT"),
    )
    assert code == 0, err
    launched = json.loads(out)
    assert launched["kind"] == "endpoint"

    stored = {w["name"]: w for w in await _endpoints(api) if not w.get("replica_of")}
    assert set(stored) == {"tiny", "echo"}
    assert stored["tiny"]["class"] == "cpu-2c-4g"
    assert stored["tiny"]["spec"] == {
        "model": str(model),
        "runtime": "llamacpp",
        "replicas": 2,
        "context_length": 2048,
        "args": ["--n-gpu-layers", "0"],
    }
    assert stored["echo"]["spec"] == {
        "runtime": "command",
        "command": [sys.executable, "-m", "http.server", "$PORT"],
    }
    assert stored["echo"]["id"] == launched["id"]

    code, out, err = await einsora(env, "endpoints", "list")
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert set(rows) == {"tiny", "echo"}  # one row per endpoint, whatever its replicas
    assert rows["tiny"][1:5] == [stored["tiny"]["id"], "pending", "llamacpp", "0/2"]
    assert rows["echo"][1:5] == [stored["echo"]["id"], "pending", "command", "0/1"]
    code, out, err = await einsora(env, "endpoints", "ls", "--json")
    assert code == 0, err
    assert {w["id"] for w in json.loads(out)} == {w["id"] for w in await _endpoints(api)}


async def test_a_launch_the_cli_or_the_api_refuses_says_why(
    api: RunningApi, tmp_path: Path
) -> None:
    env = cli_env(api, tmp_path, EINSORA_GATEWAY_PORT=GATEWAY_PORT)
    code, _, err = await einsora(
        env, "endpoints", "launch", "big", "--model", "/models/big", "--runtime", "vllm"
    )
    assert code == 2
    assert "--class is needed for the vllm runtime" in err
    disguised = tmp_path / "model.gguf"
    disguised.write_bytes(pickle.dumps({"weight": [0.0, 1.0]}, protocol=4))
    code, out, err = await einsora(
        env, "endpoints", "launch", "bad", "--model", str(disguised), "--runtime", "llamacpp"
    )
    assert code == 1
    assert out == ""
    assert "spec.model" in err
    assert "HTTP 422" in err
    assert await _endpoints(api) == []
