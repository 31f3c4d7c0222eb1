"""`einsora proxy`: run the access proxy alone (its modules load only when it runs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from einsora.common import logs


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("proxy", help="run the access proxy alone")
    parser.add_argument("--nats", help="NATS URL (default: $EINSORA_NATS_URL)")
    parser.add_argument("--port", type=int, help="port to serve sites on (default 8081)")
    parser.add_argument(
        "--domain", help="sites are w-<id>.<domain> (default: $EINSORA_PROXY_DOMAIN or localhost)"
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        default=None,
        help="sites are served over TLS upstream (default: $EINSORA_PROXY_TLS)",
    )
    parser.add_argument("--data-dir", type=Path)
    logs.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from einsora.common import runloop
    from einsora.common.service import serve_until_signalled
    from einsora.common.settings import settings_from
    from einsora.proxy.service import ProxyService

    # The flags override the same settings the api mints links from, so the two agree.
    overrides = {
        "nats_url": args.nats,
        "proxy_port": args.port,
        "proxy_domain": args.domain,
        "proxy_tls": args.tls,
        "data_dir": args.data_dir,
    }
    settings = settings_from(overrides)
    logs.configure_from(settings, args.log_level, args.log_format)
    from einsora.common import telemetry

    telemetry.configure("einsora-proxy")
    service = ProxyService(settings)
    return runloop.run(serve_until_signalled(service))
