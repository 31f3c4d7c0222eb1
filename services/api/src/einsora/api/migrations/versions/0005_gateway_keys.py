"""Gateway keys: `esk_…` keys for the inference gateway, stored only as their SHA-256."""

import sqlalchemy as sa
from alembic import op

from einsora.store import UtcDateTime

revision = "0005"
down_revision = "0004"

ID = sa.String(32)


def upgrade() -> None:
    op.create_table(
        "gateway_keys",
        sa.Column("id", ID),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("user_id", ID, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("key_sha256", sa.String(64), nullable=False),
        sa.Column("models", sa.Text(), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("max_tokens_default", sa.Integer(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=True),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_gateway_keys"),
        sa.UniqueConstraint("key_sha256", name="uq_gateway_keys_key_sha256"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_gateway_keys_tenant_id_tenants"
        ),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_gateway_keys_user_id_users"),
    )
    op.create_index(
        "ix_gateway_keys_tenant_id_user_id_id", "gateway_keys", ["tenant_id", "user_id", "id"]
    )
    op.create_index("ix_gateway_keys_tenant_id_id", "gateway_keys", ["tenant_id", "id"])
    op.create_index(
        "ix_gateway_keys_live",
        "gateway_keys",
        ["id"],
        sqlite_where=sa.text("revoked_at IS NULL"),
        postgresql_where=sa.text("revoked_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_table("gateway_keys")
