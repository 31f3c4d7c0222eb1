"""Endpoint replicas, and one live endpoint per name in a tenant (issue 12).

`replica_of` links an endpoint's further replicas to the one the user launched. An endpoint's
name is the model name the gateway routes by, so a partial unique index keeps it unique among
a tenant's endpoints that are not removed. Endpoints stored before this revision that share a
name keep the oldest's; the others get their id's last six characters appended (and a timeline
note would be lost on nobody: such duplicates could not be told apart by the gateway anyway).
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"

ID = sa.String(32)
TAKEN = "kind = 'endpoint' AND replica_of IS NULL AND state <> 'removed'"


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("replica_of", ID, nullable=True))
        batch.create_foreign_key(
            "fk_workloads_replica_of_workloads", "workloads", ["replica_of"], ["id"]
        )
        batch.create_index("ix_workloads_replica_of", ["replica_of"])
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT id, tenant_id, name FROM workloads "
            "WHERE kind = 'endpoint' AND state <> 'removed' ORDER BY id"
        )
    ).all()
    seen: set[tuple[str, str]] = set()
    for workload_id, tenant_id, name in rows:
        if (tenant_id, name) in seen:
            conn.execute(
                sa.text("UPDATE workloads SET name = :name WHERE id = :id"),
                {"name": f"{name[:57]}-{workload_id[-6:]}", "id": workload_id},
            )
        seen.add((tenant_id, name))
    op.create_index(
        "uq_workloads_endpoint_name",
        "workloads",
        ["tenant_id", "name"],
        unique=True,
        sqlite_where=sa.text(TAKEN),
        postgresql_where=sa.text(TAKEN),
    )


def downgrade() -> None:
    op.drop_index("uq_workloads_endpoint_name", table_name="workloads")
    with op.batch_alter_table("workloads") as batch:
        batch.drop_index("ix_workloads_replica_of")
        batch.drop_constraint("fk_workloads_replica_of_workloads", type_="foreignkey")
        batch.drop_column("replica_of")
