"""`einsora api`: run the control API alone, until SIGINT or SIGTERM.

The server stack (the app, SQLAlchemy, uvicorn) loads only when the command runs, so
`einsora --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from einsora.common import logs
from einsora.common.cli import main_of

if TYPE_CHECKING:
    from einsora.common.catalog import Catalog
    from einsora.common.settings import Settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "api",
        help="run the control API (REST /v1, the store, the outbox relay, the timeline)",
        description="Run Einsora's control API alone. Flags override EINSORA_* settings.",
    )
    parser.add_argument("--nats", metavar="URL", help="NATS server URL (EINSORA_NATS_URL)")
    parser.add_argument(
        "--database-url", metavar="URL", help="SQLAlchemy URL of the store (EINSORA_DATABASE_URL)"
    )
    parser.add_argument("--port", type=int, help="HTTP port (EINSORA_API_PORT; 0: any free port)")
    parser.add_argument("--host", help="address to listen on (EINSORA_BIND_HOST)")
    parser.add_argument("--data-dir", type=Path, help="data directory (EINSORA_DATA_DIR)")
    parser.add_argument("--region", help="default region of new workloads (EINSORA_REGION)")
    parser.add_argument(
        "--catalog",
        type=Path,
        metavar="FILE",
        help="the operator's catalog file: extra, replaced and hidden classes (EINSORA_CATALOG)",
    )
    logs.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from einsora.common import runloop
    from einsora.common.catalog import Catalog
    from einsora.common.settings import settings_from

    settings = settings_from(
        {
            "nats_url": args.nats,
            "database_url": args.database_url,
            "api_port": args.port,
            "bind_host": args.host,
            "data_dir": args.data_dir,
            "region": args.region,
            "catalog": args.catalog,
        }
    )
    logs.configure_from(settings, args.log_level, args.log_format)
    from einsora.common import telemetry

    telemetry.configure("einsora-api")
    catalog = Catalog.load(settings.catalog)
    return runloop.run(_serve(settings, catalog))


async def _serve(settings: Settings, catalog: Catalog) -> int:
    from einsora.api.service import ApiService  # the server stack loads only for this command
    from einsora.common.service import serve_until_signalled

    service = ApiService(settings, catalog=catalog)

    def announce() -> None:
        print(f"einsora api listening on {service.url}", file=sys.stderr, flush=True)
        if service.owner_token_created and sys.stderr.isatty():
            print(
                f"owner token (shown once; also in {service.owner_token_path}): "
                f"{service.owner_token_created}",
                file=sys.stderr,
                flush=True,
            )
        elif service.owner_token_created:
            # Not a terminal: a log would keep the token. Its file is readable by us alone.
            print(
                f"owner token made and saved in {service.owner_token_path} (printed only to a "
                "terminal)",
                file=sys.stderr,
                flush=True,
            )

    return await serve_until_signalled(service, announce)


def main(argv: list[str] | None = None) -> int:
    """`python -m einsora.api.command ARGS` = `einsora api ARGS`, without the other commands."""
    return main_of("api", register, argv)


if __name__ == "__main__":
    sys.exit(main())
