"""`einsora activity`: the tenant's activity log (its admins and the operator).

It prints `GET /v1/activity` as a table, newest first (or the entries themselves with
`--json`), following the pages up to `--limit` entries. `--export jsonl|csv -o FILE` writes the
api's own export (`GET /v1/activity/export`) to FILE as it streams, the whole of the filtered
log, never held in memory; `-o -` writes it to standard output.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, BinaryIO

from einsora.cli import render
from einsora.cli.client import ApiClient, ApiUnreachable, refusal
from einsora.cli.config import resolve

PAGE = 200
"""Entries asked for per page (the api's most)."""


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {n}")
    return n


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from", dest="start", metavar="TIME", help="ISO 8601, e.g. 2026-05-01 (included)"
    )
    parser.add_argument("--to", dest="end", metavar="TIME", help="ISO 8601 (not included)")
    parser.add_argument("--user", help="only this user's actions (their name or id)")
    parser.add_argument(
        "--action", help="only this action (workload.create), or a noun's (workload.*)"
    )
    parser.add_argument("--tenant", help="this tenant's log (its id; the operator)")
    parser.add_argument(
        "--limit", type=_positive, default=50, help="entries shown at most (default 50)"
    )
    parser.add_argument(
        "--export", choices=("jsonl", "csv"), help="write the whole filtered log to -o FILE"
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="where --export writes (-: stdout)")


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "from": args.start,
        "to": args.end,
        "user": args.user,
        "action": args.action,
        "tenant": args.tenant,
    }


def _activity(client: ApiClient, args: argparse.Namespace) -> int:
    if args.export is not None or args.output is not None:
        return _export(client, args)
    items: list[Any] = []
    cursor = None
    while len(items) < args.limit:
        page = client.get(
            "/v1/activity",
            **_filters(args),
            limit=min(PAGE, args.limit - len(items)),
            cursor=cursor,
        )
        items.extend(page["items"])
        cursor = page.get("next_cursor")
        if not cursor:
            break
    if cursor:
        print(
            f"einsora: only the newest {len(items)} entries are shown; use --limit, a "
            "narrower --from/--to, or --export for all of them",
            file=sys.stderr,
        )
    if args.json:
        render.as_json(items)
        return 0
    rows = [
        (
            e["at"],
            e.get("username") or e.get("user_id"),
            e["action"],
            e.get("target"),
            f"{e['outcome']} {e['status']}",
            e["request_id"],
        )
        for e in items
    ]
    render.table(rows, ["at", "user", "action", "target", "outcome", "request id"])
    return 0


def _export(client: ApiClient, args: argparse.Namespace) -> int:
    if args.export is None or args.output is None:
        print("einsora: --export FORMAT and -o FILE go together", file=sys.stderr)
        return 2
    query = {k: v for k, v in _filters(args).items() if v is not None}
    query["format"] = args.export
    url = client.base_url + "/v1/activity/export?" + urllib.parse.urlencode(query)
    req = urllib.request.Request(url)  # noqa: S310 (the api's URL, http or https)
    token = resolve(args.api).token  # the token `client` was made with, read the same way
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310
            if args.output == "-":
                _copy(resp, sys.stdout.buffer)
            else:
                with open(args.output, "wb") as out:
                    _copy(resp, out)
    except urllib.error.HTTPError as exc:
        raise refusal(exc) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ApiUnreachable(
            f"cannot reach the Einsora API at {client.base_url} ({reason}); is it running? "
            "Set --api or EINSORA_API to its URL."
        ) from None
    if args.output != "-":
        print(f"activity written to {render.escape(args.output)}", file=sys.stderr)
    return 0


def _copy(source: BinaryIO, out: BinaryIO) -> None:
    shutil.copyfileobj(source, out, 64 * 1024)


COMMANDS = [
    (
        "activity",
        "show or export the tenant's activity log: who did what, when, and how it ended",
        _configure,
        _activity,
    ),
]
