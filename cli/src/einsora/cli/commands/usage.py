"""`einsora usage` and `einsora quota show|set`: what was used, and what a tenant may use.

`usage` prints `GET /v1/usage` as a table (or the answer itself with `--json`): the caller sees
what the api lets them see (their own share, the whole tenant for its admin, every tenant for
the operator). `quota set` changes only the parts it is given: it reads the quota, changes
those parts and puts the whole of it back (the api's PUT replaces the quota).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any
from urllib.parse import quote

from einsora.cli import render
from einsora.cli.client import ApiClient
from einsora.cli.commands.options import common_options
from einsora.common.ids import is_id

GROUPS = ("tenant", "user", "class", "workload", "endpoint", "region", "day")
NONE = "none"
"""What clears a part of a quota on the command line (`--max-gpus-total none`)."""


def _count(value: str) -> int | None:
    if value.lower() == NONE:
        return None
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number or {NONE}, got {value!r}"
        ) from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {n}")
    return n


def _hours(value: str) -> float | None:
    if value.lower() == NONE:
        return None
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of hours or {NONE}, got {value!r}"
        ) from None
    if not 0 <= x < float("inf"):
        raise argparse.ArgumentTypeError(f"expected 0 or more hours, got {value!r}")
    return x


def _class_count(value: str) -> tuple[str, int | None]:
    name, sep, count = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(
            f"expected CLASS=N (or CLASS={NONE}), e.g. l40s-48gb=4; got {value!r}"
        )
    return name, _count(count)


def _configure_usage(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from",
        dest="start",
        metavar="TIME",
        help="ISO 8601, e.g. 2026-05-01 (default: 7 days ago)",
    )
    parser.add_argument("--to", dest="end", metavar="TIME", help="ISO 8601 (default: now)")
    parser.add_argument("--group-by", choices=GROUPS, default="tenant")
    parser.add_argument("--tenant", help="only this tenant's usage (its id; the operator)")


def _usage(client: ApiClient, args: argparse.Namespace) -> int:
    report = client.get(
        "/v1/usage",
        **{"from": args.start, "to": args.end, "group_by": args.group_by},
        tenant=args.tenant,
    )
    if args.json:
        render.as_json(report)
        return 0
    print(
        f"usage by {render.escape(report['group_by'])} from {render.escape(report['from'])} "
        f"to {render.escape(report['to'])}"
    )
    rows = [
        (
            i["group"],
            f"{i['gpu_hours']:.2f}",
            f"{i['cpu_core_hours']:.2f}",
            i["prompt_tokens"],
            i["completion_tokens"],
        )
        for i in report["items"]
    ]
    headers = [args.group_by, "gpu-hours", "cpu-core-hours", "prompt tokens", "completion tokens"]
    render.table(rows, headers)
    if report.get("truncated"):
        print(
            f"einsora: only the first {len(rows)} groups are shown; ask for a shorter window "
            "or a coarser --group-by",
            file=sys.stderr,
        )
    return 0


def _configure_quota(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="quota_command", metavar="ACTION", required=True)
    nested = [common_options(nested=True)]
    show = sub.add_parser("show", help="a tenant's quota and what it uses now", parents=nested)
    show.add_argument("tenant", help="the tenant's id or name")
    put = sub.add_parser(
        "set", help="change parts of a tenant's quota (the operator only)", parents=nested
    )
    put.add_argument("tenant", help="the tenant's id or name")
    put.add_argument(
        "--max-gpus",
        type=_class_count,
        action="append",
        default=[],
        metavar="CLASS=N",
        help=f"GPUs of a class held at once; repeat it for several; CLASS={NONE}: no limit",
    )
    # SUPPRESS: a part not given is left out of the namespace, told apart from `none`.
    put.add_argument(
        "--max-gpus-total",
        type=_count,
        default=argparse.SUPPRESS,
        metavar="N",
        help=f"GPUs held at once in all, or {NONE}",
    )
    put.add_argument(
        "--gpu-hours-per-7d",
        type=_hours,
        default=argparse.SUPPRESS,
        metavar="X",
        help=f"GPU-hours in any 7 days, or {NONE}",
    )
    put.add_argument("--clear", action="store_true", help="start from no quota at all")


def _tenant_id(client: ApiClient, tenant: str) -> str:
    """A tenant's id from its id or its name (as `einsora` users know it)."""
    if is_id(tenant, "tenant"):
        return tenant
    for t in client.paginate("/v1/tenants"):
        if t["name"] == tenant:
            return str(t["id"])
    return tenant  # the api answers 404 naming it


def _quota_path(tenant_id: str) -> str:
    # Quoted whole: an id is one path segment, never a way to another route.
    return f"/v1/tenants/{quote(tenant_id, safe='')}/quota"


def _limit(value: object) -> object:
    return "no limit" if value is None else value


def _print_quota(answer: dict[str, Any]) -> None:
    quota, use = answer["quota"], answer["use"]
    print(f"quota of tenant {render.escape(answer['tenant_id'])}")
    classes = sorted(set(quota["max_gpus"]) | set(use["gpus"]))
    rows: list[tuple[object, ...]] = [
        (f"{name} GPUs", _limit(quota["max_gpus"].get(name)), use["gpus"].get(name, 0))
        for name in classes
    ]
    rows.append(("GPUs in all", _limit(quota["max_gpus_total"]), use["gpus_total"]))
    hours = quota["gpu_hours_per_7d"]
    rows.append(("GPU-hours in 7 days", _limit(hours), f"{use['gpu_hours_7d']:.2f}"))
    render.table(rows, ["", "quota", "in use"])


def _quota(client: ApiClient, args: argparse.Namespace) -> int:
    path = _quota_path(_tenant_id(client, args.tenant))
    current = client.get(path)
    if args.quota_command == "set":
        quota = current["quota"]
        body: dict[str, Any] = {
            "max_gpus": {} if args.clear else dict(quota["max_gpus"]),
            "max_gpus_total": None if args.clear else quota["max_gpus_total"],
            "gpu_hours_per_7d": None if args.clear else quota["gpu_hours_per_7d"],
        }
        for name, count in args.max_gpus:
            if count is None:
                body["max_gpus"].pop(name, None)
            else:
                body["max_gpus"][name] = count
        for part in ("max_gpus_total", "gpu_hours_per_7d"):
            if part in vars(args):
                body[part] = getattr(args, part)
        current = client.request("PUT", path, body)
    if args.json:
        render.as_json(current)
    else:
        _print_quota(current)
    return 0


COMMANDS = [
    ("usage", "show usage: GPU-hours, CPU-core-hours and tokens", _configure_usage, _usage),
    ("quota", "show or set a tenant's quota of GPUs and GPU-hours", _configure_quota, _quota),
]
