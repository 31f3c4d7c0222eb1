"""Schemathesis over /openapi.json against `einsora api` run as a process: no 5xx, ever, and
answers that match the document.

Bounded: a few examples per operation, so it stays a test and not a fuzzing campaign.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
)

from einsora.api.app import openapi_document
from einsora.common.embedded_nats import EmbeddedNats

_LISTENING = re.compile(r"listening on (http://\S+)")


@dataclass
class ApiProcess:
    url: str
    token: str
    process: subprocess.Popen[str]
    stderr: list[str]


def start_api_process(nats_url: str, data_dir: Path) -> ApiProcess:
    """`einsora api` as its own process on a free port; returns once it answers."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "einsora.api.command",
            "--nats",
            nats_url,
            "--database-url",
            f"sqlite+aiosqlite:///{data_dir / 'einsora.db'}",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "EINSORA_LOG_LEVEL": "WARNING"},
    )
    assert process.stderr is not None
    deadline = time.monotonic() + 30
    for line in process.stderr:
        match = _LISTENING.search(line)
        if match:
            token = (data_dir / "owner.token").read_text().strip()
            lines: list[str] = []
            # Keep reading its stderr, so a chatty process never blocks on a full pipe.
            threading.Thread(target=lines.extend, args=(process.stderr,), daemon=True).start()
            return ApiProcess(match[1], token, process, lines)
        if time.monotonic() > deadline:
            break
    process.kill()
    raise AssertionError(f"einsora api did not start (exit {process.wait()})")


def stop_api_process(api: ApiProcess) -> int:
    api.process.send_signal(signal.SIGTERM)
    try:
        return api.process.wait(timeout=20)
    finally:
        if api.process.poll() is None:
            api.process.kill()
            api.process.wait()
        assert api.process.stderr is not None
        api.process.stderr.close()


@pytest.fixture(scope="module")
def api_process(
    nats_server: EmbeddedNats, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiProcess]:
    data_dir = tmp_path_factory.mktemp("api-process")
    api = start_api_process(nats_server.url, data_dir)
    # Accounting answers GET /v1/usage; without it that route is a 503 by design.
    accounting = subprocess.Popen(
        [
            *(sys.executable, "-m", "einsora.accounting", "--nats", nats_server.url),
            *("--database-url", f"sqlite+aiosqlite:///{data_dir / 'einsora.db'}"),
            *("--data-dir", str(data_dir)),
        ],
        env={**os.environ, "EINSORA_LOG_LEVEL": "WARNING"},
    )
    try:
        _wait_for_usage(api)
        yield api
    finally:
        accounting.send_signal(signal.SIGTERM)
        assert accounting.wait(timeout=20) == 0
        assert stop_api_process(api) == 0


def _wait_for_usage(api: ApiProcess, within_s: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + within_s
    request = urllib.request.Request(  # noqa: S310 (the api's own http URL)
        f"{api.url}/v1/usage", headers={"Authorization": f"Bearer {api.token}"}
    )
    while True:
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 (our own)
                if answer.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("accounting did not answer usage reports in time")
        time.sleep(0.2)


# The served document is this same generated one (checked in test_http.py).
# The tenant's event stream answers 200 and never ends, whatever the input: its refusals
# (a bad Last-Event-ID, too many streams) are tested in test_event_streams.py instead.
schema = schemathesis.openapi.from_dict(openapi_document()).exclude(path="/v1/events", method="GET")


@schema.parametrize()
@settings(
    max_examples=12,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_no_input_makes_a_server_error(
    case: schemathesis.Case[Any], api_process: ApiProcess
) -> None:
    response = case.call(
        base_url=api_process.url,
        headers={"Authorization": f"Bearer {api_process.token}"},
        timeout=10,
    )
    # Every check (no 5xx, status codes, response schemas, content types, Allow on 405) except
    # two that cannot hold here by design: a forged `cursor` is schema-valid yet refused (422),
    # and every call carries the owner's token, so "no Authorization" cases are authorized.
    case.validate_response(
        response, excluded_checks=[positive_data_acceptance, negative_data_rejection]
    )
