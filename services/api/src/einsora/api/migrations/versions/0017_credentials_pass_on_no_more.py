"""Credentials pass on no more than they have (issue 34, N2, N5, N12): whether a password
signs in with operator rights, the expiry a sign-in link and its session inherit, and password
sign-in attempts counted in the store.

A password set before this migration signs in without operator rights: which credential set it
is not known, and it may have been any token of the operator's. The operator signs in with a
one-time link (`einsora dashboard`) and sets it again to have them back.
"""

import sqlalchemy as sa
from alembic import op

from einsora.store import UtcDateTime

revision = "0017"
down_revision = "0016"


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(
            sa.Column("password_operator", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("credential_expires_at", UtcDateTime(), nullable=True))
    with op.batch_alter_table("sign_in_links") as batch:
        batch.add_column(sa.Column("credential_expires_at", UtcDateTime(), nullable=True))
    op.create_table(
        "sign_in_attempts",
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("window_start", UtcDateTime(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("kind", "key", name="pk_sign_in_attempts"),
    )
    op.create_index("ix_sign_in_attempts_window_start", "sign_in_attempts", ["window_start"])


def downgrade() -> None:
    op.drop_index("ix_sign_in_attempts_window_start", table_name="sign_in_attempts")
    op.drop_table("sign_in_attempts")
    with op.batch_alter_table("sign_in_links") as batch:
        batch.drop_column("credential_expires_at")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("credential_expires_at")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("password_operator")
