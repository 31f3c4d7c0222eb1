"""`einsora gateway`: run the inference gateway alone."""

from __future__ import annotations

import argparse
from pathlib import Path

from einsora.common import logs, runloop
from einsora.common.service import serve_until_signalled
from einsora.common.settings import settings_from
from einsora.gateway.service import GatewayService


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("gateway", help="run the inference gateway alone")
    parser.add_argument("--nats", help="NATS URL (default: $EINSORA_NATS_URL)")
    parser.add_argument("--port", type=int, help="port to serve the OpenAI API on (default 8082)")
    parser.add_argument("--data-dir", type=Path)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    overrides = {"nats_url": args.nats, "gateway_port": args.port, "data_dir": args.data_dir}
    settings = settings_from(overrides)
    logs.configure(settings.log_level, settings.log_format)
    service = GatewayService(settings)
    return runloop.run(serve_until_signalled(service, on_started=lambda: _ready(service)))


def _ready(service: GatewayService) -> None:
    # One line on stdout, so whoever started it (a supervisor, a test) learns the port.
    print(f"gateway listening on port {service.port}", flush=True)
