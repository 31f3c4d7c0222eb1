"""`einsora tokens create|ls|revoke`: API tokens for the CLI and scripts."""

from __future__ import annotations

import argparse

from einsora.cli import render
from einsora.cli.client import ApiClient
from einsora.cli.commands.options import common_options


def _configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tokens_command", metavar="ACTION", required=True)
    nested = [common_options(nested=True)]
    create = sub.add_parser(
        "create", help="make a token (its secret is shown once)", parents=nested
    )
    create.add_argument("name")
    create.add_argument("--expires-in-days", type=int)
    sub.add_parser("ls", help="list tokens (never their secrets)", parents=nested)
    revoke = sub.add_parser("revoke", help="revoke a token at once", parents=nested)
    revoke.add_argument("id")


def _tokens(client: ApiClient, args: argparse.Namespace) -> int:
    if args.tokens_command == "create":
        body: dict[str, object] = {"name": args.name}
        if args.expires_in_days is not None:
            body["expires_in_days"] = args.expires_in_days
        token = client.post("/v1/tokens", body)
        if args.json:
            render.as_json(token)
        else:
            shown = f"token {render.escape(token['id'])} ({render.escape(token['name'])})"
            print(f"{shown}; its secret, shown only now:")
            print(render.escape(token["token"]))
        return 0
    if args.tokens_command == "ls":
        items = client.paginate("/v1/tokens")
        if args.json:
            render.as_json(items)
        else:
            rows = [
                (
                    t["id"],
                    t["name"],
                    render.ago(t.get("created_at")),
                    t.get("expires_at"),
                    render.ago(t.get("last_used_at")),
                )
                for t in items
            ]
            render.table(rows, ["id", "name", "created", "expires", "last used"])
        return 0
    client.delete(f"/v1/tokens/{args.id}")
    if args.json:
        render.as_json({"id": args.id, "revoked": True})
    else:
        print(f"token {render.escape(args.id)} revoked")
    return 0


COMMANDS = [("tokens", "create, list and revoke API tokens", _configure, _tokens)]
