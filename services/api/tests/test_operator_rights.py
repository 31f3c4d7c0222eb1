"""Operator rights come from the credential, never from the user row alone (issue 34, N2).

A token of the operator's user that does not carry operator rights (one it made for a script, or
the token it got by accepting another tenant's invitation) may set the user's first password,
but that password signs in without operator rights; a credential that expires may not set a
first password at all (the password would outlive it). A password set from an operator's
credential signs in with operator rights, and proving the current password keeps them.
"""

from __future__ import annotations

from einsora.api.testing import RunningApi, SessionClient, link_code, new_tenant, sign_in

PASSWORD = "correct horse battery staple"


async def _password_session(api: RunningApi, password: str = PASSWORD) -> SessionClient:
    session, _ = await sign_in(
        api.client(None), "/v1/sessions", {"username": "owner", "password": password}
    )
    return session


async def test_a_plain_token_of_the_operator_sets_a_password_without_operator_rights(
    api: RunningApi,
) -> None:
    plain = await api.owner.post("/v1/tokens", {"name": "a script's"})
    assert plain.status == 201, plain.text
    assert plain.body["operator"] is False
    script = api.client(plain.body["token"])

    first = await script.call("PUT", "/v1/me/password", {"password": PASSWORD})
    assert first.status == 204, first.text
    session = await _password_session(api)
    current = await session.get("/v1/sessions/current")
    assert (current.body["user"]["username"], current.body["operator"]) == ("owner", False)
    assert (await session.get("/v1/me")).body["operator"] is False
    refused = await session.post("/v1/tenants", {"name": "taken-over"})
    assert refused.status == 403, refused.text
    assert refused.body["request_id"] == refused.request_id
    tenants = await session.get("/v1/tenants")
    assert [t["name"] for t in tenants.body["items"]] == ["owner"]  # its own tenant only

    # Proving the password does not make it an operator's either; an operator's link still is.
    again = await _password_session(api)
    assert (await again.post("/v1/tenants", {"name": "taken-over"})).status == 403
    path = api.service.owner_sign_in_path
    assert path is not None
    operator, began = await sign_in(
        api.client(None), "/v1/sessions/link", {"code": link_code(path)}
    )
    assert began.body["operator"] is True
    assert (await operator.post("/v1/tenants", {"name": "made-by-the-operator"})).status == 201


async def test_the_token_another_tenant_gave_the_operator_sets_no_operator_password(
    api: RunningApi,
) -> None:
    b_id, b_admin = await new_tenant(api, "b", "b-admin")
    invited = await b_admin.post(f"/v1/tenants/{b_id}/invitations", {"username": "owner"})
    assert invited.status == 201, invited.text
    accepted = await api.owner.post(f"/v1/invitations/{invited.body['id']}/accept")
    assert accepted.status == 201, accepted.text
    in_b = api.client(accepted.body["token"]["token"])

    assert (await in_b.call("PUT", "/v1/me/password", {"password": PASSWORD})).status == 204
    for tenant in ("owner", "b"):
        session, began = await sign_in(
            api.client(None),
            "/v1/sessions",
            {"username": "owner", "password": PASSWORD, "tenant": tenant},
        )
        assert began.body["operator"] is False, tenant
        assert (await session.post("/v1/tenants", {"name": "nope"})).status == 403


async def test_an_expiring_token_cannot_set_the_first_password(api: RunningApi) -> None:
    made = await api.owner.post(
        "/v1/tokens", {"name": "a day", "expires_in_days": 1, "operator": True}
    )
    assert made.status == 201, made.text
    short = api.client(made.body["token"])
    refused = await short.call("PUT", "/v1/me/password", {"password": PASSWORD})
    assert refused.status == 403, refused.text
    assert refused.body["error"] == "credential_expires"
    assert refused.body["request_id"] == refused.request_id
    assert PASSWORD not in refused.text
    wrong = await api.client(None).post(
        "/v1/sessions",
        {"username": "owner", "password": PASSWORD},
        headers={"Origin": api.url},
    )
    assert wrong.status == 401  # no password was set


async def test_proving_the_current_password_keeps_its_operator_rights(api: RunningApi) -> None:
    path = api.service.owner_sign_in_path
    assert path is not None
    operator, _ = await sign_in(api.client(None), "/v1/sessions/link", {"code": link_code(path)})
    assert (await operator.call("PUT", "/v1/me/password", {"password": PASSWORD})).status == 204
    assert (await _password_session(api)).csrf  # an operator's password: signs in

    plain = await api.owner.post("/v1/tokens", {"name": "a script's"})
    script = api.client(plain.body["token"])
    changed = await script.call(
        "PUT",
        "/v1/me/password",
        {"current_password": PASSWORD, "password": "another long passphrase"},
    )
    assert changed.status == 204, changed.text
    session = await _password_session(api, "another long passphrase")
    assert (await session.get("/v1/me")).body["operator"] is True
