"""Invitations, and operator rights on the token rather than through a tenant (ADR-0008).

Tokens made before this revision keep operator rights only if their user is an operator and
the token was the owner's first one (named "owner" by the bootstrap): any other token of an
operator user may have been minted for them by a tenant admin, which ADR-0008 closes.
"""

import sqlalchemy as sa
from alembic import op

from einsora.store import UtcDateTime

revision = "0004"
down_revision = "0003"

ID = sa.String(32)


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(
            sa.Column("operator", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.execute(
        "UPDATE api_tokens SET operator = true WHERE name = 'owner' AND user_id IN "
        "(SELECT id FROM users WHERE is_operator = true)"
    )
    op.create_table(
        "invitations",
        sa.Column("id", ID),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("username", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("user_id", ID, nullable=True),
        sa.Column("secret_sha256", sa.String(64), nullable=True),
        sa.Column("invited_by", ID, nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.Column("accepted_at", UtcDateTime(), nullable=True),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_invitations"),
        sa.UniqueConstraint("secret_sha256", name="uq_invitations_secret_sha256"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_invitations_tenant_id_tenants"
        ),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_invitations_user_id_users"),
        sa.ForeignKeyConstraint(
            ["invited_by"], ["users.id"], name="fk_invitations_invited_by_users"
        ),
    )
    op.create_index("ix_invitations_tenant_id_id", "invitations", ["tenant_id", "id"])
    op.create_index("ix_invitations_user_id_id", "invitations", ["user_id", "id"])


def downgrade() -> None:
    op.drop_table("invitations")
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("operator")
