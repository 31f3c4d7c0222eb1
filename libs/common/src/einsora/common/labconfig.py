"""`einsora bus-config`: the bus identities of a Lab cell, and its NATS servers' auth section.

A Lab cell (deploy/compose, deploy/helm) runs its own NATS cluster, so the auth section Solo
writes for its embedded server must be written once for the cluster's nodes: every service's
nkey identity with its permission template, the auth callout (agents that join from elsewhere),
the system identity that kicks revoked machines, and optionally sim agents' static identities.
Seeds are made (0600) in `--credentials-dir` on first use and kept; the section written to
`--out` names public keys only, so every node may read it. Run again, it writes the same file.

A sim agent (`--sim-agent ID`, repeatable, each hosting `--sim-machines N`) is a machine identity
granted its machines' keys only, in the machines' account: `einsora agent --driver sim
--machine-id ID --sim-machines N` connects with it. Its machines take work once the operator
enrols them (`einsora machines enrol-sim`, issue 35) in a cell that allows sim machines.

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
        action="append",
        default=[],
        metavar="ID",
        help="also a static identity for a sim agent ID hosting --sim-machines machines "
        "(repeatable: one per agent)",
    )
    parser.add_argument(
        "--sim-machines",
        type=int,
        default=1,
        metavar="N",
        help="machines each sim agent hosts (ids ID-0001 …; default 1: the machine ID)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from einsora.common.bus import accounts, identities, names
    from einsora.common.errors import ConfigError

    credentials: Path = args.credentials_dir
    users = {
        name: (
            identities.ensure_identity(credentials, name),
            identities.service_permissions(name),
        )
        for name in identities.SERVICES
    }
    for agent in args.sim_agent:
        if not names.is_subject_token(agent, 100) or agent in identities.CONTROL_PLANE:
            raise ConfigError(
                f"--sim-agent {agent!r} is not a machine id: use 1 to 100 letters, digits, - "
                "or _, and none of the control plane's own identities"
            )
        if args.sim_machines < 1:
            raise ConfigError(f"--sim-machines must be at least 1, not {args.sim_machines}")
        # The names `einsora agent --machine-id ID --sim-machines N` gives its machines.
        users[agent] = (
            identities.ensure_identity(credentials, agent),
            identities.agent_permissions(
                agent, identities.sim_machine_ids(agent, args.sim_machines)
            ),
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
