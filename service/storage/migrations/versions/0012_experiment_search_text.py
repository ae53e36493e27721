"""An experiment's search text: its name, note, tags and trainer, case-folded by Python, one
per line. `GET /experiments?q=` searched the tags' JSON text (`?q=[` matched every experiment)
and folded case with the database's lower(), which on SQLite folds only ASCII (`äöü` missed
`ÄÖÜ`); it now searches this column, the same on SQLite and PostgreSQL. Filled here for the
experiments stored before; kept by service.storage.db on every write of an experiment.

Revision ID: 0012
Revises: 0011
"""

import json

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None


def _search_text(name: str, note: str | None, tags: list[str], trainer: str) -> str:
    # as service.storage.db.search_text (a migration keeps its own copy: the code may change)
    return "\n".join([name, note or "", *tags, trainer]).casefold()


def upgrade() -> None:
    op.add_column(
        "experiment",
        sa.Column("search_text", sa.String(), nullable=False, server_default=""),
    )
    connection = op.get_bind()
    rows = connection.execute(
        sa.text("SELECT id, name, note, tags, trainer FROM experiment")
    ).fetchall()
    for id_, name, note, tags, trainer in rows:
        values = json.loads(tags) if isinstance(tags, str) else (tags or [])
        connection.execute(
            sa.text("UPDATE experiment SET search_text = :text WHERE id = :id"),
            {"text": _search_text(name, note, values, trainer), "id": id_},
        )


def downgrade() -> None:
    # Native on PostgreSQL and on SQLite >= 3.35 (no index or constraint uses the column).
    op.execute("ALTER TABLE experiment DROP COLUMN search_text")
