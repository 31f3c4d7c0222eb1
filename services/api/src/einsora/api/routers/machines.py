"""`/v1/machines/…`: join tokens, the join exchange, a machine's own view, revocation, and the
operator's enrolment of a sim agent's machines (sharing is `machine_sharing.py`'s).

The join exchange and `self` authenticate no API token: the first carries a join token in its
body, the second the machine's own credential (`Authorization: Bearer agk_…`); both count
against their client address's rate limit (`deps.context`).
"""

from __future__ import annotations

import hashlib
import logging
import ssl
from pathlib import Path as FilePath
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.convertors import Convertor, register_url_convertor
from starlette.responses import Response

from einsora.api.deps import (
    AUTH_ERRORS,
    BODY_ERRORS,
    PARAM_ERRORS,
    Ctx,
    JsonBody,
    Me,
    errors,
    no_content,
    operation_id,
    reply,
)
from einsora.api.errors import Unauthenticated, Unavailable
from einsora.api.projections.enrolments import EnrolmentsSync
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.machines import (
    JoinReply,
    JoinRequest,
    JoinTokenCreate,
    JoinTokenCreated,
    JoinTokenPage,
    MachineSelf,
    TunnelInfo,
)
from einsora.api.schemas.sim_agents import SimAgentEnrol, SimAgentEnrolled
from einsora.api.services import machines, sim_agents
from einsora.common.settings import Settings

log = logging.getLogger("einsora.api.views.machines")
router = APIRouter(tags=["machines"], generate_unique_id_function=operation_id)


class _MachineIdConvertor(Convertor[str]):
    """A machine id in a path: a subject token, and none of this router's own words, so that
    `/v1/machines/join-tokens` is never taken for a machine (nor advertises its methods)."""

    regex = r"(?!(?:join-tokens|join|self|sim-agents)$)[A-Za-z0-9_-]{1,128}"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("machine_id", _MachineIdConvertor())

TokenId = Annotated[str, Path(alias="id")]
MachineId = Annotated[str, Path(alias="id", max_length=128)]
HUB_KEY_FILE = FilePath("tunnel") / "hub_key.pub"
"""The tunnel hub's public key, under the data dir: the hub writes it, joins hand it out."""


def enrolments_of(request: Request) -> EnrolmentsSync | None:
    """What puts enrolments to the bus (None: the api runs without a bus)."""
    sync: EnrolmentsSync | None = request.app.state.ctx.enrolments
    return sync


def _api_url(settings: Settings, request: Request) -> str:
    return (settings.public_url or str(request.base_url)).rstrip("/")


def tls_fingerprint(cert_file: FilePath | None) -> str | None:
    """`sha256:<hex>` of the certificate's DER, as `einsora agent join --fingerprint` takes."""
    if cert_file is None:
        return None
    try:
        der = ssl.PEM_cert_to_DER_cert(cert_file.read_text())
    except (OSError, ValueError) as exc:
        log.warning("cannot read the TLS certificate", extra={"error": repr(exc)})
        return None
    return "sha256:" + hashlib.sha256(der).hexdigest()


@router.post(
    "/v1/machines/join-tokens",
    summary="Make a join token for machines of your tenant (its secret is shown only here)",
    response_model=JoinTokenCreated,
    status_code=201,
    responses=errors(*AUTH_ERRORS, *BODY_ERRORS, 403),
)
async def create_join_token(
    call: Me,
    request: Request,
    body: Annotated[JoinTokenCreate, Depends(JsonBody(JoinTokenCreate))],
) -> Response:
    settings = call.ctx.settings
    made = await machines.create_join_token(
        call.ctx.store,
        call.me,
        body,
        default_region=settings.region,
        now=call.ctx.clock(),
        direct_networks=settings.direct_machine_networks,
    )
    fingerprint = tls_fingerprint(settings.nats_tls_cert)
    command = f"einsora agent join {_api_url(settings, request)} --token {made.token}"
    if fingerprint is not None:
        command += f" --fingerprint {fingerprint}"
    created = JoinTokenCreated(
        id=made.id,
        name=body.name,
        token=made.token,
        region=made.region,
        sharing=body.sharing,
        uses=body.uses,
        tunnel=body.tunnel,
        expires_at=made.expires_at,
        created_at=made.created_at,
        join_command=command,
        tls_fingerprint=fingerprint,
    )
    return reply(created, 201)


@router.get(
    "/v1/machines/join-tokens",
    summary="List your tenant's join tokens (never their secrets)",
    response_model=JoinTokenPage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 403),
)
async def list_join_tokens(call: Me, query: Annotated[PageQuery, Query()]) -> Response:
    return reply(await machines.list_join_tokens(call.ctx.store, call.me, query))


@router.delete(
    "/v1/machines/join-tokens/{id}",
    summary="Revoke a join token: no machine joins with it any more",
    status_code=204,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 403, 404),
)
async def revoke_join_token(call: Me, token_id: TokenId) -> Response:
    await machines.revoke_join_token(call.ctx.store, call.me, token_id, now=call.ctx.clock())
    return no_content()


@router.post(
    "/v1/machines/sim-agents",
    summary="Enrol the machines a sim agent hosts (the operator only), and say how to start it",
    response_model=SimAgentEnrolled,
    status_code=201,
    responses=errors(*AUTH_ERRORS, *BODY_ERRORS, 403, 409),
)
async def enrol_sim_agent(
    call: Me,
    request: Request,
    body: Annotated[SimAgentEnrol, Depends(JsonBody(SimAgentEnrol))],
) -> Response:
    settings = call.ctx.settings
    made = await sim_agents.enrol_sim_agent(
        call.ctx.store, call.me, body, default_region=settings.region, now=call.ctx.clock()
    )
    sync = enrolments_of(request)
    if sync is not None:
        for enrolment in made.enrolments:
            await sync.put(enrolment)  # the scheduler counts them from here
    log.info(
        "sim agent's machines enrolled",
        extra={"agent": body.agent, "machines": body.count, "new": made.enrolled},
    )
    answer = SimAgentEnrolled(
        agent=body.agent,
        machine_ids=[e.machine_id for e in made.enrolments],
        enrolled=made.enrolled,
        region=made.region,
        owner_tenant_id=made.owner_tenant_id,
        sharing=made.enrolments[0].sharing,
        nats_url=settings.agent_nats_url or settings.effective_nats_url,
        agent_command=sim_agents.agent_command(body.agent, body.count, made.region),
        agent_env=sim_agents.agent_env(settings),
        bus_identity_found=sim_agents.bus_identity_found(settings, body.agent),
        sim_machines_allowed=settings.sim_machines,
    )
    return reply(answer, 201)


@router.post(
    "/v1/machines/join",
    summary="A machine's agent exchanges a join token, once, for its id and credential",
    response_model=JoinReply,
    status_code=201,
    responses=errors(401, 403, *BODY_ERRORS, 429, 503),
)
async def join(
    ctx: Ctx, request: Request, body: Annotated[JoinRequest, Depends(JsonBody(JoinRequest))]
) -> Response:
    settings = ctx.settings
    api_url = _api_url(settings, request)
    tunnel: TunnelInfo | None = None
    hub_key_path = settings.data_dir / HUB_KEY_FILE
    try:
        hub_key = hub_key_path.read_text().strip()
    except OSError:
        hub_key = None
    joined = await machines.join(
        ctx.store,
        body,
        now=ctx.clock(),
        hub_running=hub_key is not None,
        # Where it joined from (a trusted proxy's forwarded address: EINSORA_TRUSTED_PROXIES).
        peer=None if request.client is None else request.client.host,
        direct_networks=settings.direct_machine_networks,
    )
    enrolment = joined.enrolment
    if enrolment.tunnel:
        assert hub_key is not None  # join refuses a tunnelled machine without a hub
        host = urlsplit(api_url).hostname or settings.bind_host
        tunnel = TunnelInfo(host=host, port=settings.tunnel_port, hub_key=hub_key)
    sync = enrolments_of(request)
    if sync is not None:
        await sync.put(enrolment)  # the scheduler and the hub know the machine first
    ca_pem = None
    if settings.nats_tls_cert is not None:
        try:
            ca_pem = settings.nats_tls_cert.read_text()
        except OSError as exc:
            raise Unavailable(f"cannot read the NATS TLS certificate: {exc}") from exc
    log.info(
        "machine enrolled",
        extra={
            "machine_id": enrolment.machine_id,
            "tenant": enrolment.owner_tenant_id,
            "region": enrolment.region,
            "tunnel": enrolment.tunnel,
        },
    )
    answer = JoinReply(
        machine_id=enrolment.machine_id,
        credential=joined.credential,
        region=enrolment.region,
        owner_tenant_id=enrolment.owner_tenant_id,
        sharing=enrolment.sharing,
        nats_url=settings.agent_nats_url or settings.effective_nats_url,
        nats_ca_pem=ca_pem,
        tunnel=tunnel,
        api_url=api_url,
    )
    return reply(answer, 201)


@router.get(
    "/v1/machines/self",
    summary="What the control plane knows of the calling machine (its agent's credential)",
    response_model=MachineSelf,
    responses=errors(401, 429),
)
async def machine_self(ctx: Ctx, request: Request) -> Response:
    header = request.headers.get("authorization") or ""
    scheme, _, credential = header.partition(" ")
    enrolment = None
    if scheme == "Bearer":
        enrolment = await machines.by_credential(ctx.store, credential.strip())
    if enrolment is None:
        raise Unauthenticated("unknown machine credential: send `Authorization: Bearer agk_…`")
    if enrolment.revoked:
        raise Unauthenticated(f"machine {enrolment.machine_id} was revoked", code="machine_revoked")
    return reply(
        MachineSelf(
            machine_id=enrolment.machine_id,
            revoked=False,
            region=enrolment.region,
            owner_tenant_id=enrolment.owner_tenant_id,
            sharing=enrolment.sharing,
        )
    )


@router.delete(
    "/v1/machines/{id:machine_id}",
    summary="Revoke a machine: its bus connection and tunnel are cut, its workloads fail",
    status_code=204,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 403, 404),
)
async def revoke_machine(call: Me, request: Request, machine_id: MachineId) -> Response:
    enrolment = await machines.revoke(call.ctx.store, call.me, machine_id, now=call.ctx.clock())
    sync = enrolments_of(request)
    if sync is not None:
        await sync.put(enrolment)  # the scheduler fails its workloads, the hub cuts its tunnel
    bus_auth = request.app.state.ctx.bus_auth
    if bus_auth is not None:
        cut = await bus_auth.kick(machine_id)
        log.info("machine revoked", extra={"machine_id": machine_id, "connections_cut": cut})
    return no_content()
