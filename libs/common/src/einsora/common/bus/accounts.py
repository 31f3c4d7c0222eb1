"""The server's auth section in the accounts layout: static identities plus the auth callout.

Lab's agents join from other machines with a machine credential that the control plane maps to
a short-lived user JWT (the auth callout, `einsora.common.bus.callout`). The server then needs
three accounts: `EINSORA` holds the app (JetStream, the services' static nkey users, and every
agent the callout admits), `AUTH` holds only the callout itself, and `SYS` the system identity
that kicks revoked connections. Every static nkey is in `auth_users`, so the control plane's own
services never depend on the callout being up; only agents do. Nothing here is secret: the config
names public keys only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

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

    `users` are the static identities of the app account (services, and Solo's own agent);
    `issuer_public_key` is the account nkey (`A…`) whose seed signs the callout's user JWTs.
    """
    if not issuer_public_key.startswith("A"):
        raise ValueError("the callout issuer must be an account public key (A…)")
    app_users = ",\n      ".join(_user(i, p) for i, p in users.values())
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


__all__ = ["APP_ACCOUNT", "AUTH_ACCOUNT", "SYSTEM_ACCOUNT", "server_auth_conf"]
