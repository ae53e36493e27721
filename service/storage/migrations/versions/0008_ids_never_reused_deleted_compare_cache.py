"""Ids are never reused: SQLite's experiment and run tables become AUTOINCREMENT (a rowid table
otherwise gives the next row max(id) + 1, so deleting the newest experiment handed its id, and
its runs' ids, to the next submission); PostgreSQL's sequences never go back, so nothing changes
there. An experiment can be marked `deleted` (every read treats it as gone while its rows are
removed in short batches: service.scheduling.purge). Stored /compare pages (comparecache), like the
statistics' statscache.

SQLite cannot add AUTOINCREMENT to a table: the two tables are rebuilt (alembic's batch mode:
a copy with every row, index and constraint, then renamed), with foreign keys off as SQLite's
procedure for a schema change asks (service.storage.db.upgrade_database turns them off and checks
every
reference before it commits). The ids already given stay as they are; the sequence starts
after the largest one present.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None

REBUILT = ("experiment", "run")


def _sqlite() -> bool:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return False
    if bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError(
            "migration 0008 rebuilds tables that others refer to: run it with "
            "SQLite's foreign keys off (service.storage.db.upgrade_database does)"
        )
    return True


def _rebuild(*, autoincrement: bool, deleted: sa.Column | None) -> None:
    """SQLite's experiment and run tables rebuilt with or without AUTOINCREMENT, the experiment
    with `deleted` added (a column) or dropped (None)."""
    for table in REBUILT:
        with op.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
        ) as batch:
            if table == "experiment":
                if deleted is not None:
                    batch.add_column(deleted)
                else:
                    batch.drop_column("deleted")
    # The copy reflects the claim index without its descending priority: made again as 0003 did.
    op.drop_index("ix_run_claim", table_name="run")
    op.create_index("ix_run_claim", "run", ["status", sa.desc(sa.column("priority")), "id"])


def upgrade() -> None:
    deleted: sa.Column[bool] = sa.Column(
        "deleted", sa.Boolean(), nullable=False, server_default=sa.false()
    )
    if _sqlite():
        _rebuild(autoincrement=True, deleted=deleted)
    else:
        op.add_column("experiment", deleted)
    op.create_table(
        "comparecache",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("a_id", sa.Integer(), nullable=False),
        sa.Column("b_id", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(), nullable=False),
        sa.Column("page", sa.String(), nullable=False),
        sa.Column("n_completed_a", sa.Integer(), nullable=False),
        sa.Column("n_completed_b", sa.Integer(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["a_id"], ["experiment.id"]),
        sa.ForeignKeyConstraint(["b_id"], ["experiment.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("a_id", "b_id", "metric", "page", name="uq_compare_page"),
    )
    op.create_index("ix_comparecache_b_id", "comparecache", ["b_id"])


def downgrade() -> None:
    op.drop_table("comparecache")
    # 0007's code knows no `deleted`: what a purge had not removed yet goes now, or the
    # experiments would come back.
    deleted = "SELECT id FROM experiment WHERE deleted"
    runs = f"SELECT id FROM run WHERE experiment_id IN ({deleted})"
    for statement in (
        f"DELETE FROM metricpoint WHERE run_id IN ({runs})",
        f"DELETE FROM runattempt WHERE run_id IN ({runs})",
        f"DELETE FROM statscache WHERE experiment_id IN ({deleted})",
        f"DELETE FROM run WHERE experiment_id IN ({deleted})",
        "DELETE FROM experiment WHERE deleted",
    ):
        op.execute(statement)
    if _sqlite():
        _rebuild(autoincrement=False, deleted=None)
    else:
        op.drop_column("experiment", "deleted")
