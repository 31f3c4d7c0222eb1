"""Workload commands: launch, ls, show, events, park, resume, rm, open, export."""

from __future__ import annotations

import argparse
import json
import sys
import time
import webbrowser
from pathlib import Path
from typing import Any

from einsora.cli import render
from einsora.cli.client import ApiClient
from einsora.cli.export import build_export
from einsora.common.vocab import WorkloadKind, WorkloadState

SETTLED = {
    WorkloadState.running,
    WorkloadState.failed,
    WorkloadState.removed,
    WorkloadState.parked,
    WorkloadState.preempted,
}
"""States `launch --wait` stops following at: where nothing more happens by itself."""
POLL_S = 0.5


def _launch_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=[k.value for k in WorkloadKind])
    parser.add_argument("--class", dest="class_name", required=True, help="e.g. cpu-1c-2g")
    parser.add_argument("--name")
    parser.add_argument("--region")
    parser.add_argument("--count", type=int)
    parser.add_argument("--spec", help="JSON object with the workload's spec")
    parser.add_argument("--wait", action="store_true", help="follow the timeline until running")


def _launch(client: ApiClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"kind": args.kind, "class": args.class_name}
    for key in ("name", "region", "count"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.spec:
        try:
            body["spec"] = json.loads(args.spec)
        except ValueError as exc:
            print(f"einsora: --spec is not valid JSON: {exc}", file=sys.stderr)
            return 2
    workload = client.post("/v1/workloads", body)
    if not args.wait:
        _print_workload(workload, args.json)
        return 0
    final = _follow_until_settled(client, workload["id"], quiet=args.json)
    if args.json:
        render.as_json(final)
        return 0 if final["state"] == WorkloadState.running else 1
    if final["state"] == WorkloadState.running:
        shown = render.escape(final["id"])
        print(f"{shown} is running. Open it with: einsora open {shown}")
    host = (final.get("placement") or {}).get("host")
    if host:  # another tenant's machine: its owner can see the workload's data
        print(f"Note: {render.escape(host['note'])}")
    return 0 if final["state"] == WorkloadState.running else 1


def _follow_until_settled(client: ApiClient, workload_id: str, *, quiet: bool) -> Any:
    """A live status line from the timeline until the workload settles."""
    seen = 0
    started = time.monotonic()
    tty = sys.stderr.isatty()
    while True:
        events = client.paginate(f"/v1/workloads/{workload_id}/events")
        for entry in events[seen:]:
            if not quiet:
                said = f"{render.escape(entry['state'])}: {render.escape(entry['reason'])}"
                line = f"[{time.monotonic() - started:5.1f}s] {said}"
                sys.stderr.write(("\r\033[K" if tty else "") + line + ("" if tty else "\n"))
                sys.stderr.flush()
        seen = len(events)
        workload = client.get(f"/v1/workloads/{workload_id}")
        if workload["state"] in SETTLED:
            if not quiet and tty:
                sys.stderr.write("\n")
            return workload
        time.sleep(POLL_S)


def _ls_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", choices=[s.value for s in WorkloadState])
    parser.add_argument("--kind", choices=[k.value for k in WorkloadKind])


def _ls(client: ApiClient, args: argparse.Namespace) -> int:
    items = client.paginate("/v1/workloads", state=args.state, kind=args.kind, limit=200)
    if args.json:
        render.as_json(items)
        return 0
    rows = [
        (
            w["id"],
            w.get("name"),
            w["kind"],
            w["class"],
            w["state"],
            (w.get("placement") or {}).get("machine"),
            render.ago(w.get("created_at")),
        )
        for w in items
    ]
    render.table(rows, ["id", "name", "kind", "class", "state", "machine", "created"])
    return 0


def _id_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="the workload's id (w-…)")


def _print_workload(workload: Any, as_json: bool) -> None:
    if as_json:
        render.as_json(workload)
        return
    placement = workload.get("placement") or {}
    for label, value in (
        ("id", workload["id"]),
        ("name", workload.get("name")),
        ("kind", workload["kind"]),
        ("class", workload["class"]),
        ("region", workload.get("region")),
        ("state", workload["state"]),
        ("machine", placement.get("machine")),
        ("host", (placement.get("host") or {}).get("note")),
        ("created", workload.get("created_at")),
    ):
        print(f"{label:8} {render.escape(value) if value is not None else '-'}")


def _show(client: ApiClient, args: argparse.Namespace) -> int:
    _print_workload(client.get(f"/v1/workloads/{args.id}"), args.json)
    return 0


def _events_args(parser: argparse.ArgumentParser) -> None:
    _id_arg(parser)
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new entries")


def _events(client: ApiClient, args: argparse.Namespace) -> int:
    seen = 0
    while True:
        events = client.paginate(f"/v1/workloads/{args.id}/events")
        for entry in events[seen:]:
            if args.json:
                print(json.dumps(entry), flush=True)
            else:
                at, kind, state, reason = (
                    render.escape(entry[key]) for key in ("at", "kind", "state", "reason")
                )
                print(f"{at}  {kind:10}  {state:9}  {reason}", flush=True)
        seen = len(events)
        if not args.follow:
            return 0
        time.sleep(POLL_S)


def _action(verb: str) -> Any:
    def run(client: ApiClient, args: argparse.Namespace) -> int:
        workload = client.post(f"/v1/workloads/{args.id}/{verb}")
        _print_workload(workload, args.json)
        return 0

    return run


def _rm(client: ApiClient, args: argparse.Namespace) -> int:
    workload = client.delete(f"/v1/workloads/{args.id}")
    if workload is not None:
        _print_workload(workload, args.json)
    return 0


def _open(client: ApiClient, args: argparse.Namespace) -> int:
    access = client.post(f"/v1/workloads/{args.id}/access")
    if args.json:
        render.as_json(access)
        return 0
    url = access["url"]
    opened = False
    try:
        opened = webbrowser.open(url)
    except webbrowser.Error:
        opened = False
    if opened:
        print(f"opened {render.escape(args.id)} in your browser (the link works once, for 60 s)")
    else:
        print(f"open this link within 60 s (it works once):\n{render.escape(url)}")
    return 0


def _export_args(parser: argparse.ArgumentParser) -> None:
    _id_arg(parser)
    parser.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")


def _export(client: ApiClient, args: argparse.Namespace) -> int:
    document = build_export(client, args.id)
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    if args.output:
        args.output.write_text(text)
        wrote = render.escape(args.output)
        print(f"wrote {wrote} ({len(document['redactions'])} redactions)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


COMMANDS = [
    ("launch", "launch a workload", _launch_args, _launch),
    ("ls", "list workloads", _ls_args, _ls),
    ("show", "show one workload", _id_arg, _show),
    ("events", "show a workload's timeline", _events_args, _events),
    ("park", "park a workload (release its GPUs, keep its disk)", _id_arg, _action("park")),
    ("resume", "resume a parked, failed or preempted workload", _id_arg, _action("resume")),
    ("rm", "remove a workload", _id_arg, _rm),
    ("open", "open a running workload's web UI in the browser", _id_arg, _open),
    ("export", "export a workload's inputs, timeline and usage as JSON", _export_args, _export),
]
