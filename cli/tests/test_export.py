"""`einsora export`, run as a real subprocess against a real api: it writes the server's
`einsora.workload-export/v1` document (secrets already redacted there) to a file or stdout,
says how many redactions it holds, and a workload the caller cannot see is an error.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from einsora.api.testing import RunningApi, new_tenant, running_api
from einsora.common.settings import Settings
from einsora.common.testing import Bus, subprocess_env

EINSORA = str(Path(sys.executable).parent / "einsora")
HF_TOKEN = "hf_" + "Q7" * 17


@pytest_asyncio.fixture
async def api(bus: Bus, sqlite_url: str, data_dir: Path) -> AsyncIterator[RunningApi]:
    settings = Settings(nats_url=bus.url, database_url=sqlite_url, data_dir=data_dir)
    async with running_api(settings) as running:
        yield running


async def _einsora(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        EINSORA, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_export_writes_the_servers_document(api: RunningApi, tmp_path: Path) -> None:
    _, ann = await new_tenant(api, "physics", "ann")
    spec = {"env": {"HF_TOKEN": HF_TOKEN, "MODE": "fast"}, "model": "s3://u:pw9Secret@b/x"}
    made = await ann.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g", "spec": spec})
    assert made.status == 201, made.text
    workload_id = made.body["id"]
    assert ann.token is not None
    env = subprocess_env(
        EINSORA_API=api.url,
        EINSORA_TOKEN=ann.token,
        EINSORA_DATA_DIR=str(tmp_path / "cli-data"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    env.pop("EINSORA_NATS_URL", None)

    target = tmp_path / "export.json"
    code, out, err = await _einsora(env, "export", workload_id, "-o", str(target))
    assert code == 0, err
    assert out == ""
    assert err.strip() == f"wrote {target} (2 redactions)"
    document = json.loads(target.read_text())
    assert document["schema"] == "einsora.workload-export/v1"
    assert document["workload"]["spec"]["env"] == {"HF_TOKEN": "REDACTED", "MODE": "fast"}
    assert {r["path"] for r in document["redactions"]} == {
        "$.workload.spec.env.HF_TOKEN",
        "$.workload.spec.model",
    }
    assert HF_TOKEN not in target.read_text()

    code, out, err = await _einsora(env, "export", workload_id)
    assert code == 0, err
    printed = json.loads(out)
    assert printed["workload"] == document["workload"]
    assert printed["redactions"] == document["redactions"]

    code, out, err = await _einsora(env, "export", "w-01nonexistent0000000000", "-o", str(target))
    assert code != 0
    assert "no workload 'w-01nonexistent0000000000'" in err
    assert json.loads(target.read_text()) == document  # a refusal leaves the file as it was
