"""`einsora solo`: Einsora on one machine, in one process.

It starts an embedded nats-server (JetStream under `<data dir>/nats`), then every service that
exists (api, scheduler, proxy) and an agent for this machine with the `process` driver. They
still talk only over NATS. A taken port stops start-up with a message naming the port and the
flag to change; Solo never connects to a NATS server it did not start unless
`EINSORA_NATS_URL` asks for one. Stopping leaves workload processes running, and the next
start re-adopts them. The owner token made on the first start is printed only to a terminal;
any other stdout (a log file, a journal) is told where `owner.token` is instead.

On a terminal the greeting is the first thing a person sees: while the parts start, only
warnings and errors are logged (unless `--log-level debug` asks for everything), and after the
greeting the chosen level applies. JSON logs (not a terminal, or `--log-format json`) keep every
line: a machine reading them wants the start-up too. The control plane's modules load only when
the command runs, so `einsora --help` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from einsora.cli.pipes import silence_closed_streams
from einsora.common import logs
from einsora.common.errors import EinsoraError

if TYPE_CHECKING:
    from einsora.cli.controlplane import ControlPlane
    from einsora.common.settings import Settings

STOP_WITHIN_S = 8.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("solo", help="run Einsora Solo on this machine")
    parser.add_argument("--data-dir", type=Path, help="where everything is kept")
    parser.add_argument("--api-port", type=int, help="API and dashboard port (default 8080)")
    parser.add_argument("--proxy-port", type=int, help="access proxy port (default 8081)")
    parser.add_argument("--gateway-port", type=int, help="inference gateway port (default 8082)")
    parser.add_argument("--nats-port", type=int, help="embedded NATS port (default 4222)")
    parser.add_argument(
        "--listen",
        metavar="HOST",
        help="also accept machines that join from elsewhere: NATS, the api and the tunnel "
        "listen on HOST (e.g. 0.0.0.0), agents authenticate with their own credentials "
        "(EINSORA_NATS_LISTEN)",
    )
    parser.add_argument(
        "--catalog",
        type=Path,
        metavar="FILE",
        help="the operator's catalog file: extra, replaced and hidden classes (EINSORA_CATALOG)",
    )
    parser.add_argument(
        "--gpu-inventory",
        type=Path,
        metavar="FILE",
        help="this machine's GPUs from an NVML snapshot instead of NVML, as `einsora agent "
        "gpus --json` prints one (EINSORA_GPU_INVENTORY)",
    )
    logs.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from einsora.cli.controlplane import check_files, check_ports
    from einsora.common import runloop
    from einsora.common.settings import settings_from

    flags = {
        "data_dir": args.data_dir,
        "api_port": args.api_port,
        "proxy_port": args.proxy_port,
        "gateway_port": args.gateway_port,
        "nats_port": args.nats_port,
        "nats_listen": args.listen,
        "catalog": args.catalog,
        "gpu_inventory": args.gpu_inventory,
    }
    try:
        settings = settings_from(flags)
        fmt = logs.configure_from(settings, args.log_level, args.log_format)
        check_files(settings)
        check_ports(settings)
        from einsora.common import telemetry

        telemetry.configure("einsora")
    except EinsoraError as exc:
        print(f"einsora solo: {exc.message}", file=sys.stderr)
        return 1
    return runloop.run(_serve(settings, quiet_start=fmt == "human"))


def quiet_until_greeted(quiet: bool) -> int:
    """Raise the root logger to WARNING for the start-up when `quiet` (human lines on a
    terminal) and the level chosen is not DEBUG; returns the level to restore after the
    greeting."""
    root = logging.getLogger()
    chosen = root.level
    if quiet and chosen > logging.DEBUG:
        root.setLevel(max(chosen, logging.WARNING))
    return chosen


async def _serve(settings: Settings, *, quiet_start: bool = False) -> int:
    import asyncio
    import signal

    from einsora.cli.controlplane import ControlPlane
    from einsora.common import runloop

    chosen_level = quiet_until_greeted(quiet_start)
    plane = ControlPlane(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await plane.start()
    except EinsoraError as exc:
        print(f"einsora solo: {exc.message}", file=sys.stderr)
        await plane.stop()
        return 1
    runloop.settle()
    _greet(plane, settings)
    logging.getLogger().setLevel(chosen_level)
    await stop.wait()
    print("Stopping Einsora Solo...", file=sys.stderr, flush=True)
    running = plane.running_workloads()
    try:
        await asyncio.wait_for(plane.stop(), STOP_WITHIN_S)
    except TimeoutError:
        print("einsora solo: some parts did not stop in time", file=sys.stderr)
    if running:
        print(
            f"{running} workload{'s are' if running != 1 else ' is'} still running; the next "
            "`einsora solo` re-adopts them. To stop one, start Solo and run `einsora park ID` "
            "(`einsora ls --state running` lists them).",
            file=sys.stderr,
        )
    else:
        print("Einsora Solo stopped.", file=sys.stderr)
    return 0


def dashboard_lines(
    url: str, *, built: bool, link_path: str | None, on_terminal: bool
) -> list[str]:
    """What the greeting says of the dashboard: where it is and how to sign in (the first
    start's one-time link, on a terminal only: it is a credential), or how to build it."""
    if not built:
        return [
            "  The web dashboard is not built: `make dashboard` builds it (it needs Node.js 20",
            "  or later), then reload the page. Until then the CLI does everything.",
        ]
    if link_path is not None and on_terminal:
        return [
            f"  Dashboard: {url}/ - sign in with this one-time link (valid for an hour):",
            f"    {url}{link_path}",
        ]
    return [
        f"  Dashboard: {url}/ - sign in with a one-time link from `einsora dashboard`.",
    ]


def _greet(plane: ControlPlane, settings: Settings) -> None:
    from einsora.api.dashboard import DashboardFiles
    from einsora.common.sites import SiteConfig

    url = f"http://127.0.0.1:{plane.api_port}"
    token_file = settings.data_dir / "owner.token"
    # Named as the api names them in access links and the proxy serves them: one SiteConfig.
    sites = SiteConfig.from_settings(plane.settings)
    built = DashboardFiles.from_settings(plane.settings).built
    lines = [
        f"Einsora Solo is running: {url}",
        *dashboard_lines(
            url,
            built=built,
            link_path=plane.owner_sign_in_path,
            on_terminal=sys.stdout.isatty(),
        ),
        f"  API {url}/v1 (OpenAPI at {url}/openapi.json).",
        f"  Workloads answer at their own sites, {sites.origin_of('w-<id>')}",
        "  (EINSORA_PROXY_DOMAIN, EINSORA_PROXY_TLS), opened with `einsora open ID`.",
        f"  Model endpoints answer OpenAI's API at http://127.0.0.1:{plane.settings.gateway_port}"
        "/v1 with a key from `einsora keys create`.",
    ]
    cli = _cli_name()
    token = plane.owner_token_created
    if token and sys.stdout.isatty():
        lines += [
            "",
            "Your owner API token (shown once; it is saved in "
            f"{token_file}, readable only by you):",
            f"  {token}",
            "",
            "Try it:",
            f"  {cli} launch notebook --class cpu-1c-2g --wait",
        ]
    elif token:
        # Not a terminal: this output goes to a file, a journal or another program, where the
        # token would outlive its "shown once". It is in the token file, for its owner only.
        lines += [
            "",
            f"Your owner API token is saved in {token_file}, readable only by you (it is",
            "printed only to a terminal). The CLI on this machine reads it from there.",
            "",
            "Try it:",
            f"  {cli} launch notebook --class cpu-1c-2g --wait",
        ]
    else:
        lines.append(f"Owner token: {token_file}")
    if plane.settings.nats_listen:
        lines += [
            "",
            f"Machines elsewhere can join: NATS at {plane.settings.agent_nats_url}, tunnel port "
            f"{plane.settings.tunnel_port}. Make a token with `{cli} machines join-token`.",
        ]
    lines.append("Press Ctrl-C to stop (workloads keep running).")
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:
        # Whoever read the greeting has gone (`einsora solo | head -3`); Solo keeps serving.
        silence_closed_streams()


def _cli_name() -> str:
    """`einsora` when that is on PATH, else the full path of the one running (`make run` runs
    it from the project's .venv, which is not on the user's PATH)."""
    running = Path(sys.argv[0]).resolve()
    found = shutil.which("einsora")
    if found is not None and Path(found).resolve() == running:
        return "einsora"
    return str(running) if running.name == "einsora" else "einsora"
