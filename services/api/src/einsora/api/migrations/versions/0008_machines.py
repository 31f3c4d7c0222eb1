"""Join tokens and enrolled machines: owner, region, sharing, credential hash (issue 14)."""

import sqlalchemy as sa
from alembic import op

from einsora.store import UtcDateTime

revision = "0008"
down_revision = "0007"

ID = sa.String(32)
NAME = sa.String(64)


def upgrade() -> None:
    op.create_table(
        "join_tokens",
        sa.Column("id", ID),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("user_id", ID, nullable=False),
        sa.Column("name", NAME, nullable=False),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("region", NAME, nullable=False),
        sa.Column("sharing", sa.String(16), nullable=False),
        sa.Column("tunnel", sa.Boolean(), nullable=False),
        sa.Column("max_uses", sa.Integer(), nullable=False),
        sa.Column("uses", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_join_tokens"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_join_tokens_tenant_id_tenants"
        ),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_join_tokens_user_id_users"),
        sa.UniqueConstraint("secret_sha256", name="uq_join_tokens_secret_sha256"),
    )
    op.create_index("ix_join_tokens_tenant_id_id", "join_tokens", ["tenant_id", "id"])
    op.create_table(
        "machines",
        sa.Column("id", sa.String(128)),
        sa.Column("owner_tenant_id", ID, nullable=False),
        sa.Column("owner_user_id", ID, nullable=True),
        sa.Column("region", NAME, nullable=False),
        sa.Column("sharing", sa.String(16), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("credential_sha256", sa.String(64), nullable=True),
        sa.Column("tunnel", sa.Boolean(), nullable=False),
        sa.Column("tunnel_key", sa.Text(), nullable=True),
        sa.Column("join_token_id", ID, nullable=True),
        sa.Column("enrolled_at", UtcDateTime(), nullable=False),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_machines"),
        sa.ForeignKeyConstraint(
            ["owner_tenant_id"], ["tenants.id"], name="fk_machines_owner_tenant_id_tenants"
        ),
        sa.ForeignKeyConstraint(
            ["owner_user_id"], ["users.id"], name="fk_machines_owner_user_id_users"
        ),
        sa.ForeignKeyConstraint(
            ["join_token_id"], ["join_tokens.id"], name="fk_machines_join_token_id_join_tokens"
        ),
        sa.UniqueConstraint("credential_sha256", name="uq_machines_credential_sha256"),
    )
    op.create_index("ix_machines_owner_tenant_id_id", "machines", ["owner_tenant_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_machines_owner_tenant_id_id", table_name="machines")
    op.drop_table("machines")
    op.drop_index("ix_join_tokens_tenant_id_id", table_name="join_tokens")
    op.drop_table("join_tokens")
