"""Machine bodies: join tokens (`agt_…`, shown once), the join exchange, revocation, and
sharing (the sharing level and machine invitations).

A join token's secret appears only in `JoinTokenCreated`, and a machine's credential (`agk_…`)
only in `JoinReply`; the store keeps their SHA-256.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, Field, IPvAnyAddress

from einsora.api.schemas.common import Label, Page, RequestBody
from einsora.common.schemas import SharingLevel

MAX_TOKEN_USES = 10_000
MAX_TOKEN_DAYS = 365


class JoinTokenCreate(RequestBody):
    """`POST /v1/machines/join-tokens`: a token that machines exchange for their credential."""

    name: Label = "join"
    region: str | None = Field(
        default=None,
        max_length=64,
        description="the region the machines join; leave it out for this control plane's own",
    )
    sharing: SharingLevel = SharingLevel.private
    uses: int = Field(default=1, ge=1, le=MAX_TOKEN_USES, description="how many machines")
    expires_in_hours: float = Field(default=24.0, gt=0, le=MAX_TOKEN_DAYS * 24)
    tunnel: bool = Field(
        default=True,
        description="its machines are reached through the tunnel their agents dial (they accept "
        "no inbound connection); false: directly, at the address a machine joins from (the "
        "operator's tokens, or an admin's from a network the operator allows)",
    )
    address: IPvAnyAddress | None = Field(
        default=None,
        description="with `tunnel: false`: the address its machine must join from, and is "
        "reached at; null: the address it joins from",
    )


class JoinTokenCreated(BaseModel):
    """A new join token with its secret (`token`), the only time the secret is shown."""

    id: str
    name: str
    token: str
    region: str
    sharing: SharingLevel
    uses: int
    tunnel: bool
    expires_at: datetime
    created_at: datetime
    join_command: str = Field(description="what to run on the machine")
    tls_fingerprint: str | None = Field(
        default=None,
        description="the SHA-256 fingerprint of the control plane's TLS certificate, for "
        "`einsora agent join --fingerprint` (null: it serves no TLS)",
    )


class JoinRequest(RequestBody):
    """`POST /v1/machines/join`: an agent exchanges a join token, once, for its credential."""

    token: str = Field(min_length=10, max_length=128)
    hostname: Label
    tunnel_key: str | None = Field(
        default=None,
        max_length=4096,
        pattern=r"^ssh-ed25519 [A-Za-z0-9+/=]+( [^\r\n]*)?$",
        description="the agent's SSH host key (OpenSSH public key line) for the tunnel",
    )


class TunnelInfo(BaseModel):
    """Where a machine's agent dials its tunnel, and the hub's key it must accept."""

    host: str
    port: int
    hub_key: str


class JoinReply(BaseModel):
    """The machine's id and credential (`agk_…`, shown only here), and where to connect."""

    machine_id: str
    credential: str
    region: str
    owner_tenant_id: str
    sharing: SharingLevel
    nats_url: str
    nats_ca_pem: str | None
    tunnel: TunnelInfo | None
    api_url: str


class MachineSelf(BaseModel):
    """`GET /v1/machines/self`: what the control plane knows of the calling machine."""

    machine_id: str
    revoked: bool
    region: str
    owner_tenant_id: str
    sharing: SharingLevel


_OWNERS_ONLY = "null unless your tenant owns the machine (or you are the operator)"


class MachineLend(BaseModel):
    """What the machine's owner lends Einsora of its inventory (the rest stays the owner's);
    a null field lends all of that resource."""

    cpus: float | None = Field(description="cores Einsora may use in total; null: all")
    memory_mib: int | None = Field(description="memory Einsora may use in total; null: all")
    gpus: list[str] | None = Field(
        description="the GPUs Einsora may use, by uuid (`[]`: none); null: every GPU"
    )


class MachineUsable(BaseModel):
    """What Einsora may give workloads on the machine now: its inventory narrowed by the lend
    (healthy GPUs only)."""

    cpus: float
    memory_mib: int
    gpus: list[str] = Field(description="GPU uuids")


class MachineEnrolment(BaseModel):
    """A machine's enrolment as `/v1/machines` shows it. Its owner's tenant and the operator see
    all of it; a guest or a community user sees the owner's tenant name and the sharing level,
    never who else is invited."""

    owner_tenant_id: str | None = Field(description=_OWNERS_ONLY)
    owner_tenant_name: str | None = Field(default=None, description="the owner's tenant, by name")
    owner_user_id: str | None = Field(description=_OWNERS_ONLY)
    sharing: SharingLevel
    guests: list[str] | None = Field(
        default=None,
        description="the tenants whose invitation was accepted and not revoked (they may use "
        f"it while sharing is not private); {_OWNERS_ONLY}",
    )
    tunnel: bool | None = Field(description=_OWNERS_ONLY)
    address: str | None = Field(
        default=None,
        description="where the control plane reaches a direct machine (its routes point there, "
        f"whatever its agent reports); {_OWNERS_ONLY}",
    )
    reclaim_grace_s: float = Field(
        default=120.0, description="how long guests keep running after the owner reclaims it"
    )
    guest_min_runtime_s: float = Field(
        default=600.0, description="the least a guest's workload runs before a reclaim stops it"
    )
    reclaimed_at: datetime | None = Field(
        default=None,
        description="since when its owner reclaims it through the api (guests are preempted "
        "and none is placed there until it is released); null: not reclaimed",
    )
    lend: MachineLend | None = Field(
        default=None,
        description="what its owner lends Einsora of it; null: all of its inventory",
    )
    usable: MachineUsable | None = Field(
        default=None,
        description="its inventory narrowed by the lend; null: no inventory reported yet",
    )
    enrolled_at: datetime
    revoked_at: datetime | None


class JoinTokenOut(BaseModel):
    """A join token without its secret."""

    id: str
    name: str
    region: str
    sharing: SharingLevel
    uses: int
    used: int
    tunnel: bool
    expires_at: datetime
    created_at: datetime


class JoinTokenPage(Page[JoinTokenOut]):
    pass


MAX_RECLAIM_S = 7 * 24 * 3600.0
"""The longest grace or minimum runtime an owner may set: a week."""


MAX_LENT_GPUS = 256
"""The most GPU uuids a lend may name (more than any machine has)."""


class LendUpdate(RequestBody):
    """What the owner lends, as a merge patch: a field given is set, a field given as null
    lends all of that resource again, a field left out is kept."""

    cpus: float | None = Field(
        default=None, gt=0, description="cores Einsora may use in total (at most the machine's)"
    )
    memory_mib: int | None = Field(
        default=None, gt=0, description="MiB Einsora may use in total (at most the machine's)"
    )
    gpus: list[Annotated[str, Field(min_length=1, max_length=128)]] | None = Field(
        default=None,
        max_length=MAX_LENT_GPUS,
        description="the GPU uuids Einsora may use, each one of the machine's (`[]`: none)",
    )


class SharingUpdate(RequestBody):
    """`PATCH /v1/machines/{id}`: who may use the machine besides its owner's tenant, how a
    reclaim treats them, and what Einsora may use of it (give at least one field)."""

    sharing: SharingLevel | None = Field(
        default=None,
        description="`private`: the owner's tenant only; `invite-only`: also the tenants whose "
        "invitation was accepted; `community`: any tenant, where this control plane runs a "
        "community pool (elsewhere it counts as invite-only)",
    )
    reclaim_grace_s: float | None = Field(
        default=None,
        ge=0,
        le=MAX_RECLAIM_S,
        description="seconds guests' workloads keep running after the owner reclaims the "
        "machine (default 120)",
    )
    guest_min_runtime_s: float | None = Field(
        default=None,
        ge=0,
        le=MAX_RECLAIM_S,
        description="seconds a guest's workload runs at least before a reclaim may preempt it "
        "(default 600)",
    )
    lend: LendUpdate | None = Field(
        default=None,
        description="what Einsora may use of the machine (the rest stays the owner's), merged "
        "into the current lend; null: all of it again. Guests that no longer fit are "
        "preempted after the grace and their minimum runtime; the owner's own workloads run on",
    )


class MachineInvitationCreate(RequestBody):
    """`POST /v1/machines/{id}/invitations`: invite a tenant, or one user, to use the machine
    (exactly one of `tenant` and `user`)."""

    tenant: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="the guest tenant's name or id (`t-…`); its admins accept",
    )
    user: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="the guest user's username; they accept, and their workloads may use the "
        "machine whatever tenant they launch in",
    )


class MachineInvitationOut(BaseModel):
    """An invitation of a tenant or a user to use a machine. Accepted (and not revoked), it
    lets the guest use the machine while the machine's sharing is not `private`; the scheduler
    applies that rule, so an owner may invite ahead and share later."""

    id: str
    machine_id: str
    tenant_id: str | None = Field(description="the guest tenant (null: a user is invited)")
    tenant_name: str | None
    user_id: str | None = Field(description="the guest user (null: a tenant is invited)")
    username: str | None
    owner_tenant_name: str = Field(description="the machine owner's tenant, who invited")
    created_at: datetime
    accepted_at: datetime | None
    revoked_at: datetime | None


class MachineInvitationPage(Page[MachineInvitationOut]):
    pass
