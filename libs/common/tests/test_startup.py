"""A start-up step waits out what a retry can cure, and only that (issue 35, F5)."""

from __future__ import annotations

import logging

import nats.errors
import nats.js.errors
import pytest

from einsora.common import startup
from einsora.common.bus.connect import CredentialRefused
from einsora.common.errors import BusUnavailable, PortInUse

RETRYING = "start-up step failed; retrying with back-off"
DONE = "start-up step done after retries"


class Flaky:
    """A step that fails with each of `failures` in turn, then answers 42."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls = 0

    async def __call__(self) -> int:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return 42


async def test_transient_failures_are_waited_out_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="einsora.startup")
    step = Flaky(
        nats.errors.TimeoutError(),  # `nats: timeout` in provision (F5)
        nats.js.errors.ServiceUnavailableError(),  # JetStream without a leader
        BusUnavailable("cannot reach NATS at nats://127.0.0.1:9"),
    )
    assert await startup.retrying("provisioning", step, service="test", cap_s=0.01) == 42
    assert step.calls == 4
    said = [r.getMessage() for r in caplog.records]
    assert said == [RETRYING, DONE]
    assert getattr(caplog.records[0], "step", None) == "provisioning"
    assert getattr(caplog.records[1], "attempts", None) == 4


@pytest.mark.parametrize(
    "failure",
    [
        CredentialRefused("NATS refused the accounting identity"),
        PortInUse("port 8080 is taken"),
        nats.errors.Error("nats: permissions violation"),
        ValueError("a bug"),
    ],
)
async def test_what_no_wait_cures_ends_the_start_at_once(failure: Exception) -> None:
    step = Flaky(failure)
    with pytest.raises(type(failure)):
        await startup.retrying("connecting", step, service="test", cap_s=0.01)
    assert step.calls == 1


def test_back_off_doubles_up_to_its_cap_and_is_spread() -> None:
    for attempt in range(1, 40):
        base = min(startup.RETRY_CAP_S, startup.FIRST_RETRY_S * 2 ** (attempt - 1))
        assert base / 2 <= startup.backoff(attempt) <= base
