"""`GET /v1/workloads/{id}/export`: one document that validates against its published JSON
Schema, holds the spec as submitted, the placements, the complete timeline and the usage
accounting metered (an endpoint's tokens by key and count source, its replicas' included), with
every secret `REDACTED` and listed; another tenant gets a 404.

Against a real api, a real nats-server and the real accounting service, fed the scheduler's
events and the gateway's token counts on the bus as they publish them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import pytest_asyncio

from einsora.accounting.service import AccountingService
from einsora.accounting.testing import (
    GatewayPlayer,
    SchedulerPlayer,
    events_done,
    held,
    tokens_done,
)
from einsora.api.schemas.export import SCHEMA, json_schema_text
from einsora.api.testing import Client, RunningApi, eventually, new_member, new_tenant
from einsora.common import logs
from einsora.common.schemas import CountSource, Placement, WorkloadState
from einsora.common.settings import Settings
from einsora.common.testing import Bus

SCHEMA_FILE = Path(__file__).parents[3] / "docs" / "schemas" / "workload-export-v1.json"

HF_TOKEN = "hf_" + "Q7" * 17
URI_PASSWORD = "hunterX9-secret"
BEARER = "tsk_" + "Zq9" * 12
PULL_PASSWORD = "pullPass42X"
SPEC: dict[str, Any] = {
    "image": "ghcr.io/example/notebook:1.2",
    "env": {"HF_TOKEN": HF_TOKEN, "MODE": "fast"},
    "model": f"s3://ann:{URI_PASSWORD}@bucket.example.org:9000/model.gguf",
    "headers": [f"Authorization: Bearer {BEARER}"],
    "max_tokens": 512,
}
PLANTED = (HF_TOKEN, URI_PASSWORD, BEARER, PULL_PASSWORD)


def _validate(document: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(document)]
    assert errors == []


def test_the_published_schema_is_up_to_date() -> None:
    assert SCHEMA_FILE.read_text() == json_schema_text(), (
        "regenerate it: python -m einsora.api.schemas.export > docs/schemas/workload-export-v1.json"
    )


@pytest_asyncio.fixture
async def accounting(bus: Bus, tmp_path: Path, data_dir: Path) -> AsyncIterator[None]:
    """Accounting on the test's bus, with a store of its own."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'accounting.db'}"
    service = AccountingService(
        Settings(nats_url=bus.url, database_url=url, data_dir=data_dir), publish_debounce_s=0.05
    )
    await service.start()
    try:
        yield
    finally:
        await service.stop()


async def _launch(client: Client) -> dict[str, Any]:
    made = await client.post(
        "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g", "spec": SPEC}
    )
    assert made.status == 201, made.text
    body: dict[str, Any] = made.body
    return body


async def _run_for_two_hours(
    bus: Bus, api: RunningApi, client: Client, workload: dict[str, Any]
) -> datetime:
    """The scheduler places the workload, runs it 2 h on 2 cores and parks it: four entries in
    its timeline (the launch, and three), one reason holding a registry's password. Returns
    when the api's clock is set, an hour after that."""
    created = datetime.fromisoformat(workload["created_at"])
    scheduler = SchedulerPlayer(bus.js)
    tenant, workload_id = workload["tenant_id"], workload["id"]
    what = held(0, machine="m-1", placed_class="cpu-1c-2g", cpus=2)
    steps = [
        (WorkloadState.scheduled, 1, "placed on m-1 (best fit: 2 cores and 4 GiB of 8 free)"),
        (
            WorkloadState.running,
            1,
            f"started; image pulled from https://robot:{PULL_PASSWORD}@registry.example.org",
        ),
        (WorkloadState.parking, 3, "parking: the user asked"),
    ]
    for state, hour, reason in steps:
        event = scheduler.event(
            workload_id, state, created + timedelta(hours=hour), tenant_id=tenant, metered=what
        ).model_copy(update={"reason": reason})
        if state is WorkloadState.scheduled:
            event = event.model_copy(
                update={
                    "placement": Placement(region="local", machine="m-1", placed_class="cpu-1c-2g")
                }
            )
        await scheduler.send(event)
    await events_done(bus.js)

    async def all_in() -> bool:
        entries = (await client.get(f"/v1/workloads/{workload_id}/events")).body["items"]
        return len(entries) == 4

    await eventually(all_in)
    now = created + timedelta(hours=4)
    api.service.clock = lambda: now
    return now


async def test_the_export_holds_everything_with_every_secret_redacted_and_listed(
    api: RunningApi, bus: Bus, accounting: None
) -> None:
    tenant_id, ann = await new_tenant(api, "physics", "ann")
    workload = await _launch(ann)
    now = await _run_for_two_hours(bus, api, ann, workload)
    path = f"/v1/workloads/{workload['id']}"

    answer = await ann.get(f"{path}/export")
    assert answer.status == 200, answer.text
    document = answer.body
    _validate(document)
    text = json.dumps(document)
    for secret in PLANTED:
        assert secret not in text
    assert document["schema"] == SCHEMA
    assert datetime.fromisoformat(document["exported_at"]) == now

    # The inputs as submitted, less their secrets.
    shown = document["workload"]
    assert (shown["id"], shown["tenant_id"], shown["kind"], shown["class"]) == (
        workload["id"],
        tenant_id,
        "notebook",
        "cpu-1c-2g",
    )
    assert (shown["count"], shown["region"], shown["fallback"]) == (1, "local", [])
    assert shown["created_at"] == workload["created_at"]
    assert shown["spec"] == {
        **SPEC,
        "env": {"HF_TOKEN": "REDACTED", "MODE": "fast"},
        "model": "s3://ann:REDACTED@bucket.example.org:9000/model.gguf",
        "headers": ["Authorization: Bearer REDACTED"],
    }
    assert shown["placement"]["machine"] == "m-1"

    # The complete timeline, as the timeline route shows it (the reason redacted).
    timeline = (await ann.get(f"{path}/events")).body["items"]
    assert [(e["at"], e["state"]) for e in document["timeline"]] == [
        (e["at"], e["state"]) for e in timeline
    ]
    assert document["timeline"][2]["reason"] == (
        "started; image pulled from https://robot:REDACTED@registry.example.org"
    )
    assert [
        (p["state"], p["region"], p["machine"], p["placed_class"])
        for p in document["placement_history"]
    ] == [("scheduled", "local", "m-1", "cpu-1c-2g")]  # as the event placed it
    assert document["placement_history"][0]["at"] == document["timeline"][1]["at"]

    assert sorted((r["path"], r["kind"]) for r in document["redactions"]) == [
        ("$.timeline[2].reason", "password in a URI"),
        ("$.workload.spec.env.HF_TOKEN", "huggingface token"),
        ("$.workload.spec.headers[0]", "bearer credential"),
        ("$.workload.spec.model", "password in a URI"),
    ]

    # Usage: 2 cores for 2 h, on one day or two (the hours may cross midnight UTC).
    usage = document["usage"]
    assert usage["from"] == workload["created_at"]
    assert (usage["gpu_hours"], usage["cpu_core_hours"]) == (0.0, pytest.approx(4.0))
    assert sum(d["cpu_core_hours"] for d in usage["by_day"]) == pytest.approx(4.0)
    assert [(c["group"], c["cpu_core_hours"]) for c in usage["by_placed_class"]] == [
        ("cpu-1c-2g", pytest.approx(4.0))
    ]
    assert usage["tokens"] == []  # a notebook serves no tokens
    assert document["notes"] == []


async def test_an_endpoints_export_lists_its_tokens_by_key_and_count_source(
    api: RunningApi, bus: Bus, accounting: None
) -> None:
    tenant_id, ann = await new_tenant(api, "physics", "ann")
    theirs, _ = await new_tenant(api, "chemistry", "cat")
    spec = {"runtime": "llamacpp", "model": "/m/x.gguf", "replicas": 2}
    made = await ann.post(
        "/v1/workloads", {"kind": "endpoint", "class": "cpu-1c-2g", "name": "chat", "spec": spec}
    )
    assert made.status == 201, made.text
    endpoint = made.body
    listed = (await ann.get("/v1/workloads?kind=endpoint")).body["items"]
    (replica,) = [w["id"] for w in listed if w["replica_of"] == endpoint["id"]]
    other = await ann.post(
        "/v1/workloads", {"kind": "endpoint", "class": "cpu-1c-2g", "name": "code", "spec": spec}
    )
    assert other.status == 201, other.text
    keys = []
    for name in ("lab", "ci"):
        key = await ann.post("/v1/gateway/keys", {"name": name})
        assert key.status == 201, key.text
        keys.append(key.body["id"])
    lab, ci = keys

    # The gateway's counts: the endpoint and its replica answer both keys, from two sources;
    # the other endpoint, and another tenant's key, are not this endpoint's.
    gateway = GatewayPlayer(bus.js)
    at = datetime.fromisoformat(endpoint["created_at"]) + timedelta(minutes=5)
    counts = [
        (lab, endpoint["id"], CountSource.upstream, 100, 20),
        (lab, replica, CountSource.upstream, 11, 2),
        (lab, replica, CountSource.estimate, 7, 3),
        (ci, endpoint["id"], CountSource.tokenizer, 40, 9),
        (ci, other.body["id"], CountSource.tokenizer, 1000, 1000),
    ]
    for key_id, served_by, source, prompt, completion in counts:
        usage = gateway.usage(
            at,
            tenant_id=tenant_id,
            key_id=key_id,
            endpoint=served_by,
            source=source,
            prompt=prompt,
            completion=completion,
        )
        await gateway.send(usage)
    elsewhere = gateway.usage(at, tenant_id=theirs, key_id="gk-theirs", endpoint=replica)
    await gateway.send(elsewhere)
    await tokens_done(bus.js)
    api.service.clock = lambda: at + timedelta(hours=1)

    answer = await ann.get(f"/v1/workloads/{endpoint['id']}/export")
    assert answer.status == 200, answer.text
    _validate(answer.body)
    assert answer.body["notes"] == []
    tokens = [
        (t["key_id"], t["key_name"], t["source"], t["prompt_tokens"], t["completion_tokens"])
        for t in answer.body["usage"]["tokens"]
    ]
    assert tokens == sorted(
        [
            (lab, "lab", "estimate", 7, 3),
            (lab, "lab", "upstream", 111, 22),
            (ci, "ci", "tokenizer", 40, 9),
        ]
    )


async def test_another_tenant_gets_a_404_and_a_member_no_one_elses_usage(
    api: RunningApi, bus: Bus, accounting: None
) -> None:
    tenant_id, ann = await new_tenant(api, "physics", "ann")
    bob = await new_member(api, tenant_id, "bob", by=ann)
    _, intruder = await new_tenant(api, "chemistry", "cat")
    workload = await _launch(ann)
    await _run_for_two_hours(bus, api, ann, workload)
    path = f"/v1/workloads/{workload['id']}/export"

    # Another tenant's workload answers as one that does not exist.
    answers = [
        await intruder.get(f"/v1/workloads/{workload_id}/export")
        for workload_id in (workload["id"], "w-01nonexistent0000000000", "..%2Fme")
    ]
    for answer in answers:
        assert answer.status == 404, answer.text
        assert answer.body["error"] == "not_found"
        assert "spec" not in answer.body
    assert answers[0].body["message"] == f"no workload {workload['id']!r}"
    assert answers[1].body["message"] == "no workload 'w-01nonexistent0000000000'"

    answer = await bob.get(path)
    assert answer.status == 200, answer.text
    _validate(answer.body)
    assert answer.body["usage"] is None
    assert answer.body["notes"] == [
        "usage is left out: a member sees the usage of their own workloads only"
    ]
    assert len(answer.body["timeline"]) == 4


async def test_without_accounting_the_export_says_usage_is_left_out(
    shared_api: RunningApi,
) -> None:
    _, admin = await new_tenant(shared_api, "export-alone", "export-alone-admin")
    workload = await _launch(admin)
    answer = await admin.get(f"/v1/workloads/{workload['id']}/export")
    assert answer.status == 200, answer.text
    _validate(answer.body)
    assert answer.body["usage"] is None
    (note,) = answer.body["notes"]
    assert note.startswith("usage is left out: ")
    assert "accounting" in note
    assert [e["state"] for e in answer.body["timeline"]] == ["pending"]
    assert len(answer.body["redactions"]) == 3


# --- the probe: twenty shapes of a secret in a spec -------------------------------------------

AIZA = "AIza" + "SyPr0beGoogleMapsKey0123456789abcd"[:35]
PROBE: list[tuple[str, str]] = [
    ("$.workload.spec.command[2]", "Pr0be-pass-word"),
    ("$.workload.spec.args[1]", "k3y-Pr0be-4f8a9c2e"),
    ("$.workload.spec.args[2]", "Pr0beHfT0ken-77aa"),
    ("$.workload.spec.env.PGPASSWORD", "pg-Pr0be-secret"),
    ("$.workload.spec.env.DB_PASS", "dbPr0bePass9"),
    ("$.workload.spec.env.ENCRYPTION_KEY", "b64Pr0beEncKey0123=="),
    ("$.workload.spec.env.DATABASE_URL", "dsnPr0be9"),
    ("$.workload.spec.env.GITLAB_DEPLOY", "glpat-Pr0beGitLab0123456789"),
    ("$.workload.spec.env.STRIPE", "sk_live_Pr0beStripe0123456789ab"),
    ("$.workload.spec.env.MAPS", AIZA),
    ("$.workload.spec.env.ALERTS", "Pr0beSlackHook0123"),
    ("$.workload.spec.env.AWS_ACCESS_KEY_ID", "AKIAPR0BE0123456789A"),
    ("$.workload.spec.env.AWS_SECRET_ACCESS_KEY", "Pr0be/AwsSecret+0123456789abcdefghijklmn"),
    ("$.workload.spec.env.OPENAI", "sk-proj-Pr0beOpenAi0123456789"),
    ("$.workload.spec.model", "Pr0beUserT0ken0123456789"),
    ("$.workload.spec.weights", "Pr0beQueryAuth42"),
    ("$.workload.spec.headers[0]", "Pr0beDrfToken0123"),
    ("$.workload.spec.headers[1]", "Pr0beXApiKey0123"),
    ("$.workload.spec.headers[2]", "Pr0beBearer0123"),
    ("$.workload.spec.headers[3]", "Pr0beCookie0123"),
]
"""Where each planted secret is listed in the export, and the secret."""
_SECRET = dict(PROBE)
PROBE_SPEC: dict[str, Any] = {
    "image": "ghcr.io/example/server:1.2",
    "command": [
        "sh",
        "-c",
        f"serve --password {_SECRET['$.workload.spec.command[2]']} --port 8080",
    ],
    "args": [
        "--api-key",
        _SECRET["$.workload.spec.args[1]"],
        f"--hf-token={_SECRET['$.workload.spec.args[2]']}",
        "--model",
        "meta-llama/Llama-3-8B",
        "--max-tokens",
        "512",
    ],
    "env": {
        "PGPASSWORD": _SECRET["$.workload.spec.env.PGPASSWORD"],
        "DB_PASS": _SECRET["$.workload.spec.env.DB_PASS"],
        "ENCRYPTION_KEY": _SECRET["$.workload.spec.env.ENCRYPTION_KEY"],
        "DATABASE_URL": (
            f"postgresql://app:{_SECRET['$.workload.spec.env.DATABASE_URL']}@db.internal:5432/app"
        ),
        "GITLAB_DEPLOY": _SECRET["$.workload.spec.env.GITLAB_DEPLOY"],
        "STRIPE": _SECRET["$.workload.spec.env.STRIPE"],
        "MAPS": AIZA,
        "ALERTS": (
            "https://hooks.slack.com/services/T0PR0BE1/B0PR0BE2/"
            + _SECRET["$.workload.spec.env.ALERTS"]
        ),
        "AWS_ACCESS_KEY_ID": _SECRET["$.workload.spec.env.AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": _SECRET["$.workload.spec.env.AWS_SECRET_ACCESS_KEY"],
        "OPENAI": _SECRET["$.workload.spec.env.OPENAI"],
        "PATH": "/usr/local/bin:/usr/bin",
        "KEYBOARD": "us",
        "MAX_TOKENS": "512",
        "TOKENIZER": "gpt2",
    },
    "model": f"https://{_SECRET['$.workload.spec.model']}@git.example.org/org/weights.git",
    "weights": (
        "https://weights.example.org/m.gguf?revision=main&auth="
        + _SECRET["$.workload.spec.weights"]
    ),
    "headers": [
        f"Authorization: Token {_SECRET['$.workload.spec.headers[0]']}",
        f"X-Api-Key: {_SECRET['$.workload.spec.headers[1]']}",
        f"Authorization: Bearer {_SECRET['$.workload.spec.headers[2]']}",
        f"Cookie: session={_SECRET['$.workload.spec.headers[3]']}; theme=dark",
    ],
}
ORDINARY = ("--port 8080", "meta-llama/Llama-3-8B", "--max-tokens", "/usr/local/bin:/usr/bin")


async def test_no_secret_of_the_probe_survives_the_export_and_each_is_listed(
    shared_api: RunningApi,
) -> None:
    _, admin = await new_tenant(shared_api, "export-probe", "export-probe-admin")
    made = await admin.post(
        "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g", "spec": PROBE_SPEC}
    )
    assert made.status == 201, made.text
    answer = await admin.get(f"/v1/workloads/{made.body['id']}/export")
    assert answer.status == 200, answer.text
    _validate(answer.body)
    text = json.dumps(answer.body)
    survivors = [secret for _, secret in PROBE if secret in text]
    assert survivors == []
    listed = {r["path"] for r in answer.body["redactions"]}
    assert sorted(path for path, _ in PROBE if path not in listed) == []

    # What is not a secret reads as it was written.
    spec = answer.body["workload"]["spec"]
    assert spec["command"] == ["sh", "-c", "serve --password REDACTED --port 8080"]
    assert spec["args"] == [
        "--api-key",
        "REDACTED",
        "--hf-token=REDACTED",
        *PROBE_SPEC["args"][3:],
    ]
    assert {k: spec["env"][k] for k in ("PATH", "KEYBOARD", "MAX_TOKENS", "TOKENIZER")} == {
        "PATH": "/usr/local/bin:/usr/bin",
        "KEYBOARD": "us",
        "MAX_TOKENS": "512",
        "TOKENIZER": "gpt2",
    }
    assert spec["model"] == "https://REDACTED@git.example.org/org/weights.git"
    assert spec["weights"] == "https://weights.example.org/m.gguf?revision=main&auth=REDACTED"
    assert spec["headers"][:3] == [
        "Authorization: Token REDACTED",
        "X-Api-Key: REDACTED",
        "Authorization: Bearer REDACTED",
    ]


@pytest.mark.parametrize(
    "formatter", [logs.JsonFormatter(), logs.HumanFormatter()], ids=["json", "human"]
)
@pytest.mark.parametrize("rendered", [json.dumps, str, None], ids=["json", "repr", "field"])
def test_no_secret_of_the_probe_survives_a_log_line(
    formatter: logging.Formatter, rendered: Callable[[Any], str] | None
) -> None:
    """The same spec logged by mistake: in the message (as JSON or as Python writes it), or
    as a field."""
    if rendered is None:
        record = logging.makeLogRecord({"msg": "launching", "spec": PROBE_SPEC})
    else:
        record = logging.makeLogRecord({"msg": f"launching {rendered(PROBE_SPEC)}"})
    line = formatter.format(record)
    assert [secret for _, secret in PROBE if secret in line] == []
    for ordinary in ORDINARY:
        assert ordinary in line
