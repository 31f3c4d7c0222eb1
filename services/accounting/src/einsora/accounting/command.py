"""`einsora accounting --nats URL`: run accounting until stopped.

Flags override `EINSORA_*` settings; SIGINT or SIGTERM stop it cleanly. A SIGKILL is safe too:
every event's effect commits with its id, so the next start carries on from the store.
The service's modules load only when the command runs, so `einsora --help` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from einsora.common import logs


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "accounting",
        help="run usage accounting",
        description="Meter allocations from workload events, record token usage, answer usage "
        "reports and publish each tenant's recent usage for fair share. Flags override the "
        "EINSORA_* settings.",
    )
    parser.add_argument("--nats", metavar="URL", help="NATS server (EINSORA_NATS_URL)")
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="accounting's store (EINSORA_DATABASE_URL; default SQLite in the data dir)",
    )
    parser.add_argument("--data-dir", type=Path, help="EINSORA_DATA_DIR")
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve /metrics on this loopback port (EINSORA_ACCOUNTING_METRICS_PORT)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=256,
        metavar="N",
        help="messages fetched and stored together, in one transaction (default 256)",
    )
    parser.add_argument(
        "--ack-wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long messages fetched by an accounting that died wait before redelivery "
        "(default 30)",
    )
    logs.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from einsora.accounting.service import AccountingService
    from einsora.common import runloop
    from einsora.common.service import serve_until_signalled
    from einsora.common.settings import settings_from

    settings = settings_from(
        {
            "nats_url": args.nats,
            "database_url": args.database_url,
            "data_dir": args.data_dir,
            "accounting_metrics_port": args.metrics_port,
        }
    )
    logs.configure_from(settings, args.log_level, args.log_format)
    from einsora.common import telemetry

    telemetry.configure("einsora-accounting")
    service = AccountingService(settings, batch=args.batch, ack_wait_s=args.ack_wait)
    return runloop.run(serve_until_signalled(service))
