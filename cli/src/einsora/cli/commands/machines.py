"""`einsora machines [list|join-token|enrol-sim|revoke|share|lend|invite|invitations|accept|
uninvite|reclaim|release]`: the machines, enrolling and revoking them (a sim agent's too, for
load tests), sharing them with other tenants or users, saying what Einsora may use of them, and
taking them back."""

from __future__ import annotations

import argparse
import shlex
from typing import Any
from urllib.parse import quote

from einsora.cli import render
from einsora.cli.client import ApiClient
from einsora.cli.commands.options import common_options
from einsora.common.errors import EinsoraError

_SHARING = ("private", "invite-only", "community")


def _path(machine_id: str, *rest: str) -> str:
    return "/".join(["/v1/machines", *(quote(part, safe="") for part in (machine_id, *rest))])


def _configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="machines_command", metavar="ACTION")
    nested = [common_options(nested=True)]
    sub.add_parser("list", aliases=["ls"], help="list the machines (the default)", parents=nested)
    token = sub.add_parser(
        "join-token",
        help="make a token that machines exchange, once, for their own credential",
        parents=nested,
    )
    token.add_argument("--name", default="join")
    token.add_argument("--uses", type=int, default=1, help="how many machines (default 1)")
    token.add_argument(
        "--expires-in-hours", type=float, default=24.0, help="default: 24 hours from now"
    )
    token.add_argument("--region", help="the machines' region (default: this control plane's)")
    token.add_argument("--sharing", choices=_SHARING, default="private")
    token.add_argument(
        "--direct",
        action="store_true",
        help="the machines accept connections from the control plane (default: reached "
        "through the tunnel their agents dial)",
    )
    sim = sub.add_parser(
        "enrol-sim",
        help="enrol the machines a sim agent hosts, for load tests (the operator only)",
        description="Enrol the N machines that `einsora agent --driver sim --machine-id AGENT "
        "--sim-machines N` hosts, with the bus identity `einsora bus-config --sim-agent AGENT "
        "--sim-machines N` made, and print how to start that agent. Sim machines run nothing; "
        "the schedulers place on them only where EINSORA_SIM_MACHINES=true.",
        parents=nested,
    )
    sim.add_argument("--agent", required=True, metavar="ID", help="the sim agent's id (m-sim)")
    sim.add_argument(
        "--count", type=int, default=1, metavar="N", help="how many machines it hosts (1)"
    )
    sim.add_argument("--region", help="the machines' region (default: this control plane's)")
    sim.add_argument("--tenant", help="the tenant that owns them, by name or id (default: yours)")
    sim.add_argument("--sharing", choices=_SHARING, default="private")
    revoke = sub.add_parser(
        "revoke",
        help="revoke a machine: its connection is cut and its workloads fail",
        parents=nested,
    )
    revoke.add_argument("id", help="the machine's id (m-…)")
    share = sub.add_parser(
        "share", help="set who may use a machine besides your tenant", parents=nested
    )
    share.add_argument("id", help="the machine's id (m-…)")
    share.add_argument(
        "--sharing",
        choices=_SHARING,
        help="private: your tenant only; invite-only: also the tenants that accepted your "
        "invitation; community: any tenant",
    )
    share.add_argument(
        "--reclaim-grace",
        type=float,
        metavar="SECONDS",
        help="how long guests keep running after you reclaim it (default 120)",
    )
    share.add_argument(
        "--guest-min-runtime",
        type=float,
        metavar="SECONDS",
        help="the least a guest's workload runs before a reclaim stops it (default 600)",
    )
    lend = sub.add_parser(
        "lend",
        help="say what Einsora may use of a machine (the rest stays yours); guests that no "
        "longer fit are preempted after the grace",
        parents=nested,
    )
    lend.add_argument("id", help="the machine's id (m-…)")
    lend.add_argument("--cpus", type=float, metavar="N", help="cores Einsora may use in total")
    lend.add_argument(
        "--memory-gib", type=float, metavar="GIB", help="memory Einsora may use in total"
    )
    lend.add_argument(
        "--gpus",
        metavar="UUID,…",
        help="the GPUs Einsora may use, by uuid (see einsora machines --json); 'none': no GPU",
    )
    lend.add_argument(
        "--all", action="store_true", help="lend the whole machine again (the default)"
    )
    for action, said in (
        ("reclaim", "take a machine back: guests' workloads are preempted after its grace"),
        ("release", "end a reclaim: guests may be placed on the machine again"),
    ):
        sub.add_parser(action, help=said, parents=nested).add_argument(
            "id", help="the machine's id (m-…)"
        )
    invite = sub.add_parser(
        "invite",
        help="invite a tenant (its admin accepts) or one user (who accepts) to use a machine",
        parents=nested,
    )
    invite.add_argument("id", help="the machine's id (m-…)")
    guest = invite.add_mutually_exclusive_group(required=True)
    guest.add_argument("--tenant", help="the guest tenant's name or id")
    guest.add_argument(
        "--user", help="the guest user's username: their workloads, in any of their tenants"
    )
    invitations = sub.add_parser(
        "invitations",
        help="a machine's invitations; without a machine, those to your tenant",
        parents=nested,
    )
    invitations.add_argument("id", nargs="?", help="the machine's id (m-…)")
    accept = sub.add_parser(
        "accept",
        help="accept an invitation to use another tenant's machine (a tenant admin, or the "
        "invited user)",
        parents=nested,
    )
    accept.add_argument("invitation", help="the invitation's id (mi-…)")
    uninvite = sub.add_parser(
        "uninvite",
        help="revoke a machine invitation: the tenant or user is no guest any more",
        parents=nested,
    )
    uninvite.add_argument("id", help="the machine's id (m-…)")
    uninvite.add_argument("invitation", help="the invitation's id (mi-…)")


def _list(client: ApiClient, args: argparse.Namespace) -> int:
    items = client.paginate("/v1/machines")
    if args.json:
        render.as_json(items)
        return 0
    rows = []
    for m in items:
        inv: dict[str, Any] = m.get("inventory") or {}
        enrolment: dict[str, Any] = m.get("enrolment") or {}
        gpus = inv.get("gpus") or []
        rows.append(
            (
                m.get("id"),
                m.get("region") or "-",
                enrolment.get("owner_tenant_name")
                or enrolment.get("owner_tenant_id")
                or ("(not enrolled)" if not enrolment else "-"),
                enrolment.get("sharing") or "-",
                _lent_summary(enrolment) if enrolment else "-",
                inv.get("cpus"),
                f"{(inv.get('memory_mib') or 0) // 1024} GiB" if inv else "-",
                f"{len(gpus)}x {gpus[0]['model']}" if gpus else "-",
                render.ago(m.get("heartbeat_at")),
                render.ago(enrolment.get("enrolled_at")),
                render.ago(enrolment.get("revoked_at")) if enrolment.get("revoked_at") else "-",
            )
        )
    render.table(
        rows,
        [
            "machine",
            "region",
            "owner",
            "sharing",
            "lent",
            "cpus",
            "memory",
            "gpus",
            "heartbeat",
            "enrolled",
            "revoked",
        ],
    )
    return 0


def _join_token(client: ApiClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {
        "name": args.name,
        "uses": args.uses,
        "expires_in_hours": args.expires_in_hours,
        "sharing": args.sharing,
        "tunnel": not args.direct,
    }
    if args.region:
        body["region"] = args.region
    made = client.post("/v1/machines/join-tokens", body)
    if args.json:
        render.as_json(made)
        return 0
    uses = "once" if made["uses"] == 1 else f"by up to {made['uses']} machines"
    print(
        f"join token {render.escape(made['id'])} for region {render.escape(made['region'])}, "
        f"{render.escape(made['sharing'])}, usable {uses} until {made['expires_at']}:"
    )
    print(render.escape(made["token"]))
    print("It will not be shown again (only its hash is stored). On the machine, run:")
    print(f"  {render.escape(made['join_command'])}")
    if made.get("tls_fingerprint"):
        print(f"The control plane's TLS certificate: {render.escape(made['tls_fingerprint'])}")
    return 0


def _enrol_sim(client: ApiClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"agent": args.agent, "count": args.count, "sharing": args.sharing}
    if args.region:
        body["region"] = args.region
    if args.tenant:
        body["tenant"] = args.tenant
    made = client.post("/v1/machines/sim-agents", body)
    if args.json:
        render.as_json(made)
        return 0
    ids: list[str] = made["machine_ids"]
    shown = render.escape(ids[0]) + ("" if len(ids) == 1 else f" … {render.escape(ids[-1])}")
    print(
        f"{len(ids)} sim machines of {render.escape(made['agent'])} ({shown}) enrolled in region "
        f"{render.escape(made['region'])} ({made['enrolled']} new), owned by tenant "
        f"{render.escape(made['owner_tenant_id'])}, {render.escape(made['sharing'])}."
    )
    if not made["bus_identity_found"]:
        print(
            f"The api finds no bus identity for {render.escape(made['agent'])}: run einsora "
            f"bus-config --sim-agent {render.escape(made['agent'])} --sim-machines {len(ids)} "
            "(and reload the NATS servers) first."
        )
    if not made["sim_machines_allowed"]:
        print(
            "This api runs without EINSORA_SIM_MACHINES=true: the schedulers place on sim "
            "machines only where it is set."
        )
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(made["agent_env"].items()))
    print("Start the agent that hosts them (its bus identity is in the credentials dir):")
    print(f"  {render.escape(env)} {render.escape(made['agent_command'])}")
    return 0


def _revoke(client: ApiClient, args: argparse.Namespace) -> int:
    client.delete(_path(args.id))
    if args.json:
        render.as_json({"id": args.id, "revoked": True})
    else:
        print(f"machine {render.escape(args.id)} revoked: its connection is cut")
    return 0


_COUNTS_WHEN_SHARED = (
    "An accepted invitation counts while the machine's sharing is not private "
    "(einsora machines share {machine} --sharing invite-only)."
)


def _share(client: ApiClient, args: argparse.Namespace) -> int:
    given = {
        "sharing": args.sharing,
        "reclaim_grace_s": args.reclaim_grace,
        "guest_min_runtime_s": args.guest_min_runtime,
    }
    body = {k: v for k, v in given.items() if v is not None}
    machine = client.request("PATCH", _path(args.id), body)
    if args.json:
        render.as_json(machine)
        return 0
    enrolment = machine.get("enrolment") or {}
    sharing = enrolment.get("sharing", args.sharing)
    print(
        f"machine {render.escape(machine['id'])} is now {render.escape(str(sharing))}; guests "
        f"keep {enrolment.get('reclaim_grace_s')} s after a reclaim and run at least "
        f"{enrolment.get('guest_min_runtime_s')} s"
    )
    return 0


def _lend_body(args: argparse.Namespace) -> dict[str, Any] | None:
    """The PATCH's `lend` from the flags (None: the whole machine)."""
    if args.all:
        if args.cpus is not None or args.memory_gib is not None or args.gpus is not None:
            raise EinsoraError("--all lends the whole machine: give it alone")
        return None
    lend: dict[str, Any] = {}
    if args.cpus is not None:
        lend["cpus"] = args.cpus
    if args.memory_gib is not None:
        lend["memory_mib"] = round(args.memory_gib * 1024)
    if args.gpus is not None:
        named = [g.strip() for g in args.gpus.split(",") if g.strip()]
        lend["gpus"] = [] if named == ["none"] else named
    if not lend:
        raise EinsoraError("say what to lend: --cpus, --memory-gib, --gpus, or --all")
    return lend


def _lent_summary(enrolment: dict[str, Any]) -> str:
    """What a machine lends Einsora, in a few words: `all`, or what is usable."""
    if not enrolment.get("lend"):
        return "all"
    usable: dict[str, Any] = enrolment.get("usable") or {}
    lend: dict[str, Any] = enrolment["lend"]
    cpus = usable.get("cpus", lend.get("cpus"))
    memory = usable.get("memory_mib", lend.get("memory_mib"))
    gpus = usable.get("gpus", lend.get("gpus"))
    parts = [
        "all cores" if cpus is None else f"{cpus:g} cores",
        "all memory" if memory is None else f"{memory / 1024:g} GiB",
        "every GPU" if gpus is None else f"{len(gpus)} GPU" + ("" if len(gpus) == 1 else "s"),
    ]
    return ", ".join(parts)


def _lend(client: ApiClient, args: argparse.Namespace) -> int:
    machine = client.request("PATCH", _path(args.id), {"lend": _lend_body(args)})
    if args.json:
        render.as_json(machine)
        return 0
    enrolment = machine.get("enrolment") or {}
    print(
        f"machine {render.escape(machine['id'])} lends Einsora: "
        f"{render.escape(_lent_summary(enrolment))}"
    )
    if enrolment.get("lend"):
        print(
            "Guests' workloads that no longer fit are preempted after its grace "
            f"({enrolment.get('reclaim_grace_s')} s, once they have run "
            f"{enrolment.get('guest_min_runtime_s')} s); yours keep running."
        )
    return 0


def _reclaim(client: ApiClient, args: argparse.Namespace) -> int:
    machine = client.post(_path(args.id, "reclaim"))
    if args.json:
        render.as_json(machine)
        return 0
    enrolment = machine.get("enrolment") or {}
    print(
        f"machine {render.escape(machine['id'])} reclaimed: guests' workloads are preempted "
        f"{enrolment.get('reclaim_grace_s')} s after {enrolment.get('reclaimed_at')} (once they "
        f"have run {enrolment.get('guest_min_runtime_s')} s); no guest is placed there until "
        f"einsora machines release {render.escape(machine['id'])}"
    )
    return 0


def _release(client: ApiClient, args: argparse.Namespace) -> int:
    machine = client.post(_path(args.id, "release"))
    if args.json:
        render.as_json(machine)
    else:
        print(f"machine {render.escape(machine['id'])} released: guests may use it again")
    return 0


def _guest_of(invitation: dict[str, Any]) -> str:
    """Whom an invitation names: a tenant, or `user <name>`."""
    if invitation.get("tenant_name"):
        return str(invitation["tenant_name"])
    return f"user {invitation.get('username')}"


def _invite(client: ApiClient, args: argparse.Namespace) -> int:
    body = {"tenant": args.tenant} if args.tenant is not None else {"user": args.user}
    made = client.post(_path(args.id, "invitations"), body)
    if args.json:
        render.as_json(made)
        return 0
    shown, guest = render.escape(made["id"]), render.escape(_guest_of(made))
    print(f"invited {guest} to use {render.escape(made['machine_id'])} (invitation {shown})")
    if made.get("accepted_at"):
        print(f"{guest} accepted it already.")
    elif made.get("tenant_name"):
        print(f"An admin of {guest} accepts it with: einsora machines accept {shown}")
    else:
        print(f"{guest} accepts it with: einsora machines accept {shown}")
    print(_COUNTS_WHEN_SHARED.format(machine=render.escape(made["machine_id"])))
    return 0


def _state(invitation: dict[str, Any]) -> str:
    if invitation.get("revoked_at"):
        return "revoked " + render.ago(invitation["revoked_at"])
    if invitation.get("accepted_at"):
        return "accepted " + render.ago(invitation["accepted_at"])
    return "open"


def _invitations(client: ApiClient, args: argparse.Namespace) -> int:
    owner_side = args.id is not None
    path = _path(args.id, "invitations") if owner_side else "/v1/machine-invitations"
    items = client.paginate(path)
    if args.json:
        render.as_json(items)
        return 0
    rows = [
        (
            i["id"],
            i["machine_id"],
            _guest_of(i) if owner_side else i["owner_tenant_name"],
            _state(i),
            render.ago(i.get("created_at")),
        )
        for i in items
    ]
    render.table(
        rows, ["invitation", "machine", "guest" if owner_side else "owner", "state", "made"]
    )
    return 0


def _accept(client: ApiClient, args: argparse.Namespace) -> int:
    accepted = client.post(f"/v1/machine-invitations/{quote(args.invitation, safe='')}/accept")
    if args.json:
        render.as_json(accepted)
        return 0
    machine = render.escape(accepted["machine_id"])
    print(
        f"{render.escape(_guest_of(accepted))} is now a guest of {machine}, owned by "
        f"{render.escape(accepted['owner_tenant_name'])}, who can see the data of what runs there"
    )
    print("It counts while the machine's sharing is not private, which its owner sets.")
    return 0


def _uninvite(client: ApiClient, args: argparse.Namespace) -> int:
    client.delete(_path(args.id, "invitations", args.invitation))
    if args.json:
        render.as_json({"id": args.invitation, "machine_id": args.id, "revoked": True})
    else:
        shown = render.escape(args.invitation)
        print(f"invitation {shown} revoked: that tenant is no guest of {render.escape(args.id)}")
    return 0


_ACTIONS = {
    "join-token": _join_token,
    "enrol-sim": _enrol_sim,
    "revoke": _revoke,
    "share": _share,
    "lend": _lend,
    "invite": _invite,
    "invitations": _invitations,
    "accept": _accept,
    "uninvite": _uninvite,
    "reclaim": _reclaim,
    "release": _release,
}


def _machines(client: ApiClient, args: argparse.Namespace) -> int:
    action = _ACTIONS.get(getattr(args, "machines_command", None) or "", _list)
    return action(client, args)


COMMANDS = [
    (
        "machines",
        "list machines, make join tokens, revoke machines, share them with other tenants",
        _configure,
        _machines,
    )
]
