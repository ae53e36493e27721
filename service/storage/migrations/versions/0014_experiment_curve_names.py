"""The names of the metric curves an experiment's runs logged, kept as their points are
stored (service.scheduling.run_moves.record_points), so that GET /experiments/{id} reads one
row whatever the number of runs (before, a query over one run of each condition: 20 ms at
10,000 runs). Null for the experiments stored before: those are read from their points as
before.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("experiment", sa.Column("curve_names", sa.JSON(), nullable=True))


def downgrade() -> None:
    # Native on PostgreSQL and on SQLite >= 3.35 (no index or constraint uses the column).
    op.execute("ALTER TABLE experiment DROP COLUMN curve_names")
