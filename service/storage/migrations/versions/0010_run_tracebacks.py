"""A failed run, and each failed attempt of it, keeps the full traceback of the exception that
ended it (`traceback`), beside its one-line `error`. Runs stored before have none.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("run", sa.Column("traceback", sa.String(), nullable=True))
    op.add_column("runattempt", sa.Column("traceback", sa.String(), nullable=True))


def downgrade() -> None:
    # 0009's code has no tracebacks; the one-line errors stay.
    # Native on PostgreSQL and on SQLite >= 3.35 (no index or constraint uses the columns).
    op.execute("ALTER TABLE runattempt DROP COLUMN traceback")
    op.execute("ALTER TABLE run DROP COLUMN traceback")
