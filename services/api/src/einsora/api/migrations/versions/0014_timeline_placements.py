"""Timeline entries keep the placement their event made (issue 17: the export's placement
history). Entries from before have none; the export reads their machine from the reason."""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"

NAME = sa.String(64)


def upgrade() -> None:
    with op.batch_alter_table("timeline") as batch:
        batch.add_column(sa.Column("placed_region", NAME, nullable=True))
        batch.add_column(sa.Column("placed_machine", NAME, nullable=True))
        batch.add_column(sa.Column("placed_class", NAME, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("timeline") as batch:
        batch.drop_column("placed_class")
        batch.drop_column("placed_machine")
        batch.drop_column("placed_region")
