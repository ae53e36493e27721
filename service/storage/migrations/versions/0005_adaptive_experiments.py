"""Adaptive experiments: an experiment keeps the record of its looks and why it stopped
(`adaptive`, JSON, null for a plain experiment) and whether its next look is due (`deciding`).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("experiment", sa.Column("adaptive", sa.JSON(), nullable=True))
    op.add_column(
        "experiment", sa.Column("deciding", sa.Boolean(), nullable=False, server_default=sa.false())
    )


def downgrade() -> None:
    op.drop_column("experiment", "deciding")
    op.drop_column("experiment", "adaptive")
