"""`einsora agent`: run the agent of this machine (or of many sim machines) until a signal;
`einsora agent join URL --token agt_…`: enrol this machine with a control plane, once;
`einsora agent reclaim` / `release`: its owner takes it back from guests, or ends that, on the
machine itself (the running agent acts on it even while the control plane is unreachable).

Ctrl-C or SIGTERM stops the agent, not its workloads: they keep running and the next agent
adopts them. An enrolled machine's agent runs with its stored enrolment; when the control plane
revokes the machine, the agent stops and exits non-zero, saying so.

`einsora agent --help` stays fast: the agent's modules are imported only when a command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from einsora.common import logs
from einsora.common.errors import ConfigError

if TYPE_CHECKING:
    from einsora.agent.service import AgentService, DriverName

STDIN = "-"


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
        "--gpu-inventory",
        type=Path,
        metavar="FILE",
        help="read this machine's GPUs from an NVML snapshot (as `einsora agent gpus --json` "
        "prints) instead of NVML (EINSORA_GPU_INVENTORY)",
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
    engines = parser.add_argument_group("engines (VMs and containers)")
    engines.add_argument(
        "--libvirt-uri",
        default="qemu:///system",
        metavar="URI",
        help="libvirt to run VMs with (default qemu:///system)",
    )
    engines.add_argument("--no-libvirt", action="store_true", help="run no VMs")
    engines.add_argument(
        "--docker-host",
        metavar="URL",
        help="Docker Engine to run containers with (default: $DOCKER_HOST, else its socket)",
    )
    engines.add_argument("--no-docker", action="store_true", help="run no containers")
    engines.add_argument(
        "--vm-dir",
        type=Path,
        default=Path("/var/lib/einsora-vms"),
        metavar="DIR",
        help="where VMs' disks and imported images live (default /var/lib/einsora-vms)",
    )
    engines.add_argument(
        "--vm-images",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a directory VM images (and kernels) may be named from (repeatable)",
    )
    logs.add_arguments(parser)
    parser.set_defaults(func=run)
    commands = parser.add_subparsers(dest="agent_command", metavar="COMMAND")
    _register_join(commands)
    _register_reclaim(commands)
    _register_gpus(commands)


def _register_gpus(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    gpus = subparsers.add_parser(
        "gpus",
        help="what the agent sees of this machine's GPUs: devices, MIG slices, classes",
        description="List this machine's NVIDIA GPUs and MIG slices as the agent reports them, "
        "with the class each serves and how workloads' device nodes are confined. --json "
        "prints the NVML snapshot itself, the format --gpu-inventory reads.",
    )
    gpus.add_argument(
        "--gpu-inventory",
        type=Path,
        metavar="FILE",
        help="an NVML snapshot to show instead of this machine's (EINSORA_GPU_INVENTORY)",
    )
    gpus.add_argument(
        "--catalog", type=Path, metavar="FILE", help="the operator's catalog file (EINSORA_CATALOG)"
    )
    gpus.add_argument("--json", action="store_true", help="print the NVML snapshot as JSON")
    gpus.set_defaults(func=run_gpus)


def run_gpus(args: argparse.Namespace) -> int:
    from einsora.agent import gpus
    from einsora.common.settings import settings_from

    settings = settings_from({"gpu_inventory": args.gpu_inventory, "catalog": args.catalog})
    return gpus.show(settings, as_json=args.json)


def _register_reclaim(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    reclaim = subparsers.add_parser(
        "reclaim",
        help="take this machine back: guests' workloads stop after the grace",
        description="Reclaim this machine from its guests, even while the control plane is "
        "unreachable: the running agent parks other tenants' workloads once the grace has "
        "passed and they have run their minimum runtime, and reports the reclaim when it "
        "can. Again: it stays reclaimed from the first time. `einsora agent release` ends it.",
    )
    reclaim.add_argument(
        "--grace", type=float, default=120.0, metavar="S", help="seconds guests keep (120)"
    )
    reclaim.add_argument(
        "--guest-min-runtime",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds a guest's workload runs at least before it is stopped (600)",
    )
    reclaim.add_argument("--data-dir", type=Path, metavar="DIR", help="the agent's data dir")
    reclaim.set_defaults(func=run_reclaim)
    release = subparsers.add_parser(
        "release",
        help="end this machine's own reclaim: guests may run here again",
        description="End the reclaim made with `einsora agent reclaim` (one made through the "
        "api ends with `einsora machines release`).",
    )
    release.add_argument("--data-dir", type=Path, metavar="DIR", help="the agent's data dir")
    release.set_defaults(func=run_release)


def run_reclaim(args: argparse.Namespace) -> int:
    from einsora.agent import reclaim
    from einsora.common.settings import settings_from

    if args.grace < 0 or args.guest_min_runtime < 0:
        raise ConfigError("the grace and the minimum runtime are seconds, 0 or more")
    settings = settings_from({"data_dir": args.data_dir})
    made = reclaim.reclaim(
        settings.data_dir, grace_s=args.grace, guest_min_runtime_s=args.guest_min_runtime
    )
    print(
        f"this machine is reclaimed since {made.at:%Y-%m-%d %H:%M:%S} UTC: guests' workloads "
        f"stop {made.grace_s:g} s after that, once they have run {made.guest_min_runtime_s:g} s; "
        "`einsora agent release` ends it"
    )
    return 0


def run_release(args: argparse.Namespace) -> int:
    from einsora.agent import reclaim
    from einsora.common.settings import settings_from

    settings = settings_from({"data_dir": args.data_dir})
    if reclaim.release(settings.data_dir):
        print("this machine's own reclaim is released: guests may run here again")
    else:
        print("this machine was not reclaimed here; nothing changed")
    return 0


def _register_join(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "join",
        help="enrol this machine with a control plane (once)",
        description="Exchange a join token (from `einsora machines join-token`) for this "
        "machine's own credential, kept 0600 in the data dir; `einsora agent` then runs with it.",
    )
    parser.add_argument("url", metavar="URL", help="the control plane's api, e.g. https://lab:8080")
    parser.add_argument(
        "--token",
        required=True,
        metavar="agt_…",
        help="the join token; - reads it from stdin (out of the shell's history and ps)",
    )
    parser.add_argument(
        "--fingerprint",
        metavar="sha256:HEX",
        help="pin the api's TLS certificate (as printed with the token) instead of CA trust",
    )
    parser.add_argument(
        "--force", action="store_true", help="join again, replacing this machine's enrolment"
    )
    parser.add_argument("--data-dir", type=Path, metavar="DIR", help="where the enrolment is kept")
    parser.set_defaults(func=run_join)


def run_join(args: argparse.Namespace) -> int:
    from einsora.agent.join import join
    from einsora.common import runloop
    from einsora.common.settings import settings_from

    settings = settings_from({"data_dir": args.data_dir})
    logs.configure_from(settings)
    enrolled = runloop.run(
        join(
            settings.data_dir,
            args.url,
            sys.stdin.readline() if args.token == STDIN else args.token,
            fingerprint=args.fingerprint,
            force=args.force,
        )
    )
    print(
        f"joined {enrolled.api_url} as machine {enrolled.machine_id}: owner "
        f"{enrolled.owner_tenant_id}, region {enrolled.region}, sharing {enrolled.sharing}"
        + (", reached through its tunnel" if enrolled.tunnel is not None else "")
        + "; run `einsora agent` to start it"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    from einsora.agent.engines import EngineOptions
    from einsora.agent.join import load_enrolment
    from einsora.agent.service import AgentService
    from einsora.common import runloop
    from einsora.common.settings import settings_from

    settings = settings_from(
        {
            "nats_url": args.nats,
            "region": args.region,
            "data_dir": args.data_dir,
            "gpu_inventory": args.gpu_inventory,
        }
    )
    logs.configure_from(settings, args.log_level, args.log_format)
    from einsora.common import telemetry

    telemetry.configure("einsora-agent")
    driver: DriverName = args.driver or (
        "sim" if args.sim_inventory is not None or args.sim_machines != 1 else "process"
    )
    # Bus credentials named explicitly (Solo, tests) win over an enrolment.
    enrolment = None
    if settings.nats_credentials_dir is None:
        enrolment = load_enrolment(settings.data_dir)
    if enrolment is not None and args.region is not None and args.region != enrolment.region:
        raise ConfigError(
            f"this machine was enrolled in region {enrolment.region}: its region is the "
            "control plane's to set, so leave --region out"
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
        enrolment=enrolment,
        engines=EngineOptions(
            libvirt=not args.no_libvirt,
            libvirt_uri=args.libvirt_uri,
            docker=not args.no_docker,
            docker_host=args.docker_host,
            vm_dir=args.vm_dir,
            vm_images=tuple(args.vm_images),
        ),
    )
    return runloop.run(_serve(service))


async def _serve(service: AgentService) -> int:
    """Start, say so, run until a signal or until the agent stops for good on its own (its
    machine revoked: that error, and so a non-zero exit), then stop."""
    import asyncio
    import signal

    from einsora.common import runloop

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    from einsora.common.service import start_unless_stopped

    # A start waits out an outage (NATS or the api away) for as long as it lasts: a signal
    # meanwhile stops it there.
    if not await start_unless_stopped(service, stop):
        return 0
    runloop.settle()
    try:
        _announce(service)
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(service.wait_gone())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
    finally:
        await service.stop()
    if service.gone_reason is not None:
        raise service.gone_reason
    return 0


def _announce(service: AgentService) -> None:
    more = len(service.machine_ids) - 1
    enrolled = service.enrolment
    print(
        f"einsora agent: machine {service.machine_id}"
        + (f" (+{more} more)" if more else "")
        + (f" of {enrolled.api_url}" if enrolled is not None else "")
        + f", driver {service.driver_name}; Ctrl-C stops the agent, not its workloads",
        file=sys.stderr,
        flush=True,
    )
