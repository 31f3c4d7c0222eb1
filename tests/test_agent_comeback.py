"""A joined machine's agent that starts while the api is down waits for it (issue 35, F4).

Everything real: Solo's control plane in this process (NATS in the accounts layout, whose auth
callout the api serves), a machine joined over HTTP, then the api stopped. NATS refuses the
machine's credential while nothing answers its callout, and the api cannot be asked whether the
machine was revoked: that is an outage, not a revocation. The agent must keep trying, say so,
never advise joining again (that would enrol a second machine), and come up once the api is back.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from pydantic import SecretStr
from tests.conftest import OpenApi, StartPlane

from einsora.agent.join import MachineUnknown, join
from einsora.agent.service import AgentService
from einsora.api.service import ApiService
from einsora.api.testing import eventually
from einsora.common.settings import Settings
from einsora.common.testing import until

RETRYING = "cannot connect to NATS; retrying with back-off"


async def test_a_joined_agent_started_while_the_api_is_down_comes_up_when_it_is_back(
    start_plane: StartPlane, api_of: OpenApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    plane = await start_plane(driver="sim")
    api = await api_of(plane)
    token = await api.ok("POST", "/v1/machines/join-tokens", {"tunnel": False})
    enrolled = await join(tmp_path / "joiner", api.base, token["token"])

    assert plane.api is not None
    await plane.api.stop()  # the api, and with it the callout that lets machines in, is down
    joiner = AgentService(
        Settings(data_dir=tmp_path / "joiner", log_format="text"),
        driver="sim",
        enrolment=enrolled,
        heartbeat_s=0.5,
        backoff_max_s=1.0,
    )
    starting = asyncio.create_task(joiner.start())
    restarted: ApiService | None = None
    try:
        await until(
            lambda: starting.done() or any(r.getMessage() == RETRYING for r in caplog.records),
            within_s=30,
            what="the agent retrying",
        )
        assert not starting.done(), starting.exception()  # it did not exit
        [retrying] = [r for r in caplog.records if r.getMessage() == RETRYING]
        said = str(getattr(retrying, "error", ""))
        assert "refused this machine's credential and the api cannot be asked" in said
        assert "join" not in said

        restarted = ApiService(plane.settings)  # same store, same port
        await restarted.start()
        await asyncio.wait_for(starting, 30)

        async def reported() -> bool:
            listed = (await api.ok("GET", "/v1/machines"))["items"]
            return any(m["id"] == enrolled.machine_id and m["heartbeat_at"] for m in listed)

        await eventually(reported, within_s=20, what="the joined machine reporting")
        listed = (await api.ok("GET", "/v1/machines"))["items"]
        # No second enrolment: this machine, and Solo's own, and nothing else.
        assert sorted(m["id"] for m in listed) == sorted(
            [enrolled.machine_id, plane.agent.machine_id if plane.agent else ""]
        )
        assert joiner.gone_reason is None
    finally:
        if not starting.done():
            starting.cancel()
        await joiner.stop()
        if restarted is not None:
            await restarted.stop()


async def test_a_credential_the_api_does_not_know_stops_the_agent_at_start(
    start_plane: StartPlane, api_of: OpenApi, tmp_path: Path
) -> None:
    """The other side of waiting: when the api answers, and knows no machine by this
    credential, no wait can help, and the agent says how to join again."""
    plane = await start_plane(driver="sim")
    api = await api_of(plane)
    token = await api.ok("POST", "/v1/machines/join-tokens", {"tunnel": False})
    enrolled = await join(tmp_path / "joiner", api.base, token["token"])
    forgotten = enrolled.model_copy(update={"credential": SecretStr("agk_" + "z" * 40)})
    joiner = AgentService(
        Settings(data_dir=tmp_path / "joiner", log_format="text"),
        driver="sim",
        enrolment=forgotten,
        heartbeat_s=0.5,
    )
    with pytest.raises(MachineUnknown, match=r"does not know machine .*einsora agent join"):
        await asyncio.wait_for(joiner.start(), 30)
    await joiner.stop()
