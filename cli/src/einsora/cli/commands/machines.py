"""`einsora machines [list|join-token|revoke]`: the machines, and enrolling and revoking them."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from einsora.cli import render
from einsora.cli.client import ApiClient
from einsora.cli.commands.options import common_options

_SHARING = ("private", "invite-only", "community")


def _configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="machines_command", metavar="ACTION")
    nested = [common_options(nested=True)]
    sub.add_parser("list", aliases=["ls"], help="list the machines (the default)", parents=nested)
    token = sub.add_parser(
        "join-token",
        help="make a token that machines exchange, once, for their own credential",
        parents=nested,
    )
    token.add_argument("--name", default="join")
    token.add_argument("--uses", type=int, default=1, help="how many machines (default 1)")
    token.add_argument(
        "--expires-in-hours", type=float, default=24.0, help="default: 24 hours from now"
    )
    token.add_argument("--region", help="the machines' region (default: this control plane's)")
    token.add_argument("--sharing", choices=_SHARING, default="private")
    token.add_argument(
        "--direct",
        action="store_true",
        help="the machines accept connections from the control plane (default: reached "
        "through the tunnel their agents dial)",
    )
    revoke = sub.add_parser(
        "revoke",
        help="revoke a machine: its connection is cut and its workloads fail",
        parents=nested,
    )
    revoke.add_argument("id", help="the machine's id (m-…)")


def _list(client: ApiClient, args: argparse.Namespace) -> int:
    items = client.paginate("/v1/machines")
    if args.json:
        render.as_json(items)
        return 0
    rows = []
    for m in items:
        inv: dict[str, Any] = m.get("inventory") or {}
        enrolment: dict[str, Any] = m.get("enrolment") or {}
        gpus = inv.get("gpus") or []
        rows.append(
            (
                m.get("id"),
                m.get("region") or "-",
                enrolment.get("owner_tenant_id") or "(not enrolled)",
                enrolment.get("sharing") or "-",
                inv.get("cpus"),
                f"{(inv.get('memory_mib') or 0) // 1024} GiB" if inv else "-",
                f"{len(gpus)}x {gpus[0]['model']}" if gpus else "-",
                render.ago(m.get("heartbeat_at")),
                render.ago(enrolment.get("enrolled_at")),
                render.ago(enrolment.get("revoked_at")) if enrolment.get("revoked_at") else "-",
            )
        )
    render.table(
        rows,
        [
            "machine",
            "region",
            "owner",
            "sharing",
            "cpus",
            "memory",
            "gpus",
            "heartbeat",
            "enrolled",
            "revoked",
        ],
    )
    return 0


def _join_token(client: ApiClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {
        "name": args.name,
        "uses": args.uses,
        "expires_in_hours": args.expires_in_hours,
        "sharing": args.sharing,
        "tunnel": not args.direct,
    }
    if args.region:
        body["region"] = args.region
    made = client.post("/v1/machines/join-tokens", body)
    if args.json:
        render.as_json(made)
        return 0
    uses = "once" if made["uses"] == 1 else f"by up to {made['uses']} machines"
    print(
        f"join token {render.escape(made['id'])} for region {render.escape(made['region'])}, "
        f"{render.escape(made['sharing'])}, usable {uses} until {made['expires_at']}:"
    )
    print(render.escape(made["token"]))
    print("It will not be shown again (only its hash is stored). On the machine, run:")
    print(f"  {render.escape(made['join_command'])}")
    if made.get("tls_fingerprint"):
        print(f"The control plane's TLS certificate: {render.escape(made['tls_fingerprint'])}")
    return 0


def _revoke(client: ApiClient, args: argparse.Namespace) -> int:
    client.delete(f"/v1/machines/{quote(args.id, safe='')}")
    if args.json:
        render.as_json({"id": args.id, "revoked": True})
    else:
        print(f"machine {render.escape(args.id)} revoked: its connection is cut")
    return 0


def _machines(client: ApiClient, args: argparse.Namespace) -> int:
    command = getattr(args, "machines_command", None)
    if command == "join-token":
        return _join_token(client, args)
    if command == "revoke":
        return _revoke(client, args)
    return _list(client, args)


COMMANDS = [("machines", "list machines, make join tokens, revoke machines", _configure, _machines)]
