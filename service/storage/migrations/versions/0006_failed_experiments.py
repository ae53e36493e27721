"""An experiment whose runs all ended and none completed or was stopped by a check, while some
failed or diverged, is `failed` (it was `partial`): there is nothing to compare. The status is
stored on the experiment's row, so the ones that ended before this revision are set here.

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # service.scheduling.run_store.experiment_status, for the experiments that ended under 0005's
    # rule
    op.execute(
        "UPDATE experiment SET status = 'failed' WHERE status = 'partial' "
        "AND runs_queued = 0 AND runs_running = 0 "
        "AND runs_completed + runs_stopped = 0 AND runs_failed + runs_diverged > 0"
    )


def downgrade() -> None:
    # 0005's code knows no `failed` experiment: it called them partial.
    op.execute("UPDATE experiment SET status = 'partial' WHERE status = 'failed'")
