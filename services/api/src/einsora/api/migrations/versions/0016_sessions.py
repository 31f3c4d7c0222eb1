"""The dashboard's sessions, one-time sign-in links, users' passwords, and when each gateway
key was last used (issue 18, ADR-0019)."""

import sqlalchemy as sa
from alembic import op

from einsora.store import UtcDateTime

revision = "0016"
down_revision = "0015"

ID = sa.String(32)


def upgrade() -> None:
    with op.batch_alter_table("gateway_keys") as batch:
        batch.add_column(sa.Column("last_used_at", UtcDateTime(), nullable=True))
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("password_hash", sa.String(255), nullable=True))
        batch.add_column(sa.Column("password_set_at", UtcDateTime(), nullable=True))
    op.create_table(
        "sessions",
        sa.Column("id", ID, primary_key=True),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("user_id", ID, nullable=False),
        sa.Column("operator", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("method", sa.String(16), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("last_seen_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.Column("ended_at", UtcDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_sessions_tenant_id_tenants"
        ),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_sessions_user_id_users"),
        sa.PrimaryKeyConstraint("id", name="pk_sessions"),
        sa.UniqueConstraint("secret_sha256", name="uq_sessions_secret_sha256"),
    )
    op.create_index("ix_sessions_user_id_id", "sessions", ["user_id", "id"])
    op.create_table(
        "sign_in_links",
        sa.Column("id", ID, primary_key=True),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("user_id", ID, nullable=False),
        sa.Column("operator", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.Column("used_at", UtcDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_sign_in_links_tenant_id_tenants"
        ),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_sign_in_links_user_id_users"),
        sa.PrimaryKeyConstraint("id", name="pk_sign_in_links"),
        sa.UniqueConstraint("secret_sha256", name="uq_sign_in_links_secret_sha256"),
    )


def downgrade() -> None:
    op.drop_table("sign_in_links")
    op.drop_index("ix_sessions_user_id_id", table_name="sessions")
    op.drop_table("sessions")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("password_set_at")
        batch.drop_column("password_hash")
    with op.batch_alter_table("gateway_keys") as batch:
        batch.drop_column("last_used_at")
