"""Sim agents' bodies: the operator enrols the machines one sim agent hosts, in one call.

A sim agent (`einsora agent --driver sim --machine-id AGENT --sim-machines N`) hosts N machines
that run nothing, on one connection, with the static bus identity `einsora bus-config --sim-agent
AGENT --sim-machines N` made. The reply says how to start it; it holds no secret (the agent's
seed stays in the credentials dir).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from einsora.api.schemas.common import RequestBody
from einsora.common.schemas import SharingLevel

MAX_SIM_MACHINES = 1000
"""The most machines one sim agent hosts: its connection holds a subscription per machine."""

AGENT_PATTERN = r"^[A-Za-z0-9_-]{1,100}$"


class SimAgentEnrol(RequestBody):
    """`POST /v1/machines/sim-agents`: enrol the machines of one sim agent (operator only)."""

    agent: str = Field(
        pattern=AGENT_PATTERN,
        description="the sim agent's id: its bus identity (`einsora bus-config --sim-agent`) "
        "and its `einsora agent --machine-id`",
        examples=["m-sim"],
    )
    count: int = Field(
        default=1,
        ge=1,
        le=MAX_SIM_MACHINES,
        description="how many machines it hosts (`--sim-machines`): AGENT-0001 …, or AGENT "
        "alone for 1",
    )
    region: str | None = Field(
        default=None,
        max_length=64,
        description="the machines' region; leave it out for this control plane's own",
    )
    tenant: str | None = Field(
        default=None,
        max_length=64,
        description="the tenant that owns them, by name or id; leave it out for yours",
    )
    sharing: SharingLevel = SharingLevel.private


class SimAgentEnrolled(BaseModel):
    """The sim agent's machines, enrolled, and how to start the agent that hosts them."""

    agent: str
    machine_ids: list[str] = Field(description="every machine it hosts, enrolled")
    enrolled: int = Field(description="how many of them this call enrolled (the rest already were)")
    region: str
    owner_tenant_id: str
    sharing: SharingLevel
    nats_url: str = Field(description="where the agent connects")
    agent_command: str = Field(
        description="what to run, with `agent_env` set, where the agent's bus identity is"
    )
    agent_env: dict[str, str] = Field(
        description="the environment `agent_command` needs: the NATS URL, and the credentials "
        "dir holding `<agent>.nk`"
    )
    bus_identity_found: bool = Field(
        description="whether this api finds `<agent>.nk` in its own credentials dir; false: run "
        "`einsora bus-config --sim-agent AGENT --sim-machines COUNT` (and reload the NATS "
        "servers) first"
    )
    sim_machines_allowed: bool = Field(
        description="whether this api runs with EINSORA_SIM_MACHINES on; the schedulers place "
        "on sim machines only where it is"
    )
