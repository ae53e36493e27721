"""Alembic environment: migrations run on the connection and transaction that
`service.storage.db.upgrade_database` opened and locked, so a whole upgrade commits or rolls back
at once.
"""

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError(
        "seedgrid migrations run through `seedgrid db upgrade` "
        "(service.storage.db.upgrade_database), "
        "which passes them a locked connection"
    )
context.configure(connection=connection)
with context.begin_transaction():
    context.run_migrations()
