"""A run handed to Ray that no worker has started yet is `pending` (it was `running`): the
dispatcher claims runs beyond the cluster's free slots, and they wait in Ray's queue. Each
experiment counts its pending runs beside the other statuses (runs_pending).

Runs stored `running` stay so: one whose worker had not started it is re-queued, not charged,
by the next dispatcher to take over (it holds no live attempt of it), and a dispatcher of the
previous version still finishing its runs only ends runs it finds `running`.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "experiment", sa.Column("runs_pending", sa.Integer(), nullable=False, server_default="0")
    )
    # 0 on a database that 0006 kept; counted, like 0004's column, so that an upgrade after a
    # downgrade is exact too.
    op.execute(
        "UPDATE experiment SET runs_pending = (SELECT count(*) FROM run "
        "WHERE run.experiment_id = experiment.id AND run.status = 'pending')"
    )


def downgrade() -> None:
    # 0006's code knows no `pending`: a run handed to Ray was `running` there, and counted so.
    op.execute("UPDATE experiment SET runs_running = runs_running + runs_pending")
    op.execute("UPDATE run SET status = 'running' WHERE status = 'pending'")
    # Native on PostgreSQL and on SQLite >= 3.35 (no index or constraint uses the column).
    op.execute("ALTER TABLE experiment DROP COLUMN runs_pending")
