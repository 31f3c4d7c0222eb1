"""The accounts layout on a real server: the callout issuer's key, and Solo's data kept across
the switch from the global account to the app account (issue 14)."""

from __future__ import annotations

from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from einsora.common.bus import bind_bucket, identities, names, provision
from einsora.common.bus.accounts import APP_ACCOUNT, server_auth_conf
from einsora.common.bus.identities import Permissions
from einsora.common.embedded_nats import GLOBAL_ACCOUNT, EmbeddedNats
from einsora.common.errors import ConfigError

EVERYTHING = Permissions(publish=(">",), subscribe=(">",))


def test_the_issuer_is_an_account_key_made_once_and_private(tmp_path: Path) -> None:
    issuer = identities.ensure_issuer(tmp_path / "bus")
    assert issuer.seed.startswith("SA")
    assert issuer.public_key.startswith("A")
    path = identities.seed_path(tmp_path / "bus", identities.ISSUER)
    assert path.stat().st_mode & 0o777 == 0o600
    assert identities.ensure_issuer(tmp_path / "bus") == issuer


def test_a_user_seed_is_no_issuer(tmp_path: Path) -> None:
    identities.ensure_identity(tmp_path, identities.ISSUER)  # a user seed (SU…) in its place
    with pytest.raises(ConfigError, match="no account seed"):
        identities.ensure_issuer(tmp_path)
    user = identities.ensure_identity(tmp_path, "someone")
    with pytest.raises(ValueError, match="account public key"):
        server_auth_conf({}, callout=user, system=user, issuer_public_key=user.public_key)


async def _connect(server: EmbeddedNats, seed: str | None) -> NATS:
    return await nats.connect(server.url, nkeys_seed_str=seed, allow_reconnect=False)


async def test_a_solo_store_keeps_its_streams_in_the_accounts_layout(tmp_path: Path) -> None:
    data = tmp_path / "nats"
    # Before: no accounts, so JetStream is the global account's.
    before = EmbeddedNats(data, port=0)
    before.start()
    try:
        nc = await _connect(before, None)
        js = nc.jetstream()
        await provision(js)
        await bind_bucket(js, names.MACHINES).put(names.desired_key("m1"), b'{"generation": 7}')
        await js.publish(names.event_subject("w-1"), b'{"kind": "created"}')
        await nc.close()
    finally:
        before.stop()
    accounts = data / "jetstream" / "jetstream"
    assert (accounts / GLOBAL_ACCOUNT).is_dir()

    credentials = tmp_path / "bus"
    operator = identities.ensure_identity(credentials, "operator")
    conf = server_auth_conf(
        {"operator": (operator, EVERYTHING)},
        callout=identities.ensure_identity(credentials, identities.CALLOUT),
        system=identities.ensure_identity(credentials, identities.SYSTEM),
        issuer_public_key=identities.ensure_issuer(credentials).public_key,
    )
    for _ in range(2):  # the move happens once; the second start finds it done
        after = EmbeddedNats(data, port=0, authorization=conf, app_account=APP_ACCOUNT)
        after.start()
        try:
            nc = await _connect(after, operator.seed)
            js = nc.jetstream()
            entry = await bind_bucket(js, names.MACHINES).get(names.desired_key("m1"))
            assert entry.value == b'{"generation": 7}'
            msg = await js.get_last_msg(names.EVENTS.name, names.event_subject("w-1"))
            assert msg.data == b'{"kind": "created"}'
            report = await provision(js)
            assert report.created == ()
            await nc.close()
        finally:
            after.stop()
        assert not (accounts / GLOBAL_ACCOUNT).exists()
        assert (accounts / APP_ACCOUNT).is_dir()
