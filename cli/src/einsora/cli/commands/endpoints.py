"""`einsora endpoints list|launch`: model endpoints, the workloads the gateway routes to.

An endpoint is a workload of kind `endpoint`; its name is the model name clients send to the
gateway. One with several replicas is one workload per replica, the further ones pointing at
the first (`replica_of`): `list` shows one row per endpoint, its replicas counted together.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from einsora.cli import render
from einsora.cli.client import ApiClient
from einsora.cli.commands.keys import gateway_url
from einsora.cli.commands.options import common_options
from einsora.common.vocab import EndpointRuntime, WorkloadKind, WorkloadState

DEFAULT_CPU_CLASS = "cpu-2c-4g"
"""The class of a llama.cpp or command endpoint launched without `--class`."""
_NEEDS_A_CLASS = {
    EndpointRuntime.vllm: "an NVIDIA GPU class, e.g. l4-24gb",
    EndpointRuntime.mlx: "an Apple Silicon class, e.g. apple-silicon-32gb",
}


def _configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="endpoints_command", metavar="ACTION", required=True)
    nested = [common_options(nested=True)]
    sub.add_parser("list", aliases=["ls"], help="list endpoints", parents=nested)
    launch = sub.add_parser("launch", help="launch an endpoint", parents=nested)
    launch.add_argument("name", help="the model name clients send to the gateway")
    launch.add_argument(
        "--model", help="a local path or URI of a .gguf or .safetensors file (or a directory)"
    )
    launch.add_argument("--runtime", required=True, choices=[r.value for r in EndpointRuntime])
    launch.add_argument("--replicas", type=int, help="copies to run (default: 1)")
    launch.add_argument(
        "--class",
        dest="class_name",
        metavar="CLASS",
        help=f"what it runs on (default for llamacpp and command: {DEFAULT_CPU_CLASS}; "
        "`einsora classes` lists them)",
    )
    launch.add_argument("--region")
    launch.add_argument("--context-length", type=int)
    launch.add_argument(
        "--arg",
        dest="args",
        action="append",
        metavar="A",
        help="an argument for the runtime; repeat it, and write --arg=--flag for one that "
        "starts with a dash",
    )
    launch.add_argument(
        "--command",
        nargs=argparse.REMAINDER,
        metavar="...",
        help="the command runtime's server and its arguments, to the end of the line, with "
        '"$PORT" (quoted) where its port goes; put it last',
    )


def _launch(client: ApiClient, args: argparse.Namespace) -> int:
    runtime = EndpointRuntime(args.runtime)
    class_name = args.class_name
    if class_name is None:
        if runtime in _NEEDS_A_CLASS:
            print(
                f"einsora: --class is needed for the {runtime.value} runtime: "
                f"{_NEEDS_A_CLASS[runtime]} (`einsora classes` lists them)",
                file=sys.stderr,
            )
            return 2
        class_name = DEFAULT_CPU_CLASS
    if args.command is not None and not args.command:
        print("einsora: --command needs the server to run after it", file=sys.stderr)
        return 2
    spec: dict[str, Any] = {"runtime": runtime.value}
    for field in ("model", "replicas", "context_length", "args", "command"):
        if getattr(args, field) is not None:
            spec[field] = getattr(args, field)
    body: dict[str, Any] = {
        "kind": WorkloadKind.endpoint.value,
        "name": args.name,
        "class": class_name,
        "spec": spec,
    }
    if args.region is not None:
        body["region"] = args.region
    workload = client.post("/v1/workloads", body)
    if args.json:
        render.as_json(workload)
        return 0
    shown, name = render.escape(workload["id"]), render.escape(workload["name"])
    state = render.escape(workload["state"])
    print(f"endpoint {name} ({shown}) is {state}; follow it with: einsora events {shown} -f")
    gateway = render.escape(gateway_url(client.base_url))
    print(
        f"Once it runs, call it through the gateway at {gateway} with model {name} and an esk_ "
        "key (einsora keys create NAME)"
    )
    return 0


def _list(client: ApiClient, args: argparse.Namespace) -> int:
    items = client.paginate("/v1/workloads", kind=WorkloadKind.endpoint.value, limit=200)
    if args.json:
        render.as_json(items)
        return 0
    replicas: dict[str, list[Any]] = {}
    for w in items:
        replicas.setdefault(w.get("replica_of") or w["id"], []).append(w)
    rows = []
    for w in items:
        if w.get("replica_of"):
            continue  # counted with the endpoint it is a replica of
        group = replicas[w["id"]]
        spec = w.get("spec") or {}
        running = sum(1 for r in group if r["state"] == WorkloadState.running)
        machines = [(r.get("placement") or {}).get("machine") for r in group]
        rows.append(
            (
                w.get("name"),
                w["id"],
                w["state"],
                spec.get("runtime"),
                f"{running}/{spec.get('replicas', len(group))}",  # running of wanted
                ",".join(m for m in machines if m) or None,
            )
        )
    render.table(rows, ["model", "id", "state", "runtime", "replicas", "placement"])
    return 0


def _endpoints(client: ApiClient, args: argparse.Namespace) -> int:
    if args.endpoints_command == "launch":
        return _launch(client, args)
    return _list(client, args)


COMMANDS = [("endpoints", "list and launch model endpoints", _configure, _endpoints)]
