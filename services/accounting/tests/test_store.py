"""Accounting's store on both engines: migrations from empty make exactly the tables in code,
and a second run changes nothing; token hours summed before the count source was kept keep
their sums, with source `unknown`."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from einsora.accounting import tables
from einsora.accounting.store import MIGRATIONS, VERSION_TABLE, AccountingStore
from einsora.accounting.testing import T0, hours
from einsora.common.ids import new_id
from einsora.common.schemas import CountSource, ReportGroup, TokenUsage, UsageReportRequest
from einsora.store.migrations import upgrade


async def test_migrations_match_the_tables_and_are_idempotent(store_url: str) -> None:
    store = AccountingStore(store_url)
    try:
        await store.migrate()
        await store.migrate()
        async with store.read() as conn:

            def diff(sync_conn: sa.Connection) -> list[object]:
                context = MigrationContext.configure(
                    sync_conn, opts={"version_table": VERSION_TABLE}
                )
                return list(compare_metadata(context, tables.metadata))

            differences = await conn.run_sync(diff)
            versions = (
                (await conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")))  # noqa: S608
                .scalars()
                .all()
            )
        assert differences == []
        assert versions == [ScriptDirectory(str(MIGRATIONS)).get_current_head()]
        assert all(name.startswith("accounting_") for name in tables.metadata.tables)
    finally:
        await store.close()


async def test_token_hours_from_before_the_source_was_kept_count_as_unknown(
    store_url: str,
) -> None:
    store = AccountingStore(store_url)
    hour = T0.replace(minute=0, second=0, microsecond=0)
    try:
        await upgrade(store.engine, MIGRATIONS, version_table=VERSION_TABLE, revision="0001")
        old = {
            "hour": hour,
            "tenant_id": "t-a",
            "key_id": "gk-1",
            "endpoint": "w-ep",
            "model": "tiny",
            "day": hour.date(),
            "prompt_tokens": 70,
            "completion_tokens": 30,
            "requests": 4,
        }
        async with store.engine.begin() as conn:
            await conn.execute(
                sa.table("accounting_token_hours", *map(sa.column, old)).insert(), old
            )
        await store.migrate()
        served = TokenUsage(
            request_id=new_id("request"),
            tenant_id="t-a",
            key_id="gk-1",
            endpoint="w-ep",
            model="tiny",
            prompt_tokens=9,
            completion_tokens=1,
            source=CountSource.tokenizer,
            at=hour + hours(0.5),
        )
        await store.add_token_usage([served])
        reply = await store.report(
            UsageReportRequest.model_validate(
                {
                    "group_by": ReportGroup.key_source,
                    "from": hour - hours(1),
                    "to": hour + hours(2),
                    "endpoint_ids": ["w-ep"],
                }
            )
        )
        assert [(i.group, i.prompt_tokens, i.completion_tokens) for i in reply.items] == [
            ("gk-1/tokenizer", 9, 1),
            ("gk-1/unknown", 70, 30),
        ]
    finally:
        await store.close()
