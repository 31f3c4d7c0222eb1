"""Which site a request is for, from its `Host` header alone.

Only the canonical form is accepted: `w-<id>.<domain>` or `w-<id>.<domain>:<port>`, lowercase,
no trailing dot, the domain exactly ours, the id a canonical workload id. `X-Forwarded-Host` and
`Forwarded` come from clients and are never read.
"""

from __future__ import annotations

from dataclasses import dataclass

from einsora.common.ids import is_id


@dataclass(frozen=True)
class SiteConfig:
    """How sites are named: `w-<id>.<domain>`, on `port`, over TLS or not."""

    domain: str = "localhost"
    port: int = 8081
    tls: bool = False

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def host_of(self, workload_id: str) -> str:
        default = 443 if self.tls else 80
        suffix = "" if self.port == default else f":{self.port}"
        return f"{workload_id}.{self.domain}{suffix}"

    def origin_of(self, workload_id: str) -> str:
        return f"{self.scheme}://{self.host_of(workload_id)}"

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
