"""`einsora scheduler --nats URL --region office`: run one region's scheduler until stopped.

Flags override `EINSORA_*` settings; SIGINT or SIGTERM stop it cleanly. A SIGKILL is safe too:
the next start picks up where the store says it was (ADR-0004). The scheduler's modules load
only when the command runs, so `einsora --help` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from einsora.common import logs


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "scheduler",
        help="run the scheduler of one region",
        description="Admit, place and queue the workloads of one region, and reconcile its "
        "machines. Flags override the EINSORA_* settings.",
    )
    parser.add_argument("--nats", metavar="URL", help="NATS server (EINSORA_NATS_URL)")
    parser.add_argument(
        "--region",
        help="the region (cell) to serve: its intents only, its machines only; one scheduler "
        "per region (EINSORA_REGION; default local)",
    )
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="the scheduler's store (EINSORA_DATABASE_URL; default SQLite in the data dir)",
    )
    parser.add_argument("--data-dir", type=Path, help="EINSORA_DATA_DIR")
    parser.add_argument(
        "--catalog",
        type=Path,
        metavar="FILE",
        help="the operator's catalog file, the api's own (EINSORA_CATALOG): the classes it places",
    )
    parser.add_argument(
        "--suspect-after",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="a machine silent this long is suspect (default 30)",
    )
    parser.add_argument(
        "--lost-after",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="a machine silent this long is lost and its workloads fail (default 120)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=256,
        metavar="N",
        help="intents fetched and decided together, in one transaction (default 256)",
    )
    parser.add_argument(
        "--ack-wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long intents fetched by a scheduler that died wait before redelivery "
        "(default 30)",
    )
    logs.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from einsora.common import runloop
    from einsora.common.service import serve_until_signalled
    from einsora.common.settings import settings_from
    from einsora.scheduler.service import SchedulerService

    settings = settings_from(
        {
            "nats_url": args.nats,
            "region": args.region,
            "database_url": args.database_url,
            "data_dir": args.data_dir,
            "catalog": args.catalog,
        }
    )
    logs.configure_from(settings, args.log_level, args.log_format)
    from einsora.common import telemetry

    telemetry.configure("einsora-scheduler")
    service = SchedulerService(
        settings,
        suspect_after_s=args.suspect_after,
        lost_after_s=args.lost_after,
        batch=args.batch,
        ack_wait_s=args.ack_wait,
    )
    return runloop.run(serve_until_signalled(service))
