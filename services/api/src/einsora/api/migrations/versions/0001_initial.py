"""The api's first tables: tenants, users, members, API tokens, workloads, timeline, outbox,
idempotency keys."""

import sqlalchemy as sa
from alembic import op

from einsora.api.models import AUTO_ID
from einsora.store import UtcDateTime

revision = "0001"
down_revision = None

ID = sa.String(32)
NAME = sa.String(64)


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", ID),
        sa.Column("name", NAME, nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tenants"),
        sa.UniqueConstraint("name", name="uq_tenants_name"),
    )
    op.create_table(
        "users",
        sa.Column("id", ID),
        sa.Column("username", NAME, nullable=False),
        sa.Column("is_operator", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.UniqueConstraint("username", name="uq_users_username"),
    )
    op.create_table(
        "members",
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("user_id", ID, nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "user_id", name="pk_members"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_members_tenant_id_tenants"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_members_user_id_users"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", ID),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("user_id", ID, nullable=False),
        sa.Column("name", NAME, nullable=False),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=True),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
        sa.Column("last_used_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("secret_sha256", name="uq_api_tokens_secret_sha256"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_api_tokens_tenant_id_tenants"
        ),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_api_tokens_user_id_users"),
    )
    op.create_index(
        "ix_api_tokens_tenant_id_user_id_id", "api_tokens", ["tenant_id", "user_id", "id"]
    )
    op.create_table(
        "workloads",
        sa.Column("id", ID),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("created_by", ID, nullable=False),
        sa.Column("name", NAME, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("class_name", NAME, nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("region", NAME, nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("fallback", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("placed_region", NAME, nullable=True),
        sa.Column("placed_machine", NAME, nullable=True),
        sa.Column("placed_class", NAME, nullable=True),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workloads"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_workloads_tenant_id_tenants"
        ),
        sa.ForeignKeyConstraint(["created_by"], ["users.id"], name="fk_workloads_created_by_users"),
    )
    op.create_index("ix_workloads_tenant_id_id", "workloads", ["tenant_id", "id"])
    op.create_index("ix_workloads_tenant_id_state_id", "workloads", ["tenant_id", "state", "id"])
    op.create_index("ix_workloads_tenant_id_kind_id", "workloads", ["tenant_id", "kind", "id"])
    op.create_table(
        "timeline",
        sa.Column("id", AUTO_ID, autoincrement=True),
        sa.Column("workload_id", ID, nullable=False),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=True),
        sa.Column("event_id", sa.String(64), nullable=True),
        sa.Column("seq", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_timeline"),
        sa.UniqueConstraint("event_id", name="uq_timeline_event_id"),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"], name="fk_timeline_workload_id_workloads"
        ),
    )
    op.create_index("ix_timeline_workload_id_at_id", "timeline", ["workload_id", "at", "id"])
    op.create_table(
        "outbox",
        sa.Column("id", AUTO_ID, autoincrement=True),
        sa.Column("intent_id", ID, nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("traceparent", sa.String(64), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("sent_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_outbox"),
        sa.UniqueConstraint("intent_id", name="uq_outbox_intent_id"),
    )
    op.create_index(
        "ix_outbox_unsent",
        "outbox",
        ["id"],
        sqlite_where=sa.text("sent_at IS NULL"),
        postgresql_where=sa.text("sent_at IS NULL"),
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("workload_id", ID, nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "key", name="pk_idempotency_keys"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_idempotency_keys_tenant_id_tenants"
        ),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"], name="fk_idempotency_keys_workload_id_workloads"
        ),
    )
