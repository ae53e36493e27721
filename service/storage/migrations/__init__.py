"""Alembic migrations of seedgrid's schema, shipped inside the package (see service.storage.db)."""
