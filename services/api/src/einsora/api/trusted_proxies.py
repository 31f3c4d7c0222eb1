"""Whose `X-Forwarded-For` the api believes (issue 34, N5).

The client's address decides the sign-in throttle's count per address, so it must be the
connection's own unless the connection came from a proxy the operator named: anyone else's
`X-Forwarded-For` (or `X-Forwarded-Proto`) is a claim about itself that nothing checks. uvicorn's
own proxy headers middleware applies the rule (the right-most address that is not a trusted
proxy is the client); this module only turns the setting into its list, refusing at start-up an
entry that is not an address or a network. uvicorn's default, which believes anyone connecting
from 127.0.0.1 (a workload on the same machine, say), is never used.
"""

from __future__ import annotations

import ipaddress

from einsora.common.errors import ConfigError
from einsora.common.settings import Settings


def forwarded_allow_ips(settings: Settings) -> list[str]:
    """The addresses and networks of `trusted_proxies`, each written as uvicorn reads it
    (empty: believe no one's headers)."""
    trusted: list[str] = []
    for entry in (e.strip() for e in settings.trusted_proxies.split(",")):
        if not entry:
            continue
        try:
            if "/" in entry:
                trusted.append(str(ipaddress.ip_network(entry, strict=False)))
            else:
                trusted.append(str(ipaddress.ip_address(entry)))
        except ValueError:
            raise ConfigError(
                f"invalid setting: trusted_proxies: {entry!r} is not an address or a network "
                "(e.g. 10.0.0.0/8,127.0.0.1); set EINSORA_TRUSTED_PROXIES to a comma-separated list"
            ) from None
    return trusted
