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
from einsora.cli.export import fetch_export
from einsora.cli.follow import SNAPSHOT, workload_events_path
from einsora.common.vocab import WorkloadKind, WorkloadState

SETTLED: frozenset[str] = frozenset(
    {
        WorkloadState.running,
        WorkloadState.failed,
        WorkloadState.removed,
        WorkloadState.parked,
        WorkloadState.preempted,
    }
)
"""States `launch --wait` stops following at: where nothing more happens by itself."""


def _launch_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=[k.value for k in WorkloadKind])
    parser.add_argument("--class", dest="class_name", required=True, help="e.g. cpu-1c-2g")
    parser.add_argument("--name")
    parser.add_argument("--region")
    parser.add_argument("--count", type=int)
    parser.add_argument("--spec", help="JSON object with the workload's spec")
    parser.add_argument(
        "--fallback",
        action="append",
        metavar="KIND:VALUE",
        help="a substitute tried, in the order given, when what it asks for has no room: "
        "class:a100-80gb, class:cpu-8c-32g, machine:m-…, region:office, and for endpoints "
        "model:<another endpoint> and replicas:N (repeat the flag for a chain)",
    )
    parser.add_argument(
        "--fallback-after",
        type=float,
        metavar="SECONDS",
        help="how long it waits queued at one step before the next is tried (default 0)",
    )
    parser.add_argument(
        "--wait", action="store_true", help="follow the workload until it runs (exit 0) or fails"
    )


FALLBACK_KINDS = ("class", "machine", "region", "model", "replicas")


def fallback_step(text: str) -> dict[str, Any]:
    """`class:a100-80gb` → `{"class": "a100-80gb"}`; ValueError saying what is wrong."""
    kind, sep, value = text.partition(":")
    if not sep or kind not in FALLBACK_KINDS or not value:
        raise ValueError(f"{text!r} is not KIND:VALUE with KIND one of {', '.join(FALLBACK_KINDS)}")
    if kind == "replicas":
        if not value.isdigit():
            raise ValueError(f"{text!r}: replicas takes a whole number")
        return {kind: int(value)}
    return {kind: value}


def _launch(client: ApiClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"kind": args.kind, "class": args.class_name}
    for key in ("name", "region", "count"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    try:
        if args.fallback:
            body["fallback"] = [fallback_step(step) for step in args.fallback]
    except ValueError as exc:
        print(f"einsora: --fallback {exc}", file=sys.stderr)
        return 2
    if args.fallback_after is not None:
        body["fallback_after_s"] = args.fallback_after
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
    final, reason = _follow_until(client, workload["id"], SETTLED, quiet=args.json)
    if not args.json and final["state"] == WorkloadState.running:
        shown = render.escape(final["id"])
        print(f"{shown} is running. Open it with: einsora open {shown}")
        host = (final.get("placement") or {}).get("host")
        if host:  # another tenant's machine: its owner can see the workload's data
            print(f"Note: {render.escape(host['note'])}")
    return _settled(final, reason, WorkloadState.running, args.json)


def _follow_until(
    client: ApiClient, workload_id: str, until: frozenset[str], *, quiet: bool
) -> tuple[Any, str]:
    """Follow the workload's event stream, a line for each change with its reason as it
    happens, until it is in one of `until`: the workload then, and the reason of its last
    change. The state is the stream's (the scheduler's word), which the api's store may take
    a moment to catch up with."""
    started = time.monotonic()
    tty = sys.stderr.isatty()
    state, reason = "", ""
    for event in client.events(workload_events_path(workload_id)):
        changes = event.data["workloads"] if event.name == SNAPSHOT else [event.data]
        for change in changes:
            state, reason = change["state"], change["reason"]
            if not quiet:
                said = f"{render.escape(state)}: {render.escape(reason)}"
                line = f"[{time.monotonic() - started:5.1f}s] {said}"
                sys.stderr.write(("\r\033[K" if tty else "") + line + ("" if tty else "\n"))
                sys.stderr.flush()
        if state in until:
            break
    if not quiet and tty:
        sys.stderr.write("\n")
    workload = client.get(f"/v1/workloads/{workload_id}")
    workload["state"] = state
    return workload, reason


def _settled(workload: Any, reason: str, wanted: str, as_json: bool) -> int:
    """The exit code of a `--wait`: 0 when the workload reached `wanted`, else 1, saying
    where it ended and why."""
    if as_json:
        render.as_json(workload)
    if workload["state"] == wanted:
        return 0
    print(
        f"einsora: {render.escape(workload['id'])} is {render.escape(workload['state'])}, "
        f"not {wanted}: {render.escape(reason)}",
        file=sys.stderr,
    )
    return 1


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
        ("fallback", _chain(workload)),
        ("state", workload["state"]),
        ("placed", _placed(placement)),
        ("machine", placement.get("machine")),
        ("host", (placement.get("host") or {}).get("note")),
        ("created", workload.get("created_at")),
    ):
        print(f"{label:8} {render.escape(value) if value is not None else '-'}")


def _chain(workload: Any) -> str | None:
    """`a100-80gb → region office (after 60 s each)`, or None without a chain."""
    steps = workload.get("fallback") or []
    if not steps:
        return None
    said = " → ".join(
        ", ".join(f"{k} {v}" if k != "class" else str(v) for k, v in step.items()) for step in steps
    )
    after = workload.get("fallback_after_s") or 0
    return f"{said} (after {after:g} s each)" if after else said


def _placed(placement: Any) -> str | None:
    """Where it runs, as what: `a100-80gb in office`."""
    if not placement:
        return None
    return f"{placement.get('placed_class')} in {placement.get('region')}"


def _show(client: ApiClient, args: argparse.Namespace) -> int:
    _print_workload(client.get(f"/v1/workloads/{args.id}"), args.json)
    return 0


def _events_args(parser: argparse.ArgumentParser) -> None:
    _id_arg(parser)
    parser.add_argument(
        "--follow", "-f", action="store_true", help="keep printing changes as they happen"
    )


def _events(client: ApiClient, args: argparse.Namespace) -> int:
    if not args.follow:
        for entry in client.paginate(f"/v1/workloads/{args.id}/events"):
            _print_entry(entry, args.json)
        return 0
    # The stream first: its snapshot marks what the store holds, so the timeline read after
    # it has everything before the changes that follow. A change the timeline read caught
    # already is not printed twice.
    stream = client.events(workload_events_path(args.id))
    next(stream)  # the snapshot
    printed = set()
    for entry in client.paginate(f"/v1/workloads/{args.id}/events"):
        _print_entry(entry, args.json)
        printed.add(_entry_key(entry))
    for event in stream:
        if event.name == SNAPSHOT:
            continue  # the stream started over (its resume point was gone): nothing new
        if _entry_key(event.data) not in printed:
            _print_entry(event.data, args.json)
    return 0


def _entry_key(entry: Any) -> tuple[str, str, str, str]:
    """What makes a timeline entry and a stream's change the same event."""
    at = entry["at"].replace("Z", "+00:00")
    return (at, entry["kind"], entry["state"], entry["reason"])


def _print_entry(entry: Any, as_json: bool) -> None:
    if as_json:
        shown = {k: entry.get(k) for k in ("at", "kind", "state", "reason", "request_id")}
        print(json.dumps(shown), flush=True)
        return
    at, kind, state, reason = (
        render.escape(entry[key]) for key in ("at", "kind", "state", "reason")
    )
    print(f"{at}  {kind:10}  {state:9}  {reason}", flush=True)


_WAITS = {
    "park": (WorkloadState.parked, frozenset({WorkloadState.parked, *SETTLED})),
    "resume": (WorkloadState.running, SETTLED),
    "rm": (WorkloadState.removed, frozenset({WorkloadState.removed, WorkloadState.failed})),
}
"""What each action's `--wait` waits for: the state it wants, and where it stops."""


def _wait_args(parser: argparse.ArgumentParser) -> None:
    _id_arg(parser)
    parser.add_argument(
        "--wait", action="store_true", help="follow the workload until the action is done"
    )


def _action(verb: str) -> Any:
    def run(client: ApiClient, args: argparse.Namespace) -> int:
        if verb == "rm":
            workload = client.delete(f"/v1/workloads/{args.id}")
        else:
            workload = client.post(f"/v1/workloads/{args.id}/{verb}")
        if not args.wait:
            if workload is not None:
                _print_workload(workload, args.json)
            return 0
        wanted, until = _WAITS[verb]
        final, reason = _follow_until(client, args.id, until, quiet=args.json)
        if not args.json and final["state"] == wanted:
            print(f"{render.escape(args.id)} is {wanted}")
        return _settled(final, reason, wanted, args.json)

    return run


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
    document = fetch_export(client, args.id)
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
    ("park", "park a workload (release its GPUs, keep its disk)", _wait_args, _action("park")),
    ("resume", "resume a parked, failed or preempted workload", _wait_args, _action("resume")),
    ("rm", "remove a workload", _wait_args, _action("rm")),
    ("open", "open a running workload's web UI in the browser", _id_arg, _open),
    ("export", "export a workload's inputs, timeline and usage as JSON", _export_args, _export),
]
