"""Token hours keep the count source (upstream, tokenizer, estimate) as part of their key.

Issue 17: the workload export lists an endpoint's tokens by key and count source, and the
hour sums are what a report reads for whole hours. `source` joins the primary key, so the
table is rebuilt rather than altered (SQLite cannot change a primary key in place, and on
Postgres the new table could not take the old one's constraint name while it exists): the
rows go to a keyless copy, the table is made anew, and they come back with source `unknown`,
because an hour summed before this revision may mix sources.
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"

TABLE = "accounting_token_hours"
COPY = "accounting_token_hours_0001"
UNKNOWN = "unknown"
KEY = ("hour", "tenant_id", "key_id", "endpoint", "model")
SUMS = ("prompt_tokens", "completion_tokens", "requests")


def _columns(*, with_source: bool, keyed: bool) -> list[sa.Column[object]]:
    utc = sa.DateTime(timezone=True)
    columns: list[sa.Column[object]] = [
        sa.Column("hour", utc, primary_key=keyed, nullable=False),
        sa.Column("tenant_id", sa.String(64), primary_key=keyed, nullable=False),
        sa.Column("key_id", sa.String(64), primary_key=keyed, nullable=False),
        sa.Column("endpoint", sa.String(64), primary_key=keyed, nullable=False),
        sa.Column("model", sa.String(256), primary_key=keyed, nullable=False),
    ]
    if with_source:
        columns.append(sa.Column("source", sa.String(16), primary_key=keyed, nullable=False))
    columns += [
        sa.Column("day", sa.Date, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("requests", sa.BigInteger, nullable=False),
    ]
    return columns


def _copy_out(*, with_source: bool) -> sa.Table:
    """Move the table's rows to a keyless copy, and drop the table (its key's name is free)."""
    copy = op.create_table(COPY, *_columns(with_source=with_source, keyed=False))
    names = [c.name for c in copy.columns]
    old = sa.table(TABLE, *(sa.column(n) for n in names))
    op.execute(copy.insert().from_select(names, sa.select(*(old.c[n] for n in names))))
    op.drop_table(TABLE)
    return copy


def upgrade() -> None:
    copy = _copy_out(with_source=False)
    table = op.create_table(TABLE, *_columns(with_source=True, keyed=True))
    names = [*KEY, "day", *SUMS]
    rows = sa.select(*(copy.c[n] for n in names), sa.literal(UNKNOWN, sa.String(16)))
    op.execute(table.insert().from_select([*names, "source"], rows))
    op.drop_table(COPY)


def downgrade() -> None:
    copy = _copy_out(with_source=True)
    table = op.create_table(TABLE, *_columns(with_source=False, keyed=True))
    key = [copy.c[n] for n in KEY]
    rows = sa.select(
        *key, sa.func.min(copy.c.day), *(sa.func.sum(copy.c[n]) for n in SUMS)
    ).group_by(*key)
    op.execute(table.insert().from_select([*KEY, "day", *SUMS], rows))
    op.drop_table(COPY)
