"""The activity log: one row per API action, in the transaction of the change it records
(issue 17)."""

import sqlalchemy as sa
from alembic import op

from einsora.api.models import AUTO_ID
from einsora.store import UtcDateTime

revision = "0013"
down_revision = "0012"

ID = sa.String(32)


def upgrade() -> None:
    op.create_table(
        "activity",
        sa.Column("seq", AUTO_ID, autoincrement=True),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("user_id", ID, nullable=True),
        sa.Column("token_id", ID, nullable=True),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("route", sa.String(255), nullable=False),
        sa.Column("target", sa.String(128), nullable=True),
        sa.Column("outcome", sa.String(8), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_activity"),
    )
    op.create_index("ix_activity_tenant_id_seq", "activity", ["tenant_id", "seq"])
    op.create_index("ix_activity_at", "activity", ["at"])


def downgrade() -> None:
    op.drop_index("ix_activity_at", table_name="activity")
    op.drop_index("ix_activity_tenant_id_seq", table_name="activity")
    op.drop_table("activity")
