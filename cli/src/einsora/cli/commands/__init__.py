"""The API client commands of `einsora`: launch, ls, show, events, park, resume, rm, open,
ssh, export, tokens, keys, endpoints, classes, regions, machines, usage, quota, activity,
members, dashboard, login.

Exit codes: 0 success, 1 the API refused (its message and request ID are printed), 2 a usage
error, 3 the API cannot be reached (the URL tried is printed), 141 the output's reader went away
(`einsora ls | head -1`; nothing more is printed).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from einsora.cli.client import ApiClient, ApiRefused, ApiUnreachable
from einsora.cli.commands import (
    activity,
    catalog,
    dashboard,
    endpoints,
    keys,
    machines,
    members,
    ssh,
    tokens,
    usage,
    workloads,
)
from einsora.cli.commands.options import common_options
from einsora.cli.config import resolve
from einsora.cli.pipes import quiet_on_closed_pipe
from einsora.cli.render import escape

Action = Callable[[ApiClient, argparse.Namespace], int]

EXIT_REFUSED = 1
EXIT_UNREACHABLE = 3


def run_action(action: Action) -> Callable[[argparse.Namespace], int]:
    @quiet_on_closed_pipe
    def run(args: argparse.Namespace) -> int:
        config = resolve(args.api)
        client = ApiClient(config.api_url, config.token)
        try:
            return action(client, args)
        except ApiRefused as exc:
            print(
                f"einsora: {escape(exc.message)} ({escape(exc.error)}, HTTP {exc.status})",
                file=sys.stderr,
            )
            if exc.request_id:
                print(f"request ID: {escape(exc.request_id)}", file=sys.stderr)
            if exc.status == 401 and config.token is None:
                print("no token found: set EINSORA_TOKEN or run `einsora login`", file=sys.stderr)
            elif exc.status == 401:
                # Which token was refused matters most when several could have been used.
                print(f"the token came from {escape(config.token_source)}", file=sys.stderr)
            return EXIT_REFUSED
        except ApiUnreachable as exc:
            print(f"einsora: {escape(exc.message)}", file=sys.stderr)
            return EXIT_UNREACHABLE

    return run


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = common_options()
    modules = (
        workloads,
        ssh,
        tokens,
        keys,
        endpoints,
        usage,
        activity,
        members,
        machines,
        catalog,
        dashboard,
    )
    for module in modules:
        for name, help_text, configure, action in module.COMMANDS:
            parser = subparsers.add_parser(name, help=help_text, parents=[parent])
            configure(parser)
            parser.set_defaults(func=run_action(action))
