"""An experiment stopped because its first runs all failed keeps why in its own column,
`stop_message` (it was read back from the errors of the runs the stop cancelled, which start
with "cancelled: the experiment "; those errors stay as they are). Existing experiments get
theirs from those errors, as the service read it: of an experiment with a failed run, the
first such run's error without the prefix.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None

# service.scheduling.run_rules.STOPPED_RUN_PREFIX when this revision was written
PREFIX = "cancelled: the experiment "


def upgrade() -> None:
    op.add_column("experiment", sa.Column("stop_message", sa.String(), nullable=True))
    stopped_run = (
        f"FROM run WHERE run.experiment_id = experiment.id "
        f"AND substr(run.error, 1, {len(PREFIX)}) = :prefix"
    )
    op.get_bind().execute(
        sa.text(
            f"UPDATE experiment SET stop_message = (SELECT substr(run.error, {len(PREFIX) + 1}) "
            f"{stopped_run} ORDER BY run.id LIMIT 1) "
            f"WHERE runs_failed > 0 AND EXISTS (SELECT 1 {stopped_run})"
        ),
        {"prefix": PREFIX},
    )


def downgrade() -> None:
    # 0008's code reads the message from the runs' errors, which kept it.
    # Native on PostgreSQL and on SQLite >= 3.35 (no index or constraint uses the column).
    op.execute("ALTER TABLE experiment DROP COLUMN stop_message")
