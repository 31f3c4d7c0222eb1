"""`GET` and `PATCH /v1/machines/{id}`, `/v1/machines/{id}/{reclaim,release}`,
`/v1/machines/{id}/invitations` and `/v1/machine-invitations`: one machine, its sharing level
and what its owner lends, its owner's reclaim, and the invitations its owner makes and guests
accept.

Every change is committed, then its machine's `Enrolment` (guests included) is put to the
`enrolments` bucket before the answer, so the scheduler knows it first.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.responses import Response

from einsora.api.deps import (
    AUTH_ERRORS,
    BODY_ERRORS,
    PARAM_ERRORS,
    JsonBody,
    Me,
    errors,
    no_content,
    operation_id,
    reply,
)
from einsora.api.errors import NotFound
from einsora.api.routers.machines import MachineId, enrolments_of
from einsora.api.schemas.catalog import MachineOut
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.machines import (
    MachineInvitationCreate,
    MachineInvitationOut,
    MachineInvitationPage,
    SharingUpdate,
)
from einsora.api.services import machine_invitations, machine_sharing, machine_visibility
from einsora.api.views.machines import MachineRecord
from einsora.common.schemas import Enrolment

log = logging.getLogger("einsora.api.views.machines")
router = APIRouter(tags=["machines"], generate_unique_id_function=operation_id)
InvitationId = Annotated[str, Path(alias="id")]
Page = Annotated[PageQuery, Query()]
RULE = (
    " An accepted invitation counts only while the machine's sharing is not `private` (the "
    "scheduler applies that rule)."
)


async def _put(request: Request, enrolment: Enrolment) -> None:
    sync = enrolments_of(request)
    if sync is not None:
        await sync.put(enrolment)  # the scheduler knows before the caller does


@router.patch(
    "/v1/machines/{id:machine_id}",
    summary="Set a machine's sharing level (`private`, `invite-only` or `community`), its "
    "reclaim terms, or what its owner lends Einsora of it (an admin of its owner tenant, or "
    "the operator)",
    response_model=MachineOut,
    responses=errors(*AUTH_ERRORS, *BODY_ERRORS, 403, 404, 409),
)
async def share_machine(
    call: Me,
    request: Request,
    machine_id: MachineId,
    body: Annotated[SharingUpdate, Depends(JsonBody(SharingUpdate))],
) -> Response:
    store = call.ctx.store
    pool = call.ctx.settings.community_pool
    record = _record(call, machine_id)
    enrolment = await machine_sharing.set_sharing(
        store,
        call.me,
        machine_id,
        body,
        community_pool=pool,
        inventory=None if record is None else record.inventory,
    )
    await _put(request, enrolment)
    log.info(
        "machine sharing set",
        extra={"machine_id": machine_id, **body.model_dump(exclude_none=True, mode="json")},
    )
    return reply(await _shown(call, enrolment))


def _record(call: Me, machine_id: str) -> MachineRecord | None:
    """What the machines view knows of the machine (its inventory among it), if anything."""
    return next((r for r in call.ctx.machines.snapshot() if r.machine_id == machine_id), None)


async def _shown(call: Me, enrolment: Enrolment) -> MachineOut:
    record = _record(call, enrolment.machine_id)
    return await machine_visibility.shown_machine(call.ctx.store, call.me, enrolment, record)


@router.get(
    "/v1/machines/{id:machine_id}",
    summary="One machine you may use, as `/v1/machines` lists it: its enrolment (the lend and "
    "what is usable now among it), inventory and last heartbeat",
    response_model=MachineOut,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404),
)
async def get_machine(call: Me, machine_id: MachineId) -> Response:
    pool = call.ctx.settings.community_pool
    record = _record(call, machine_id)
    seen = (
        [] if record is None else machine_visibility.visible([record], call.me, community_pool=pool)
    )
    if not seen:
        raise NotFound(f"no machine {machine_id!r}")
    return reply(await machine_visibility.listed_machine(call.ctx.store, call.me, seen[0]))


@router.post(
    "/v1/machines/{id:machine_id}/reclaim",
    summary="Reclaim a machine (an admin of its owner tenant, or the operator): guests' "
    "workloads are preempted after its grace and their minimum runtime, and no guest is "
    "placed there until it is released; again: it stays reclaimed from the first time",
    response_model=MachineOut,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 403, 404, 409),
)
async def reclaim_machine(call: Me, request: Request, machine_id: MachineId) -> Response:
    return await _set_reclaimed(call, request, machine_id, reclaimed=True)


@router.post(
    "/v1/machines/{id:machine_id}/release",
    summary="Release a reclaimed machine: guests may be placed there again (their preempted "
    "workloads stay preempted until resumed); a machine not reclaimed: nothing changes",
    response_model=MachineOut,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 403, 404, 409),
)
async def release_machine(call: Me, request: Request, machine_id: MachineId) -> Response:
    return await _set_reclaimed(call, request, machine_id, reclaimed=False)


async def _set_reclaimed(
    call: Me, request: Request, machine_id: str, *, reclaimed: bool
) -> Response:
    ctx = call.ctx
    enrolment = await machine_sharing.set_reclaimed(
        ctx.store,
        call.me,
        machine_id,
        reclaimed,
        community_pool=ctx.settings.community_pool,
        now=ctx.clock(),
    )
    await _put(request, enrolment)
    log.info(
        "machine reclaimed" if reclaimed else "machine released", extra={"machine_id": machine_id}
    )
    return reply(await _shown(call, enrolment))


@router.post(
    "/v1/machines/{id:machine_id}/invitations",
    summary="Invite a tenant to use a machine (its admins accept); the tenant's live invitation "
    "is answered (200) rather than a second made." + RULE,
    response_model=MachineInvitationOut,
    status_code=201,
    responses={
        200: {"model": MachineInvitationOut, "description": "The tenant was invited already"},
        **errors(*AUTH_ERRORS, *BODY_ERRORS, 403, 404, 409),
    },
)
async def invite_to_machine(
    call: Me,
    machine_id: MachineId,
    body: Annotated[MachineInvitationCreate, Depends(JsonBody(MachineInvitationCreate))],
) -> Response:
    ctx = call.ctx
    made, new = await machine_invitations.invite(
        ctx.store,
        call.me,
        machine_id,
        body,
        community_pool=ctx.settings.community_pool,
        now=ctx.clock(),
    )
    return reply(made, 201 if new else 200)


@router.get(
    "/v1/machines/{id:machine_id}/invitations",
    summary="List a machine's invitations, revoked ones too (whoever shares it)." + RULE,
    response_model=MachineInvitationPage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 403, 404),
)
async def list_machine_invitations(call: Me, machine_id: MachineId, query: Page) -> Response:
    ctx = call.ctx
    page = await machine_invitations.list_for_machine(
        ctx.store, call.me, machine_id, query, community_pool=ctx.settings.community_pool
    )
    return reply(page)


@router.delete(
    "/v1/machines/{id:machine_id}/invitations/{invitation}",
    summary="Revoke a machine invitation: the tenant is no longer its guest",
    status_code=204,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 403, 404),
)
async def revoke_machine_invitation(
    call: Me, request: Request, machine_id: MachineId, invitation: Annotated[str, Path()]
) -> Response:
    ctx = call.ctx
    enrolment = await machine_invitations.revoke(
        ctx.store,
        call.me,
        machine_id,
        invitation,
        community_pool=ctx.settings.community_pool,
        now=ctx.clock(),
    )
    await _put(request, enrolment)
    log.info(
        "machine invitation revoked", extra={"machine_id": machine_id, "invitation": invitation}
    )
    return no_content()


@router.get(
    "/v1/machine-invitations",
    summary="List the invitations of your tenant to other tenants' machines, open and "
    "accepted." + RULE,
    response_model=MachineInvitationPage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS),
)
async def list_my_machine_invitations(call: Me, query: Page) -> Response:
    return reply(await machine_invitations.list_mine(call.ctx.store, call.me, query))


@router.post(
    "/v1/machine-invitations/{id}/accept",
    summary="Accept an invitation to use a machine (an admin of the invited tenant): your "
    "tenant becomes its guest." + RULE,
    response_model=MachineInvitationOut,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 403, 404, 409),
)
async def accept_machine_invitation(
    call: Me, request: Request, invitation_id: InvitationId
) -> Response:
    accepted, enrolment = await machine_invitations.accept(
        call.ctx.store, call.me, invitation_id, now=call.ctx.clock()
    )
    await _put(request, enrolment)
    log.info(
        "machine invitation accepted",
        extra={"machine_id": enrolment.machine_id, "invitation": invitation_id},
    )
    return reply(accepted)
