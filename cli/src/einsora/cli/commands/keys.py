"""`einsora keys create|list|revoke`: keys (`esk_…`) for the inference gateway."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote, urlsplit

from einsora.cli import render
from einsora.cli.client import ApiClient
from einsora.cli.commands.options import common_options
from einsora.cli.config import local_port

_LOOPBACK = {"localhost", "127.0.0.1", "::1"}


def gateway_url(api_url: str) -> str:
    """Where the gateway most likely answers: the API's host, on the gateway's port (Solo
    serves both on 127.0.0.1)."""
    host = urlsplit(api_url).hostname or "127.0.0.1"
    if host in _LOOPBACK:
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{local_port('gateway_port')}/v1"


def _model_list(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("name at least one endpoint, e.g. --models llama,qwen")
    return names


def _configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    nested = [common_options(nested=True)]
    create = sub.add_parser("create", help="make a key (shown once)", parents=nested)
    create.add_argument("name")
    create.add_argument(
        "--models",
        type=_model_list,
        help="comma-separated endpoint names the key may use (default: every endpoint)",
    )
    create.add_argument("--rpm", type=int, help="requests per minute (default: no limit)")
    create.add_argument("--tpm", type=int, help="tokens per minute (default: no limit)")
    create.add_argument(
        "--max-tokens-default",
        type=int,
        help="max_tokens for a request that names none (default: 1024)",
    )
    create.add_argument("--expires-in-days", type=int)
    sub.add_parser(
        "list", aliases=["ls"], help="list keys (never the keys themselves)", parents=nested
    )
    revoke = sub.add_parser("revoke", help="revoke a key at once", parents=nested)
    revoke.add_argument("id", help="the key's id (gk-…)")


def _create(client: ApiClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name}
    for field in ("models", "rpm", "tpm", "max_tokens_default", "expires_in_days"):
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    key = client.post("/v1/gateway/keys", body)
    if args.json:
        render.as_json(key)
        return 0
    models = ", ".join(key["models"]) if key.get("models") else "every endpoint"
    shown = f"{render.escape(key['id'])} ({render.escape(key['name'])})"
    print(f"gateway key {shown} for {render.escape(models)}:")
    print(render.escape(key["key"]))
    print("This key will not be shown again: keep it now (only its hash is stored).")
    print(f"Send it as the API key to the gateway at {render.escape(gateway_url(client.base_url))}")
    return 0


def _list(client: ApiClient, args: argparse.Namespace) -> int:
    items = client.paginate("/v1/gateway/keys")
    if args.json:
        render.as_json(items)
        return 0
    rows = [
        (
            k["id"],
            k["name"],
            ",".join(k["models"]) if k.get("models") else "(all)",
            k.get("rpm"),
            k.get("tpm"),
            k.get("expires_at"),
            render.ago(k.get("created_at")),
            render.ago(k.get("last_used_at")),
            k.get("user_id"),
        )
        for k in items
    ]
    columns = ["id", "name", "models", "rpm", "tpm", "expires", "created", "last used", "user"]
    render.table(rows, columns)
    return 0


def _revoke(client: ApiClient, args: argparse.Namespace) -> int:
    # Quoted whole: an id is one path segment, never a way to another route.
    client.delete(f"/v1/gateway/keys/{quote(args.id, safe='')}")
    if args.json:
        render.as_json({"id": args.id, "revoked": True})
    else:
        print(f"gateway key {render.escape(args.id)} revoked")
    return 0


def _keys(client: ApiClient, args: argparse.Namespace) -> int:
    if args.keys_command == "create":
        return _create(client, args)
    if args.keys_command in ("list", "ls"):
        return _list(client, args)
    return _revoke(client, args)


COMMANDS = [("keys", "create, list and revoke inference gateway keys", _configure, _keys)]
