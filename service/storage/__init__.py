"""Storage: the tables, the engine and the schema migrations."""
