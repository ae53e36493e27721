"""A run no longer stores its whole config (the experiment's spec holds the base config once);
stored variance statistics (statscache); an index that pages a run's curve in step order; text
that no response can encode (lone surrogates, which earlier versions accepted in specs and
stored as JSON escapes) replaced, so that every stored record reads back.

Revision ID: 0002
Revises: 0001
"""

import json
import re
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(value: Any) -> Any:
    """`value` with every lone surrogate, at any depth and in keys, replaced by U+FFFD."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _clean_json_column(table: str, column: str) -> None:
    bind = op.get_bind()
    for row_id, stored in bind.execute(sa.text(f"SELECT id, {column} FROM {table}")).all():
        value = json.loads(stored) if isinstance(stored, str) else stored
        cleaned = _clean(value)
        if cleaned != value:
            bind.execute(
                sa.text(f"UPDATE {table} SET {column} = :value WHERE id = :id"),
                {"value": json.dumps(cleaned), "id": row_id},
            )


def upgrade() -> None:
    # Where a client's text was stored: the spec, a run's condition (its error came from a
    # worker or a database, which send encodable text).
    _clean_json_column("experiment", "spec")
    _clean_json_column("run", "condition")
    # Native on PostgreSQL and on SQLite >= 3.35 (the column is in no index or constraint);
    # nothing is lost: experiment.spec holds the base config and run.condition the rest.
    op.execute("ALTER TABLE run DROP COLUMN config")
    op.create_index("ix_metric_run_step", "metricpoint", ["run_id", "step", "id"])
    op.create_table(
        "statscache",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(), nullable=False),
        sa.Column("page", sa.String(), nullable=False),
        sa.Column("n_completed", sa.Integer(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiment.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("experiment_id", "metric", "page", name="uq_stats_page"),
    )
    op.create_index("ix_statscache_experiment_id", "statscache", ["experiment_id"])


def downgrade() -> None:
    op.drop_table("statscache")
    op.drop_index("ix_metric_run_step", table_name="metricpoint")
    op.add_column("run", sa.Column("config", sa.JSON(), nullable=False, server_default="{}"))
    # Back to one config per run: the base config with the run's condition (revision 0001
    # stored it with the trainer's defaults filled in; those come back when the run is read).
    bind = op.get_bind()
    specs = {i: spec for i, spec in bind.execute(sa.text("SELECT id, spec FROM experiment"))}
    runs = bind.execute(sa.text("SELECT id, experiment_id, condition FROM run")).all()
    for run_id, experiment_id, condition in runs:
        spec = specs[experiment_id]
        spec = json.loads(spec) if isinstance(spec, str) else spec
        condition = json.loads(condition) if isinstance(condition, str) else condition
        bind.execute(
            sa.text("UPDATE run SET config = :config WHERE id = :id"),
            {"config": json.dumps({**spec.get("config", {}), **condition}), "id": run_id},
        )
