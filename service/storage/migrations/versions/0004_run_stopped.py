"""A run can end `stopped`: a check its spec asked to stop on (stop_on_checks) fired, and the
run ended early with its result stored. Each experiment counts its stopped runs beside the other
statuses (runs_stopped).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

# What a stopped run becomes under 0003, which has no such status: it did not complete.
STOPPED_BEFORE_0004 = "stopped early by a check its spec asked to stop on (status 'stopped')"


def upgrade() -> None:
    op.add_column(
        "experiment", sa.Column("runs_stopped", sa.Integer(), nullable=False, server_default="0")
    )
    # 0 on a database that 0003 kept; counted, like 0003's columns, so that an upgrade after a
    # downgrade is exact too.
    op.execute(
        "UPDATE experiment SET runs_stopped = (SELECT count(*) FROM run "
        "WHERE run.experiment_id = experiment.id AND run.status = 'stopped')"
    )


def downgrade() -> None:
    # 0003's code knows no `stopped`: such runs become failed (not completed: /stats must keep
    # leaving them out), with the reason, and their counts move with them; an experiment that
    # 0004 called completed because of them is partial under 0003's rule.
    op.execute(
        "UPDATE experiment SET status = 'partial' WHERE status = 'completed' AND runs_stopped > 0"
    )
    op.execute("UPDATE experiment SET runs_failed = runs_failed + runs_stopped")
    op.execute(
        sa.text(
            "UPDATE run SET status = 'failed', error = coalesce(error, :reason) "
            "WHERE status = 'stopped'"
        ).bindparams(reason=STOPPED_BEFORE_0004)
    )
    op.execute("UPDATE runattempt SET outcome = 'failed' WHERE outcome = 'stopped'")
    # Native on PostgreSQL and on SQLite >= 3.35 (no index or constraint uses the column).
    op.execute("ALTER TABLE experiment DROP COLUMN runs_stopped")
