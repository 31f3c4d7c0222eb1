"""`einsora bus-config`: the bus identities of a Lab cell, and its NATS servers' auth section.

A Lab cell (deploy/compose, deploy/helm) runs its own NATS cluster, so the auth section Solo
writes for its embedded server must be written once for the cluster's nodes: every service's
nkey identity with its permission template, the auth callout (agents that join from elsewhere),
the system identity that kicks revoked machines, and optionally a sim agent's static identity.
Seeds are made (0600) in `--credentials-dir` on first use and kept; the section written to
`--out` names public keys only, so every node may read it. Run again, it writes the same file.

Only the standard library is imported at the top: `einsora --help` must stay fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bus-config",
        help="make a Lab cell's bus identities and its NATS servers' auth section",
        description="Make (once) the nkey seed of every bus identity in CREDENTIALS_DIR and "
        "write the NATS servers' accounts and auth-callout section to OUT (public keys only).",
    )
    parser.add_argument("--credentials-dir", type=Path, required=True, metavar="DIR")
    parser.add_argument("--out", type=Path, required=True, metavar="FILE")
    parser.add_argument(
        "--sim-agent",
        metavar="MACHINE",
        help="also a static identity for a sim agent hosting MACHINE (and --sim-machines)",
    )
    parser.add_argument("--sim-machines", type=int, default=1, metavar="N")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from einsora.common.bus import accounts, identities

    credentials: Path = args.credentials_dir
    users = {
        name: (
            identities.ensure_identity(credentials, name),
            identities.service_permissions(name),
        )
        for name in identities.SERVICES
    }
    if args.sim_agent:
        # The names `einsora agent --machine-id M --sim-machines N` gives its machines.
        count = max(args.sim_machines, 1)
        width = max(4, len(str(count)))
        machines = (
            [args.sim_agent]
            if count == 1
            else [f"{args.sim_agent}-{i:0{width}d}" for i in range(1, count + 1)]
        )
        users[args.sim_agent] = (
            identities.ensure_identity(credentials, args.sim_agent),
            identities.agent_permissions(args.sim_agent, machines),
        )
    text = accounts.server_auth_conf(
        users,
        callout=identities.ensure_identity(credentials, identities.CALLOUT),
        system=identities.ensure_identity(credentials, identities.SYSTEM),
        issuer_public_key=identities.ensure_issuer(credentials).public_key,
    )
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    partial.write_text("# Written by `einsora bus-config`: public keys only.\n" + text)
    os.chmod(partial, 0o644)
    os.replace(partial, out)
    print(f"bus identities in {credentials}; NATS auth section in {out}", file=sys.stderr)
    return 0
