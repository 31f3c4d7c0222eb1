"""A Lab cell hosts simulated machines (issue 35): the operator enrols a sim agent's machines,
and the agent, on the bus identity `einsora bus-config --sim-agent` made, takes workloads.

Real parts: `einsora bus-config` writes the accounts layout (the services static, the sim agent
a static machine identity in the machines' account, the auth callout), a real nats-server runs
it, the api and a scheduler run in this process on it (SQLite) in a cell that allows sim
machines, and `einsora machines enrol-sim` and `einsora agent --driver sim --sim-machines 50`
are real processes, the agent started as the enrolment's reply says. The compose file's `sim`
profile, with example.env's sim block, runs such an agent (its scripts run by `sh` as its
containers would, `docker-compose config` resolving them) only where sim machines are allowed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from einsora.agent import identity as agent_identity
from einsora.api.testing import (
    EINSORA,
    RunningApi,
    cli_env,
    einsora,
    enrolment_on_bus,
    eventually,
    new_tenant,
    running_api,
)
from einsora.common.bus import identities
from einsora.common.bus.accounts import APP_ACCOUNT
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.settings import Settings
from einsora.scheduler.service import SchedulerService

AGENT = "m-load"
MACHINES = 50
SIM = "1x l40s-48gb, 8 cpu, 32 GiB"
"""One GPU a machine: 50 one-GPU launches can only all run by taking every machine."""
RUNNING_WITHIN_S = 90.0
AGENT_STOP_S = 30.0


def _bus_config(credentials: Path, *sim: str) -> None:
    out = credentials / "auth.conf"
    done = subprocess.run(
        [EINSORA, "bus-config", "--credentials-dir", str(credentials), "--out", str(out), *sim],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def lab_bus(tmp_path: Path) -> Iterator[tuple[EmbeddedNats, Path]]:
    """A nats-server in the accounts layout that `einsora bus-config --sim-agent` wrote."""
    credentials = tmp_path / "bus"
    _bus_config(credentials, "--sim-agent", AGENT, "--sim-machines", str(MACHINES))
    server = EmbeddedNats(
        tmp_path / "nats",
        port=0,
        authorization=(credentials / "auth.conf").read_text(),
        app_account=APP_ACCOUNT,
    )
    server.start()
    yield server, credentials
    server.stop()


def test_the_sim_agents_machines_are_named_alike_everywhere() -> None:
    """bus-config grants, the api enrols and the agent hosts the same machines."""
    for count in (1, 2, 50, 9999, 10000):
        assert identities.sim_machine_ids(AGENT, count) == agent_identity.sim_machine_ids(
            AGENT, count
        )


async def _running_on(api: RunningApi, ids: list[str]) -> dict[str, str]:
    """Each of these workloads that runs, and its machine."""
    found: dict[str, str] = {}
    cursor: str | None = None
    while True:
        params = {"state": "running", "limit": "200", **({"cursor": cursor} if cursor else {})}
        page = await api.owner.get("/v1/workloads", params=params)
        assert page.status == 200, page.text
        found.update({w["id"]: w["placement"]["machine"] for w in page.body["items"]})
        cursor = page.body.get("next_cursor")
        if not cursor:
            return {w: found[w] for w in ids if w in found}


@pytest.mark.slow
async def test_the_operator_enrols_a_sim_agents_machines_and_they_take_workloads(
    lab_bus: tuple[EmbeddedNats, Path], sqlite_url: str, tmp_path: Path
) -> None:
    server, credentials = lab_bus
    settings = Settings(
        nats_url=server.url,
        nats_credentials_dir=credentials,
        database_url=sqlite_url,
        data_dir=tmp_path / "cell",
        region="lab",
        sim_machines=True,
        log_format="text",
    )
    body = {"agent": AGENT, "count": MACHINES, "region": "lab"}
    async with running_api(settings) as api:
        scheduler = SchedulerService(settings)
        await scheduler.start()
        agent: asyncio.subprocess.Process | None = None
        agent_log = tmp_path / "agent.log"
        try:
            # A tenant admin joins real machines, but sim ones are the operator's to enrol.
            _, admin = await new_tenant(api, "lab", "lab-admin")
            refused = await admin.post("/v1/machines/sim-agents", body)
            assert refused.status == 403, refused.text
            assert admin.token is not None
            code, out, err = await einsora(
                cli_env(api, tmp_path, admin.token),
                *("machines", "enrol-sim", "--agent", AGENT, "--count", str(MACHINES)),
            )
            assert (code, "only the operator" in out + err) == (1, True), out + err

            code, out, err = await einsora(
                cli_env(api, tmp_path),
                *("machines", "enrol-sim", "--agent", AGENT, "--count", str(MACHINES)),
                *("--region", "lab", "--json"),
            )
            assert code == 0, out + err
            made = json.loads(out)
            ids = agent_identity.sim_machine_ids(AGENT, MACHINES)
            assert made["machine_ids"] == ids
            assert made["enrolled"] == MACHINES
            assert made["region"] == "lab"
            assert made["bus_identity_found"] is True
            assert made["sim_machines_allowed"] is True
            assert api.service.nc is not None
            js = api.service.nc.jetstream()
            for machine_id in (ids[0], ids[-1]):
                on_bus = await enrolment_on_bus(js, machine_id)
                assert on_bus is not None
                assert (on_bus.region, on_bus.revoked) == ("lab", False)
            again = await api.owner.post("/v1/machines/sim-agents", body)
            assert (again.status, again.body["enrolled"]) == (201, 0), again.text

            # The agent, started as the reply says, with its bus identity from bus-config.
            argv = [EINSORA, *shlex.split(made["agent_command"])[1:]]
            argv += ["--sim-inventory", SIM, "--heartbeat", "1"]
            env = {
                **os.environ,
                **made["agent_env"],
                "EINSORA_DATA_DIR": str(tmp_path / "agent"),
                "EINSORA_LOG_FORMAT": "json",
            }
            with agent_log.open("wb") as log:
                agent = await asyncio.create_subprocess_exec(
                    *argv, env=env, stdout=log, stderr=asyncio.subprocess.STDOUT
                )

            launched = []
            for _ in range(MACHINES):
                answer = await api.owner.post(
                    "/v1/workloads", {"kind": "notebook", "class": "l40s-48gb"}
                )
                assert answer.status == 201, answer.text
                launched.append(answer.body["id"])
            placed: dict[str, str] = {}

            async def all_running() -> bool:
                assert agent is not None
                assert agent.returncode is None, agent_log.read_text()
                placed.update(await _running_on(api, launched))
                return len(placed) == MACHINES

            await eventually(
                all_running,
                RUNNING_WITHIN_S,
                what=f"{MACHINES} launches running on the sim agent's machines",
                every_s=0.2,
            )
            assert set(placed.values()) == set(ids)  # every machine took one
            # Within its identity's grants: the server refused it nothing.
            assert "permissions violation" not in agent_log.read_text().lower()
        finally:
            if agent is not None and agent.returncode is None:
                agent.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(agent.wait(), AGENT_STOP_S)
                except TimeoutError:
                    agent.kill()
                    await agent.wait()
            await scheduler.stop()


async def test_enrolling_a_sim_agent_says_what_is_wrong(
    lab_bus: tuple[EmbeddedNats, Path], sqlite_url: str, tmp_path: Path
) -> None:
    server, credentials = lab_bus
    settings = Settings(
        nats_url=server.url,
        nats_credentials_dir=credentials,
        database_url=sqlite_url,
        data_dir=tmp_path / "cell",
        log_format="text",
    )
    async with running_api(settings) as api:
        owner = api.owner
        # The control plane's own identities are no machine's.
        bad = await owner.post("/v1/machines/sim-agents", {"agent": "scheduler"})
        assert (bad.status, bad.body["details"][0]["field"]) == (422, "agent"), bad.text
        bad = await owner.post("/v1/machines/sim-agents", {"agent": "a.b"})
        assert bad.status == 422, bad.text
        bad = await owner.post("/v1/machines/sim-agents", {"agent": "x", "tenant": "nobody"})
        assert (bad.status, bad.body["details"][0]["field"]) == (422, "tenant"), bad.text
        # Another tenant's, by name: they own them; the operator's default region. No seed
        # for it, and a cell that allows no sim machines: the command says both.
        tenant_id, _ = await new_tenant(api, "studio", "studio-admin")
        code, out, err = await einsora(
            cli_env(api, tmp_path), "machines", "enrol-sim", "--agent", "m-studio",
            "--tenant", "studio",
        )  # fmt: skip
        assert code == 0, out + err
        said = (
            "1 sim machines of m-studio (m-studio) enrolled in region local (1 new), owned by "
            f"tenant {tenant_id}, private.",
            "einsora bus-config --sim-agent m-studio --sim-machines 1",
            "without EINSORA_SIM_MACHINES=true",
            f"EINSORA_NATS_CREDENTIALS_DIR={credentials}",
            "einsora agent --driver sim --machine-id m-studio --sim-machines 1 --region local",
        )
        assert all(part in out for part in said), out
        # Taken: another owner, another region, revoked.
        taken = await owner.post("/v1/machines/sim-agents", {"agent": "m-studio"})
        assert (taken.status, taken.body["error"]) == (409, "machine_taken"), taken.text
        taken = await owner.post(
            "/v1/machines/sim-agents", {"agent": "m-studio", "tenant": "studio", "region": "far"}
        )
        assert taken.status == 409, taken.text
        assert (await owner.delete("/v1/machines/m-studio")).status == 204
        taken = await owner.post(
            "/v1/machines/sim-agents", {"agent": "m-studio", "tenant": "studio"}
        )
        assert taken.status == 409, taken.text
        assert "revoked" in taken.body["message"]


COMPOSE = Path(__file__).resolve().parent.parent / "deploy" / "compose"
COMPOSE_TOOL = shutil.which("docker-compose")
SH = shutil.which("sh") or "/bin/sh"
VOLUME = "/run/einsora/bus"
"""Where the `bus` volume is mounted in the cell's containers."""


def _sim_block() -> dict[str, str]:
    """example.env's sim block, uncommented: what docs/lab.md says to set."""
    text = (COMPOSE / "example.env").read_text()
    block = text[text.index("# Sim machines") :].splitlines()
    pairs = (line.removeprefix("#").partition("=") for line in block if line.startswith("#E"))
    found = {key: value for key, _, value in pairs}
    assert "COMPOSE_PROFILES=sim" in text.replace("#COMPOSE", "COMPOSE")
    return found


def _compose_config(**env: str) -> dict[str, Any]:
    assert COMPOSE_TOOL is not None
    done = subprocess.run(
        [COMPOSE_TOOL, "-f", "docker-compose.yml", "config"],
        cwd=COMPOSE,
        capture_output=True,
        text=True,
        env={**os.environ, "POSTGRES_PASSWORD": "not-a-secret", **env},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


def _sh(
    service: dict[str, Any], bus: Path, path: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """A service's `sh -c` script as its container would run it (the bus volume at `bus`)."""
    words = [*service.get("entrypoint", []), *service.get("command", [])]
    assert words[:2] == ["sh", "-c"], words
    script = words[2].replace("$$", "$").replace(VOLUME, str(bus))
    return subprocess.run(
        [SH, "-c", script],
        capture_output=True,
        text=True,
        env={
            **{k: v.replace(VOLUME, str(bus)) for k, v in service["environment"].items()},
            "PATH": path,
            **env,
        },
        timeout=60,
        check=False,
    )


@pytest.mark.skipif(COMPOSE_TOOL is None, reason="docker-compose is not installed")
def test_the_compose_sim_profile_runs_a_sim_agent_only_where_sim_machines_are_allowed(
    tmp_path: Path,
) -> None:
    plain = _compose_config()
    assert plain["services"]["agent-sim"]["profiles"] == ["sim"]
    for name in ("api", "scheduler-a", "scheduler-b"):
        assert plain["services"][name]["environment"]["EINSORA_SIM_MACHINES"] == "false"

    sim = _sim_block()
    assert sim["EINSORA_SIM_MACHINES"] == "true"
    config = _compose_config(COMPOSE_PROFILES="sim", **{**sim, "EINSORA_SIM_AGENT_MACHINES": "3"})
    services = config["services"]
    for name in ("api", "scheduler-a", "scheduler-b", "agent-sim"):
        assert services[name]["environment"]["EINSORA_SIM_MACHINES"] == "true", name

    # bus-config, as its container runs it: the sim agent's identity, granted its 3 machines.
    bus = tmp_path / "bus"
    venv = str(Path(EINSORA).parent)
    made = _sh(services["bus-config"], bus, f"{venv}:/usr/bin:/bin")
    assert made.returncode == 0, made.stderr
    agent = identities.load_identity(bus, sim["EINSORA_SIM_AGENT"])
    conf = (bus / "auth.conf").read_text()
    assert agent.public_key in conf
    for machine_id in identities.sim_machine_ids(agent.name, 3):
        assert f"$KV.machines.{machine_id}.desired" in conf

    # The sim agent starts with that identity, hosting those machines; not where sim machines
    # are not allowed.
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "einsora").write_text(
        '#!/bin/sh\nprintf "%s\\n" "$EINSORA_NATS_CREDENTIALS_DIR" "$@"\n'
    )
    (fake / "einsora").chmod(0o755)
    ran = _sh(services["agent-sim"], bus, f"{fake}:/usr/bin:/bin")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        str(bus), "agent", "--driver", "sim", "--machine-id", agent.name, "--sim-machines", "3",
        "--sim-inventory", sim["EINSORA_SIM_INVENTORY"],
    ]  # fmt: skip
    refused = _sh(services["agent-sim"], bus, f"{fake}:/usr/bin:/bin", EINSORA_SIM_MACHINES="false")
    assert refused.returncode == 78
    assert "set EINSORA_SIM_MACHINES=true" in refused.stderr
