"""The server's auth section in the accounts layout: static identities plus the auth callout.

Lab's agents join from other machines with a machine credential that the control plane maps to
a short-lived user JWT (the auth callout, `einsora.common.bus.callout`). The server then needs
four accounts: `EINSORA` holds the app (JetStream and the services' static nkey users),
`MACHINES` every machine's session (Solo's own agent, and every agent the callout admits), `AUTH`
holds only the callout itself, and `SYS` the system identity that kicks revoked connections.
Every static nkey is in `auth_users`, so the control plane's own services never depend on the
callout being up; only agents do. Nothing here is secret: the config names public keys only.

Machines are bounded by their account (ADR-0028). It imports from the app account exactly its
machines' keys: direct gets of desired states, puts of observed states and inventories (each a
service, so the answer comes back into `MACHINES`, whatever reply subject a machine names), and
the desired keys' subjects (a stream, for a machine's plain-subscription watch); no consumer API.
So a machine can make the server publish nowhere in the app account but its own keys. And its
`limits` bound each connection's payload and subscriptions, which nats-server enforces for an
account's users; it does not enforce a callout user JWT's `payload`, `subs` or `data` in this
(non-operator) layout, nor a data rate for anyone (checked on nats-server 2.15.1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from einsora.common.bus import names
from einsora.common.bus.identities import (
    Identity,
    Permissions,
    callout_permissions,
    system_permissions,
)

APP_ACCOUNT: Final = "EINSORA"
"""The account of everything Einsora runs on the bus; its JetStream store is `jetstream/EINSORA`."""
AUTH_ACCOUNT: Final = "AUTH"
"""The callout's own account: requests reach it there, and no app subject does."""
SYSTEM_ACCOUNT: Final = "SYS"
"""The server's system account (KICK, server requests)."""
MACHINE_ACCOUNT: Final = "MACHINES"
"""Every machine's session: it reaches the app account only through the imports of its keys."""
MACHINE_MAX_PAYLOAD: Final = 512 * 1024
"""The largest message a machine may publish; the server closes a connection that sends a larger
one. An observed state of 1,000 workloads is about 300 KiB; an inventory is far smaller."""
MACHINE_MAX_SUBSCRIPTIONS: Final = 32
"""Subscriptions per machine connection: an agent holds its inbox's and one per machine it hosts
(a static sim agent hosting many machines gets room for each of them)."""
_SUBSCRIPTION_HEADROOM = 8


def _machine_imports() -> tuple[list[str], list[str]]:
    """What the app account exports to `MACHINES`, and what `MACHINES` imports: each machine's
    direct get of its desired state, its puts, and its desired key's messages."""
    machines = names.MACHINES
    services = [
        f"$JS.API.DIRECT.GET.{machines.stream}.{names.DESIRED_SUBJECTS}",
        f"{machines.subject_prefix}*.observed",
        f"{machines.subject_prefix}*.inventory",
    ]
    streams = [names.DESIRED_SUBJECTS]
    to = f"accounts: [{MACHINE_ACCOUNT}]"
    exports = [f'{{service: "{s}", {to}}}' for s in services]
    exports += [f'{{stream: "{s}", {to}}}' for s in streams]
    imports = [f'{{service: {{account: {APP_ACCOUNT}, subject: "{s}"}}}}' for s in services]
    imports += [f'{{stream: {{account: {APP_ACCOUNT}, subject: "{s}"}}}}' for s in streams]
    return exports, imports


def _user(identity: Identity, permissions: Permissions) -> str:
    return f"{{nkey: {identity.public_key}, permissions: {permissions.to_conf()}}}"


def server_auth_conf(
    users: Mapping[str, tuple[Identity, Permissions]],
    *,
    callout: Identity,
    system: Identity,
    issuer_public_key: str,
) -> str:
    """The `accounts`, `system_account` and `authorization { auth_callout }` sections.

    `users` are the static identities: the services' go to the app account, a machine's (Solo's
    own agent: `Permissions.machine`) to the machines' account; `issuer_public_key` is the
    account nkey (`A…`) whose seed signs the callout's user JWTs.
    """
    if not issuer_public_key.startswith("A"):
        raise ValueError("the callout issuer must be an account public key (A…)")
    services = [(i, p) for i, p in users.values() if not p.machine]
    machines = [(i, p) for i, p in users.values() if p.machine]
    app_users = ",\n      ".join(_user(i, p) for i, p in services)
    machine_users = ",\n      ".join(_user(i, p) for i, p in machines)
    subscriptions = max(
        [MACHINE_MAX_SUBSCRIPTIONS]
        + [len(p.subscribe) + _SUBSCRIPTION_HEADROOM for _, p in machines]
    )
    exports, imports = (",\n      ".join(part) for part in _machine_imports())
    static = [i.public_key for i, _ in users.values()] + [callout.public_key, system.public_key]
    return f"""accounts {{
  {AUTH_ACCOUNT} {{
    users: [
      {_user(callout, callout_permissions())}
    ]
  }}
  {APP_ACCOUNT} {{
    jetstream: enabled
    users: [
      {app_users}
    ]
    exports: [
      {exports}
    ]
  }}
  {MACHINE_ACCOUNT} {{
    limits: {{max_payload: {MACHINE_MAX_PAYLOAD}, max_subscriptions: {subscriptions}}}
    users: [
      {machine_users}
    ]
    imports: [
      {imports}
    ]
  }}
  {SYSTEM_ACCOUNT} {{
    users: [
      {_user(system, system_permissions())}
    ]
  }}
}}
system_account: {SYSTEM_ACCOUNT}
authorization {{
  auth_callout {{
    issuer: {issuer_public_key}
    account: {AUTH_ACCOUNT}
    auth_users: [{", ".join(static)}]
  }}
}}
"""


__all__ = [
    "APP_ACCOUNT",
    "AUTH_ACCOUNT",
    "MACHINE_ACCOUNT",
    "MACHINE_MAX_PAYLOAD",
    "MACHINE_MAX_SUBSCRIPTIONS",
    "SYSTEM_ACCOUNT",
    "server_auth_conf",
]
