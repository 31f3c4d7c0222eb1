"""The bus's auth callout, served by the api: a machine's credential becomes its bus session.

Where the server runs the callout (Lab; Solo with `--listen`), an agent connects with its
`agk_…` credential; the server asks us on `$SYS.REQ.USER.AUTH`, and we answer with a user JWT
whose permissions are that machine's allow-list (`identities.agent_permissions`) and which
expires after `SESSION_S` (the agent reconnects, and is asked about again). A revoked or unknown
credential is refused. Revocation also cuts the live connections at once (`kick`), over a
system-account connection. The callout runs when the credentials dir holds the issuer's seed
(Solo writes it with the server's config); without it, there is nothing to serve.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from pathlib import Path

from nats.aio.client import Client as NATS

from einsora.api.services.machines import by_credential
from einsora.api.store import Store
from einsora.common.bus import connect_as, identities
from einsora.common.bus.callout import AuthCallout, Grant

log = logging.getLogger("einsora.api.bus_auth")

SESSION_S = 600.0
"""How long a machine's bus session lives before it must authenticate again: the backstop
behind revocation's kick, short enough that a leaked session does not outlive it long."""


class MachineBusAuth:
    """Answers the server's auth requests for machines, and cuts revoked machines off."""

    def __init__(self, store: Store, *, session_s: float = SESSION_S) -> None:
        self._store = store
        self._session_s = session_s
        self._callout: AuthCallout | None = None
        self._callout_nc: NATS | None = None
        self._system_nc: NATS | None = None

    @staticmethod
    def wanted(credentials_dir: Path | None) -> bool:
        """Whether the server runs the callout (the issuer's seed is among the credentials)."""
        if credentials_dir is None:
            return False
        return identities.seed_path(credentials_dir, identities.ISSUER).exists()

    async def start(
        self, url: str, credentials_dir: Path, tls: ssl.SSLContext | None = None
    ) -> None:
        issuer = identities.ensure_issuer(credentials_dir)
        self._callout = AuthCallout(issuer, self._authorize)
        self._callout_nc = await connect_as(url, identities.CALLOUT, credentials_dir, tls=tls)
        self._system_nc = await connect_as(url, identities.SYSTEM, credentials_dir, tls=tls)
        await self._callout.start(self._callout_nc)
        log.info("bus auth callout serving machines' credentials")

    async def stop(self) -> None:
        if self._callout is not None:
            await self._callout.stop()
            self._callout = None
        for nc in (self._callout_nc, self._system_nc):
            if nc is not None:
                with contextlib.suppress(Exception):
                    await nc.close()
        self._callout_nc = self._system_nc = None

    async def _authorize(self, token: str) -> Grant | None:
        enrolment = await by_credential(self._store, token)
        if enrolment is None or enrolment.revoked:
            return None
        machine_id = enrolment.machine_id
        return Grant(
            identity=machine_id,
            permissions=identities.agent_permissions(machine_id),
            expires_s=self._session_s,
        )

    async def kick(self, machine_id: str) -> int:
        """Close every live bus connection of the machine; how many there were."""
        if self._callout is None or self._system_nc is None:
            return 0
        return await self._callout.kick(machine_id, self._system_nc)
