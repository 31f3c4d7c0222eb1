"""Workload sites: how `w-<id>.<domain>` is named, linked to and recognised, from Settings.

The api mints access links and the access proxy serves the sites they point at; if the two
built these names separately they could disagree (a link to `https://w-….lab.example` that
the proxy answers only as `http://w-….localhost`). Both build one `SiteConfig` from the same
`Settings`, and so does Solo when it names a site.

Only the canonical host form is recognised: `w-<id>.<domain>` or `w-<id>.<domain>:<port>`,
lowercase, no trailing dot, the domain exactly ours, the id a canonical workload id.
`X-Forwarded-Host` and `Forwarded` come from clients and are never read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from urllib.parse import quote

from einsora.common.ids import is_id
from einsora.common.settings import Settings

ENTER_PATH = "/_einsora/enter"
"""Where a site redeems an access ticket (`?ticket=…`)."""

DASHBOARD_COOKIE = "einsora_session"
"""The dashboard's session cookie over plain HTTP: never forwarded to a workload."""

DASHBOARD_TLS_COOKIE = "__Host-" + DASHBOARD_COOKIE
"""The dashboard's session cookie over TLS. Browsers take a `__Host-` cookie only from a secure
origin, Secure, host-only and for path /, so no other site, not even one under the same parent
domain (a workload's), can set one the dashboard would read."""


def dashboard_cookie(tls: bool) -> str:
    """The name of the dashboard's session cookie, served over TLS or not (browsers refuse a
    `__Host-` cookie without Secure, which plain HTTP cannot have)."""
    return DASHBOARD_TLS_COOKIE if tls else DASHBOARD_COOKIE


@dataclass(frozen=True)
class SiteConfig:
    """How sites are named: `w-<id>.<domain>`, on `port`, over TLS or not."""

    domain: str = "localhost"
    port: int = 8081
    tls: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> SiteConfig:
        return cls(domain=settings.proxy_domain, port=settings.proxy_port, tls=settings.proxy_tls)

    def on_port(self, port: int) -> SiteConfig:
        """The same sites on another port (the one a proxy asked for port 0 was given)."""
        return replace(self, port=port)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def cookie_name(self) -> str:
        """A site's session cookie; `__Host-` (Secure, host-only, path /) when over TLS."""
        return "__Host-einsora-site" if self.tls else "einsora-site"

    @property
    def cookie_secure(self) -> bool:
        return self.tls

    def host_of(self, workload_id: str) -> str:
        default = 443 if self.tls else 80
        suffix = "" if self.port == default else f":{self.port}"
        return f"{workload_id}.{self.domain}{suffix}"

    def origin_of(self, workload_id: str) -> str:
        return f"{self.scheme}://{self.host_of(workload_id)}"

    def enter_url(self, workload_id: str, ticket: str) -> str:
        """The one-time access link for a workload's site."""
        return f"{self.origin_of(workload_id)}{ENTER_PATH}?ticket={quote(ticket, safe='')}"

    def workload_of(self, host: str | None) -> str | None:
        """The workload a `Host` header names, or None if it is not one of our sites."""
        if not host or host != host.strip() or any(c.isupper() for c in host):
            return None
        name, sep, port = host.rpartition(":")
        if sep and port.isdigit() and "]" not in port:
            if int(port) != self.port:
                return None
        else:
            name = host
            if self.port not in (80, 443):
                return None
        label, dot, domain = name.partition(".")
        if not dot or domain != self.domain:
            return None
        return label if is_id(label, "workload") else None
