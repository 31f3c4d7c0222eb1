"""`einsora dashboard`: a one-time link that signs you in to the web dashboard (issue 18).

The link is minted for the caller alone (`POST /v1/sign-in-links`), in the tenant of their
token, and works once, for 15 minutes; its code rides in the URL's fragment, which a browser
never sends to a server. It opens in the browser where one can be opened, else it is printed.
"""

from __future__ import annotations

import argparse
import webbrowser

from einsora.cli import render
from einsora.cli.client import ApiClient


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the link instead of opening it in the browser",
    )
    parser.add_argument(
        "--minutes", type=int, default=15, help="how long the link works (default 15)"
    )


def _dashboard(client: ApiClient, args: argparse.Namespace) -> int:
    made = client.post("/v1/sign-in-links", {"expires_in_minutes": args.minutes})
    url = client.base_url + made["path"]
    if args.json:
        render.as_json({**made, "url": url})
        return 0
    opened = False
    if not args.print_only:
        try:
            opened = webbrowser.open(url)
        except webbrowser.Error:
            opened = False
    if opened:
        print("opened the dashboard in your browser (the sign-in link works once)")
    else:
        print(f"sign in to the dashboard with this link (it works once, for {args.minutes} min):")
        print(render.escape(url))
    return 0


COMMANDS = [
    ("dashboard", "sign in to the web dashboard with a one-time link", _configure, _dashboard)
]
