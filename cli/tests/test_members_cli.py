"""`einsora members ls|role|revoke|rm`, run as a real subprocess against a real api (issue 34,
N11): an admin lists the tenant's members, changes a role, revokes a member's credentials and
removes a member; a member is refused with the api's message."""

from __future__ import annotations

import json
from pathlib import Path

from einsora.api.testing import RunningApi, cli_env, einsora, new_member, new_tenant


async def test_an_admin_offboards_a_member(api: RunningApi, tmp_path: Path) -> None:
    acme, ann = await new_tenant(api, "acme", "ann")
    carl = await new_member(api, acme, "carl", by=ann)
    dora = await new_member(api, acme, "dora", by=ann)
    env = cli_env(api, tmp_path, ann.token)

    code, out, err = await einsora(env, "members", "ls")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["USER", "ROLE", "JOINED"]
    assert sorted(line.split()[0] for line in lines[1:]) == ["ann", "carl", "dora"]

    code, out, err = await einsora(env, "members", "role", "carl", "admin")
    assert code == 0, err
    assert "carl is now admin of acme" in out
    assert (await carl.get("/v1/me")).body["role"] == "admin"

    code, out, err = await einsora(env, "members", "revoke", "dora", "--json")
    assert code == 0, err
    assert json.loads(out)["api_tokens"] == 1
    assert (await dora.get("/v1/me")).status == 401

    code, out, err = await einsora(env, "members", "rm", "carl")
    assert code == 0, err
    assert "carl removed from acme" in out
    assert "1 API token" in out
    assert (await carl.get("/v1/me")).status == 401

    code, out, err = await einsora(env, "members", "ls", "--json")
    assert code == 0, err
    assert sorted(m["user"]["username"] for m in json.loads(out)) == ["ann", "dora"]


async def test_a_member_is_refused_with_the_apis_message(api: RunningApi, tmp_path: Path) -> None:
    acme, ann = await new_tenant(api, "acme", "ann")
    carl = await new_member(api, acme, "carl", by=ann)
    code, _, err = await einsora(cli_env(api, tmp_path, carl.token), "members", "rm", "ann")
    assert code == 1
    assert "HTTP 403" in err
    assert "request ID" in err
    # The operator names the tenant it acts in.
    code, out, err = await einsora(cli_env(api, tmp_path), "members", "ls", "--tenant", "acme")
    assert code == 0, err
    assert sorted(line.split()[0] for line in out.splitlines()[1:]) == ["ann", "carl"]
