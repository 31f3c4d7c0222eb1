"""`einsora members ls|role|revoke|rm`: a tenant's members, and offboarding one (issue 34, N11).

A tenant's admins (and the operator, who names the tenant with `--tenant`) change a member's
role, revoke every credential a member holds in the tenant, or remove the member; the api
refuses anyone else with its own message. A member is named by username or user id.
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from einsora.cli import render
from einsora.cli.client import ApiClient
from einsora.cli.commands.options import common_options

_ROLES = ("admin", "member")


_TENANT_HELP = "the tenant, by name or id (default: your token's own)"


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", default=None, help=_TENANT_HELP)
    # After the action too; its copy never overwrites a value given before it.
    after = argparse.ArgumentParser(add_help=False)
    after.add_argument("--tenant", default=argparse.SUPPRESS, help=_TENANT_HELP)
    sub = parser.add_subparsers(dest="members_command", metavar="ACTION", required=True)
    nested = [common_options(nested=True), after]
    sub.add_parser("ls", help="list the tenant's members", parents=nested)
    role = sub.add_parser("role", help="give a member another role", parents=nested)
    role.add_argument("user", help="username or user id")
    role.add_argument("role", choices=_ROLES)
    revoke = sub.add_parser(
        "revoke",
        help="revoke every credential a member holds in the tenant (they stay a member)",
        parents=nested,
    )
    revoke.add_argument("user", help="username or user id")
    rm = sub.add_parser(
        "rm", help="remove a member; their credentials there are revoked", parents=nested
    )
    rm.add_argument("user", help="username or user id")


def _tenant(client: ApiClient, wanted: str | None) -> tuple[str, str]:
    """The id and name of the tenant to act in: `wanted` (a name or an id), else the token's."""
    if wanted is None:
        me = client.get("/v1/me")
        return str(me["tenant"]["id"]), str(me["tenant"]["name"])
    for tenant in client.paginate("/v1/tenants"):
        if wanted in (tenant["id"], tenant["name"]):
            return str(tenant["id"]), str(tenant["name"])
    return wanted, wanted  # the api says what it makes of it (404)


def _counted(count: int, what: str) -> str:
    return f"{count} {what}" + ("" if count == 1 else "s")


def _revoked(answer: dict[str, Any]) -> str:
    return ", ".join(
        (
            _counted(answer["api_tokens"], "API token"),
            _counted(answer["sessions"], "dashboard session"),
            _counted(answer["gateway_keys"], "gateway key"),
            _counted(answer["join_tokens"], "join token"),
        )
    )


def _members(client: ApiClient, args: argparse.Namespace) -> int:
    tenant_id, tenant_name = _tenant(client, args.tenant)
    base = f"/v1/tenants/{quote(tenant_id, safe='')}/members"
    if args.members_command == "ls":
        items = client.paginate(base)
        if args.json:
            render.as_json(items)
        else:
            rows = [
                (i["user"]["username"], i["role"], render.ago(i.get("created_at")), i["user"]["id"])
                for i in items
            ]
            render.table(rows, ["user", "role", "joined", "id"])
        return 0
    path = f"{base}/{quote(args.user, safe='')}"
    if args.members_command == "role":
        answer = client.request("PATCH", path, {"role": args.role})
        shown = (
            f"{render.escape(answer['user']['username'])} is now {render.escape(answer['role'])}"
        )
        message = f"{shown} of {render.escape(answer['tenant']['name'])}"
    elif args.members_command == "revoke":
        answer = client.delete(f"{path}/credentials")
        who = render.escape(answer["user"]["username"])
        message = f"revoked in {render.escape(tenant_name)} of {who}: {_revoked(answer)}"
    else:
        answer = client.delete(path)
        who = render.escape(answer["user"]["username"])
        where = render.escape(answer["tenant"]["name"])
        message = f"{who} removed from {where}; revoked {_revoked(answer)} (their workloads stay)"
    if args.json:
        render.as_json(answer)
    else:
        print(message)
    return 0


COMMANDS = [
    (
        "members",
        "list a tenant's members; change a role, revoke a member's credentials, remove one",
        _configure,
        _members,
    )
]
