"""An experiment carries the researcher's tags (a JSON list, empty for those stored before) and
a free-text note (null), set from the spec at submission and changed by PATCH
/experiments/{id}.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "experiment",
        sa.Column("tags", sa.JSON(), nullable=False, server_default=sa.text("'[]'")),
    )
    op.add_column("experiment", sa.Column("note", sa.String(), nullable=True))


def downgrade() -> None:
    # 0010's code has no tags or notes: they are lost.
    # Native on PostgreSQL and on SQLite >= 3.35 (no index or constraint uses the columns).
    op.execute("ALTER TABLE experiment DROP COLUMN note")
    op.execute("ALTER TABLE experiment DROP COLUMN tags")
