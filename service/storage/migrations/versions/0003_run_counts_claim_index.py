"""Each experiment keeps its run counts per status (kept by the runs store with every status
change), so that its status and counts cost one row instead of a count over its runs; and an
index in claim order (priority first, then oldest), so that claiming queued runs reads an index
instead of sorting every queued run.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

STATUSES = ("queued", "running", "completed", "failed", "diverged", "cancelled")


def upgrade() -> None:
    for status in STATUSES:
        op.add_column(
            "experiment",
            sa.Column(f"runs_{status}", sa.Integer(), nullable=False, server_default="0"),
        )
    for status in STATUSES:
        op.execute(
            f"UPDATE experiment SET runs_{status} = (SELECT count(*) FROM run "
            f"WHERE run.experiment_id = experiment.id AND run.status = '{status}')"
        )
    op.create_index("ix_run_claim", "run", ["status", sa.desc(sa.column("priority")), "id"])


def downgrade() -> None:
    op.drop_index("ix_run_claim", table_name="run")
    # Native on PostgreSQL and on SQLite >= 3.35 (no index or constraint uses the columns).
    for status in STATUSES:
        op.execute(f"ALTER TABLE experiment DROP COLUMN runs_{status}")
