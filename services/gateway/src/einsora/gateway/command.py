"""`einsora gateway`: run the inference gateway alone (its modules load only when it runs)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from einsora.common import logs

if TYPE_CHECKING:
    from einsora.gateway.service import GatewayService


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("gateway", help="run the inference gateway alone")
    parser.add_argument("--nats", help="NATS URL (default: $EINSORA_NATS_URL)")
    parser.add_argument("--port", type=int, help="port to serve the OpenAI API on (default 8082)")
    parser.add_argument("--data-dir", type=Path)
    logs.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from einsora.common import runloop
    from einsora.common.service import serve_until_signalled
    from einsora.common.settings import settings_from
    from einsora.gateway.service import GatewayService

    overrides = {"nats_url": args.nats, "gateway_port": args.port, "data_dir": args.data_dir}
    settings = settings_from(overrides)
    logs.configure_from(settings, args.log_level, args.log_format)
    from einsora.common import telemetry

    telemetry.configure("einsora-gateway")
    service = GatewayService(settings)
    return runloop.run(serve_until_signalled(service, on_started=lambda: _ready(service)))


def _ready(service: GatewayService) -> None:
    # One line on stdout, so whoever started it (a supervisor, a test) learns the port.
    print(f"gateway listening on port {service.port}", flush=True)
