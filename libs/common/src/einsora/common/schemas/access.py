"""Routes (where a running workload answers), access-ticket redemption, and API token
revocations between api replicas.

The scheduler writes a workload's `Route` to the `routes` bucket when it is running and deletes
it when it stops; the proxy and gateway read it. The proxy redeems an access ticket by asking the
api (`access.redeem`, request/reply), which owns the tickets and marks each used exactly once.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from einsora.common.schemas.base import Message
from einsora.common.vocab import WorkloadKind


class Route(Message):
    """`routes/<workload>`: where a running workload answers, and its own token."""

    workload_id: str
    tenant_id: str
    kind: WorkloadKind
    machine_id: str
    host: str
    port: int
    token: str | None = None
    """The workload's own token (Jupyter's), added by the proxy; never sent to a browser."""
    name: str = ""
    """The workload's name: for an endpoint, the model name clients send to the gateway."""
    runtime: str | None = None
    """An endpoint's runtime (`EndpointRuntime`), so the gateway knows how to count its tokens;
    `sim` when the sim driver simulates it."""
    via_tunnel: bool = False
    """Reached through the tunnel machine `machine_id`'s agent dialed (`host` and `port` are then
    the workload's address on that machine); False: directly at `host:port`."""
    ports: dict[str, int] = Field(default_factory=dict)
    """Its other ports on `host` by what they carry (`Endpoint.ports`): a VM's `ssh`, `console`
    and `http`."""


class AccessRedeemRequest(Message):
    """The proxy asks the api to redeem `ticket` for the site of `workload_id`."""

    ticket: str
    workload_id: str
    request_id: str


class AccessRedeemReply(Message):
    """The api's answer: `ok`, or why not (`unknown`, `used`, `expired`, `wrong_site`)."""

    ok: bool
    error: str | None = None
    workload_id: str | None = None
    tenant_id: str | None = None
    user_id: str | None = None
    expires_at: datetime | None = None


class TokensRevoked(Message):
    """`api.tokens.revoked`: these API tokens were revoked; drop them from every cache."""

    token_ids: list[str]
