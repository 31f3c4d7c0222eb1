"""A token never outlives the credential that made it, and a user's live tokens are capped
(issue 34, N12).

A token made with an expiring token expires with it at the latest (by default exactly then; a
longer expiry asked for is a 422); a sign-in link, its session and the tokens made from that
session inherit the same bound; a token made from a dashboard session expires within
`SESSION_TOKEN_MAX_DAYS`; the token an invitation's acceptance makes expires with the token that
accepted it. Past `api_tokens_per_user` live tokens the next is a 409 naming the cap.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from einsora.api.services.tokens import SESSION_TOKEN_MAX_DAYS
from einsora.api.testing import RunningApi, new_tenant, running_api, sign_in
from einsora.common.schemas import utcnow
from einsora.common.settings import Settings
from einsora.common.testing import Bus


def _at(text: str | None) -> datetime:
    assert text is not None, "expected an expiry"
    return datetime.fromisoformat(text)


async def test_a_token_made_with_a_one_day_token_expires_with_it(api_on_store: RunningApi) -> None:
    api = api_on_store
    maker = await api.owner.post("/v1/tokens", {"name": "a day", "expires_in_days": 1})
    assert maker.status == 201, maker.text
    day = api.client(maker.body["token"])
    maker_expires = _at(maker.body["expires_at"])

    made = await day.post("/v1/tokens", {"name": "for ever?"})
    assert made.status == 201, made.text
    assert _at(made.body["expires_at"]) <= maker_expires

    longer = await day.post("/v1/tokens", {"name": "a month", "expires_in_days": 30})
    assert longer.status == 422, longer.text
    assert longer.body["details"][0]["field"] == "expires_in_days"
    assert maker_expires.isoformat()[:16] in longer.body["message"]
    assert longer.body["request_id"] == longer.request_id

    # Through a sign-in link and its session: the same bound.
    link = await day.post("/v1/sign-in-links", {})
    assert link.status == 201, link.text
    session, began = await sign_in(
        api.client(None), "/v1/sessions/link", {"code": link.body["code"]}
    )
    assert _at(began.body["expires_at"]) <= maker_expires
    from_session = await session.post("/v1/tokens", {"name": "from the dashboard"})
    assert from_session.status == 201, from_session.text
    assert _at(from_session.body["expires_at"]) <= maker_expires


async def test_a_token_made_from_a_session_expires_within_the_maximum(api: RunningApi) -> None:
    path = api.service.owner_sign_in_path
    assert path is not None
    code = path.rpartition("link=")[2]
    session, _ = await sign_in(api.client(None), "/v1/sessions/link", {"code": code})
    made = await session.post("/v1/tokens", {"name": "for my laptop"})
    assert made.status == 201, made.text
    bound = utcnow() + timedelta(days=SESSION_TOKEN_MAX_DAYS)
    assert bound - timedelta(minutes=1) < _at(made.body["expires_at"]) <= bound
    longer = await session.post(
        "/v1/tokens", {"name": "a year", "expires_in_days": SESSION_TOKEN_MAX_DAYS + 1}
    )
    assert longer.status == 422, longer.text
    assert longer.body["details"][0]["field"] == "expires_in_days"


async def test_accepting_an_invitation_with_a_one_day_token_makes_a_one_day_token(
    api: RunningApi,
) -> None:
    b_id, b_admin = await new_tenant(api, "b", "b-admin")
    maker = await api.owner.post("/v1/tokens", {"name": "a day", "expires_in_days": 1})
    invited = await b_admin.post(f"/v1/tenants/{b_id}/invitations", {"username": "owner"})
    accepted = await api.client(maker.body["token"]).post(
        f"/v1/invitations/{invited.body['id']}/accept"
    )
    assert accepted.status == 201, accepted.text
    assert _at(accepted.body["token"]["expires_at"]) <= _at(maker.body["expires_at"])


async def test_live_tokens_per_user_are_capped(bus: Bus, sqlite_url: str, data_dir: Path) -> None:
    settings = Settings(
        nats_url=bus.url, database_url=sqlite_url, data_dir=data_dir, api_tokens_per_user=3
    )
    async with running_api(settings) as api:
        made = [await api.owner.post("/v1/tokens", {"name": f"t{i}"}) for i in range(2)]
        assert [m.status for m in made] == [201, 201]  # with the owner's own: 3
        refused = await api.owner.post("/v1/tokens", {"name": "one too many"})
        assert refused.status == 409, refused.text
        assert refused.body["error"] == "too_many_tokens"
        assert "3" in refused.body["message"]
        assert "EINSORA_API_TOKENS_PER_USER" in refused.body["message"]
        assert refused.body["request_id"] == refused.request_id
        listed = await api.owner.get("/v1/tokens")
        assert "one too many" not in [t["name"] for t in listed.body["items"]]

        assert (await api.owner.delete(f"/v1/tokens/{made[0].body['id']}")).status == 204
        again = await api.owner.post("/v1/tokens", {"name": "in its place"})
        assert again.status == 201, again.text
