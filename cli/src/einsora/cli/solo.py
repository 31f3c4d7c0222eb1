"""`einsora solo`: Einsora on one machine, in one process.

It starts an embedded nats-server (JetStream under `<data dir>/nats`), provisions the bus, and
runs every service that exists beside an agent for this machine. They still talk only over NATS.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from einsora.common import logs
from einsora.common.bus import connect, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.settings import Settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("solo", help="run Einsora Solo on this machine")
    parser.add_argument("--data-dir", type=Path, help="where everything is kept")
    parser.add_argument("--nats-port", type=int, help="port of the embedded NATS server")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    overrides = {
        k: v
        for k, v in {"data_dir": args.data_dir, "nats_port": args.nats_port}.items()
        if v is not None
    }
    settings = Settings(**overrides)
    logs.configure(settings.log_level, settings.log_format)
    return asyncio.run(_serve(settings))


async def _serve(settings: Settings) -> int:
    nats = EmbeddedNats(settings.data_dir / "nats", port=settings.nats_port)
    nats.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        nc = await connect(nats.url, name="einsora-solo")
        await provision(nc.jetstream())
        print(f"Einsora Solo: NATS at {nats.url}, data in {settings.data_dir}", file=sys.stderr)
        print("Press Ctrl-C to stop.", file=sys.stderr)
        await stop.wait()
        await nc.close()
    finally:
        nats.stop()
    return 0
