"""Sim agents' machines, enrolled by the operator, so a Lab cell can be load-tested (issue 35).

A sim agent is one `einsora agent --driver sim --machine-id AGENT --sim-machines N` process
hosting N machines that run nothing, on the static bus identity `einsora bus-config --sim-agent
AGENT --sim-machines N` made: a machine's session, granted those machines' keys only (ADR-0028).
The scheduler counts only enrolled machines (ADR-0016), and a sim agent has no join token, so
the operator enrols its machines here, as the operator's tenant's or a named tenant's, reached
directly like the control plane's own (nothing listens there: a sim endpoint answers only on
the agent's own host). Only the operator: what a sim machine reports is taken as it comes, and
the schedulers place on one only in a cell that allows them (`EINSORA_SIM_MACHINES`, ADR-0026).

Enrolling again is harmless: a machine already enrolled the same way (same owner and region,
not revoked, not joined) is kept as it is. An id taken otherwise (another owner or region, a
revoked machine, or one that joined with its own credential) is a 409, and nothing is enrolled.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import Conflict, Forbidden, field_error
from einsora.api.schemas.sim_agents import SimAgentEnrol
from einsora.api.services.machines import enrolments
from einsora.api.store import Store, activity_target
from einsora.common.bus import identities
from einsora.common.bus.names import is_subject_token
from einsora.common.ids import is_id
from einsora.common.schemas import Enrolment, utcnow
from einsora.common.settings import Settings

MACHINE_ID_LENGTH = 100
"""The longest machine id an agent takes (`einsora agent --machine-id`)."""

_m = m.machines.c


@dataclass(frozen=True)
class SimAgentMachines:
    """A sim agent's machines, enrolled: their records (for the bus), and how many are new."""

    enrolments: list[Enrolment]
    enrolled: int
    owner_tenant_id: str
    region: str


def may_enrol_sim(principal: Principal) -> None:
    """Only the operator enrols sim machines: a tenant admin joins real machines."""
    if not principal.is_operator:
        raise Forbidden("only the operator enrols a sim agent's machines")


def machine_ids(body: SimAgentEnrol) -> list[str]:
    """The machines the agent hosts, each a machine id the agent takes (422 naming `agent`)."""
    if body.agent in identities.CONTROL_PLANE:
        raise field_error("agent", f"{body.agent!r} is one of the control plane's own identities")
    ids = identities.sim_machine_ids(body.agent, body.count)
    if not all(is_subject_token(i, MACHINE_ID_LENGTH) for i in ids):
        raise field_error(
            "agent", f"too long for {body.count} machines: their ids would pass 100 characters"
        )
    return ids


async def _tenant_id(conn: AsyncConnection, name_or_id: str) -> str:
    """The id of the tenant with this name or id, or a 422 naming `tenant`."""
    column = m.tenants.c.id if is_id(name_or_id, "tenant") else m.tenants.c.name
    found = await conn.scalar(sa.select(m.tenants.c.id).where(column == name_or_id))
    if found is None:
        raise field_error("tenant", f"no tenant {name_or_id!r}")
    return str(found)


def _taken(row: Any, tenant_id: str, region: str) -> str | None:
    """Why an enrolled machine cannot be this sim agent's (None: it already is)."""
    if row.join_token_id is not None or row.credential_sha256 is not None:
        return "joined with its own credential"
    if row.revoked_at is not None:
        return "was revoked"
    if row.owner_tenant_id != tenant_id:
        return "belongs to another tenant"
    if row.region != region:
        return f"is enrolled in region {row.region}"
    return None


async def enrol_sim_agent(
    store: Store,
    principal: Principal,
    body: SimAgentEnrol,
    *,
    default_region: str,
    now: datetime | None = None,
) -> SimAgentMachines:
    """Enrol the sim agent's machines in one unit of work (those already enrolled so are kept)."""
    may_enrol_sim(principal)
    ids = machine_ids(body)
    region = body.region or default_region
    if not is_subject_token(region, 64):
        raise field_error("region", f"not a region name: {region!r} (letters, digits, - and _)")
    activity_target(body.agent)
    now = now or utcnow()
    async with store.write() as conn:
        owner = principal.tenant_id if body.tenant is None else await _tenant_id(conn, body.tenant)
        # The operator's own machines are theirs; a named tenant's, no one's.
        owner_user = principal.user_id if owner == principal.tenant_id else None
        rows = (await conn.execute(sa.select(m.machines).where(_m.id.in_(ids)))).all()
        for row in rows:
            why = _taken(row, owner, region)
            if why is not None:
                raise Conflict(
                    f"machine {row.id} {why}: give the sim agent another id (--agent)",
                    code="machine_taken",
                )
        have = {row.id for row in rows}
        fresh = [i for i in ids if i not in have]
        if fresh:
            await conn.execute(
                sa.insert(m.machines),
                [
                    {
                        "id": i,
                        "owner_tenant_id": owner,
                        "owner_user_id": owner_user,
                        "region": region,
                        "sharing": body.sharing.value,
                        "hostname": body.agent,
                        "credential_sha256": None,
                        "tunnel": False,
                        "tunnel_key": None,
                        "join_token_id": None,
                        "enrolled_at": now,
                    }
                    for i in fresh
                ],
            )
    wanted = set(ids)
    found = [e for e in (await enrolments(store)).values() if e.machine_id in wanted]
    found.sort(key=lambda e: e.machine_id)
    return SimAgentMachines(found, len(fresh), owner, region)


def agent_command(agent: str, count: int, region: str) -> str:
    """What starts the sim agent hosting these machines (its bus identity from the env)."""
    words = ["einsora", "agent", "--driver", "sim", "--machine-id", agent]
    words += ["--sim-machines", str(count), "--region", region]
    return shlex.join(words)


def agent_env(settings: Settings) -> dict[str, str]:
    """The environment the sim agent needs: where NATS is, and the dir of its seed."""
    env = {"EINSORA_NATS_URL": settings.agent_nats_url or settings.effective_nats_url}
    if settings.nats_credentials_dir is not None:
        env["EINSORA_NATS_CREDENTIALS_DIR"] = str(settings.nats_credentials_dir)
    if settings.nats_tls_cert is not None:
        env["EINSORA_NATS_TLS_CERT"] = str(settings.nats_tls_cert)
    return env


def bus_identity_found(settings: Settings, agent: str) -> bool:
    """Whether the agent's seed (`<agent>.nk`, made by bus-config) is in this api's credentials
    dir; where the api has none, it cannot tell (False)."""
    directory = settings.nats_credentials_dir
    return directory is not None and identities.seed_path(directory, agent).is_file()
