"""`einsora machines lend` and `einsora machines invite --user`, as real subprocesses against a
real api: what the owner lends reaches the machine's enrolment, and an invited user accepts
their own invitation."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from einsora.api.testing import RunningApi, new_member, new_tenant, running_api
from einsora.common.settings import Settings
from einsora.common.testing import Bus, subprocess_env

EINSORA = str(Path(sys.executable).parent / "einsora")


@pytest_asyncio.fixture
async def api(bus: Bus, sqlite_url: str, data_dir: Path) -> AsyncIterator[RunningApi]:
    settings = Settings(nats_url=bus.url, database_url=sqlite_url, data_dir=data_dir)
    async with running_api(settings) as running:
        yield running


async def _einsora(api: RunningApi, token: str, tmp_path: Path, *args: str) -> tuple[int, str]:
    env = subprocess_env(
        EINSORA_API=api.url,
        EINSORA_TOKEN=token,
        EINSORA_DATA_DIR=str(tmp_path / "cli-data"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    proc = await asyncio.create_subprocess_exec(
        EINSORA, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_the_owner_lends_part_of_a_machine_and_invites_one_user(
    api: RunningApi, tmp_path: Path
) -> None:
    _, lab = await new_tenant(api, "lab", "lab-admin")
    studio_id, studio = await new_tenant(api, "studio", "studio-admin")
    ada = await new_member(api, studio_id, "ada", by=studio)
    made = await lab.post("/v1/machines/join-tokens", {"tunnel": False})
    joined = await api.client(None).post(
        "/v1/machines/join", {"token": made.body["token"], "hostname": "box"}
    )
    machine = str(joined.body["machine_id"])
    assert lab.token is not None
    assert ada.token is not None

    code, out = await _einsora(
        api, lab.token, tmp_path, "machines", "lend", machine, "--cpus", "4",
        "--memory-gib", "16", "--gpus", "none",
    )  # fmt: skip
    assert code == 0, out
    assert f"machine {machine} lends Einsora: 4 cores, 16 GiB, 0 GPUs" in out
    code, out = await _einsora(api, lab.token, tmp_path, "machines", "--json")
    (shown,) = json.loads(out)
    assert shown["enrolment"]["lend"] == {"cpus": 4, "memory_mib": 16384, "gpus": []}
    code, out = await _einsora(api, lab.token, tmp_path, "machines", "lend", machine)
    assert code == 1
    assert "say what to lend" in out
    code, out = await _einsora(api, lab.token, tmp_path, "machines", "lend", machine, "--all")
    assert (code, f"machine {machine} lends Einsora: all" in out) == (0, True)

    code, out = await _einsora(
        api, lab.token, tmp_path, "machines", "invite", machine, "--tenant", "studio",
        "--user", "ada",
    )  # fmt: skip
    assert code == 2  # one guest per invitation
    code, out = await _einsora(
        api, lab.token, tmp_path, "machines", "invite", machine, "--user", "ada"
    )
    assert code == 0, out
    assert "user ada accepts it with: einsora machines accept mi-" in out
    invitation = out.split("einsora machines accept ")[1].split()[0]
    code, out = await _einsora(api, ada.token, tmp_path, "machines", "invitations")
    assert invitation in out
    code, out = await _einsora(api, ada.token, tmp_path, "machines", "accept", invitation)
    assert code == 0, out
    assert f"user ada is now a guest of {machine}, owned by lab" in out
