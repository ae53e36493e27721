"""An experiment's metric catalogue, recorded at submission: its trainer's metrics,
diagnostics and declared metric bounds (service.specs.StoredCatalogue). The statistics,
params, compare and export of an experiment read it when its trainer's code is not loaded
(a service started without the `--trainers` file that ran it): before, they answered 500
(KeyError on the trainer's name). Null for the experiments stored before: those are read with
the metrics their completed runs recorded.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("experiment", sa.Column("catalogue", sa.JSON(), nullable=True))


def downgrade() -> None:
    # Native on PostgreSQL and on SQLite >= 3.35 (no index or constraint uses the column).
    op.execute("ALTER TABLE experiment DROP COLUMN catalogue")
