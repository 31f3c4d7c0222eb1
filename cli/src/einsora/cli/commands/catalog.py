"""`einsora classes`, `regions`, `login`: what there is, where, and who I am."""

from __future__ import annotations

import argparse
import getpass
import os

from einsora.cli import render
from einsora.cli.client import ApiClient
from einsora.cli.config import save_login


def _classes(client: ApiClient, args: argparse.Namespace) -> int:
    items = client.paginate("/v1/classes")
    if args.json:
        render.as_json(items)
        return 0
    rows = [
        (c["name"], c.get("accelerator"), c.get("memory_gib"), ",".join(c.get("regions") or []))
        for c in items
    ]
    render.table(rows, ["class", "accelerator", "memory GiB", "regions"])
    return 0


def _regions(client: ApiClient, args: argparse.Namespace) -> int:
    items = client.paginate("/v1/regions")
    if args.json:
        render.as_json(items)
        return 0
    rows = [
        (
            r["name"],
            (r.get("scheduler") or {}).get("state"),
            r.get("machines"),
            " ".join(f"{c}:{n}" for c, n in sorted((r.get("free") or {}).items())) or "-",
            r.get("queued"),
            (r.get("scheduler") or {}).get("reason") or "",
        )
        for r in items
    ]
    render.table(rows, ["region", "scheduler", "machines", "free", "queued", "why"])
    return 0


def _login(client: ApiClient, args: argparse.Namespace) -> int:
    token = os.environ.get("EINSORA_TOKEN") or getpass.getpass("API token (tsk_…): ").strip()
    checked = ApiClient(client.base_url, token)
    me = checked.get("/v1/me")
    path = save_login(client.base_url, token)
    if args.json:
        render.as_json(me)
    else:
        user, tenant = render.escape(me["user"]["username"]), render.escape(me["tenant"]["name"])
        where = render.escape(client.base_url)
        print(f"logged in to {where} as {user} ({tenant}); saved in {render.escape(path)}")
    return 0


def _none(_: argparse.ArgumentParser) -> None:
    return None


COMMANDS = [
    ("classes", "list the GPU and CPU classes on offer", _none, _classes),
    (
        "regions",
        "list the regions, each with its scheduler's liveness and free capacity",
        _none,
        _regions,
    ),
    ("login", "check an API token and save it for later commands", _none, _login),
]
