"""Comparison results stored by the digest of their data (ComparisonResult), so that the
statistics after a restart, or on another replica, compute only the comparisons whose cells
changed since they were last computed (issue 38, item 1).

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "comparisonresult",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiment.id"]),
        sa.PrimaryKeyConstraint("experiment_id", "digest"),
    )


def downgrade() -> None:
    op.drop_table("comparisonresult")
