"""`einsora agent`: run the agent of this machine (or of many sim machines) until a signal.

Ctrl-C or SIGTERM stops the agent, not its workloads: they keep running and the next agent
adopts them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from einsora.agent.service import AgentService, DriverName
from einsora.common import logs, runloop
from einsora.common.service import serve_until_signalled
from einsora.common.settings import settings_from


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "agent",
        help="run the agent of this machine",
        description="Run the Einsora agent: report this machine's inventory, watch its desired "
        "state, run its workloads. Stopping the agent leaves its workloads running.",
    )
    parser.add_argument("--nats", metavar="URL", help="NATS server (default: EINSORA_NATS_URL)")
    parser.add_argument(
        "--machine-id", metavar="ID", help="default: made once, kept in the data dir"
    )
    parser.add_argument("--region", help="region of this machine (default: local)")
    parser.add_argument(
        "--driver",
        choices=("sim", "process"),
        help="process (default), or sim when --sim-inventory is given",
    )
    parser.add_argument(
        "--sim-inventory",
        metavar="SPEC",
        help='fake machine for the sim driver, e.g. "4x l40s-48gb, 64 cpu, 512 GiB", '
        "or a file holding such a spec or JSON",
    )
    parser.add_argument(
        "--sim-machines",
        metavar="N",
        type=int,
        default=1,
        help="host N sim machines in this process (ids <machine-id>-0001 …)",
    )
    parser.add_argument(
        "--data-dir", type=Path, metavar="DIR", help="where workloads and records live"
    )
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds between observed-state heartbeats (default 10)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds between SIGTERM and SIGKILL when stopping a workload",
    )
    parser.add_argument(
        "--sim-start-delay",
        type=float,
        default=0.0,
        metavar="S",
        help="seconds a sim workload stays starting",
    )
    parser.add_argument(
        "--sim-fail-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="share (0 to 1) of sim workload starts that fail, for tests of the failure path",
    )
    parser.add_argument(
        "--provision",
        action="store_true",
        help="create the bus's streams and buckets if missing (needs full rights)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(
        {"nats_url": args.nats, "region": args.region, "data_dir": args.data_dir}
    )
    logs.configure(settings.log_level, settings.log_format)
    driver: DriverName = args.driver or (
        "sim" if args.sim_inventory is not None or args.sim_machines != 1 else "process"
    )
    service = AgentService(
        settings,
        machine_id=args.machine_id,
        driver=driver,
        sim_inventory=args.sim_inventory,
        sim_machines=args.sim_machines,
        heartbeat_s=args.heartbeat,
        grace_s=args.grace,
        sim_start_delay_s=args.sim_start_delay,
        sim_fail_rate=args.sim_fail_rate,
        provision_bus=args.provision,
    )
    return runloop.run(serve_until_signalled(service, lambda: _announce(service)))


def _announce(service: AgentService) -> None:
    more = len(service.machine_ids) - 1
    print(
        f"einsora agent: machine {service.machine_id}"
        + (f" (+{more} more)" if more else "")
        + f", driver {service.driver_name}; Ctrl-C stops the agent, not its workloads",
        file=sys.stderr,
        flush=True,
    )
