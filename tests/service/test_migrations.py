"""Schema migrations (service/migrations) on a SQLite file and on a fresh PostgreSQL database:
the migrated schema is the models' schema, databases from before migrations are adopted,
concurrent start-ups migrate once, and `seedgrid db` reports clearly, bad URLs included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Integer, MetaData, create_engine, func, inspect, pool, text
from sqlmodel import Session, SQLModel, select

from api_schemas import ExperimentLabels, ExperimentSpec
from service.api.server import BackgroundServer
from service.experiments import (
    ExperimentFilter,
    cancel_experiment,
    create_experiment,
    delete_experiment,
    experiment_detail,
    label_experiment,
    list_experiments,
)
from service.scheduling.purge import purge_deleted
from service.settings import Settings
from service.storage.db import (
    INITIAL_REVISION,
    MIGRATIONS_DIR,
    DatabaseError,
    Run,
    SchemaUpgrade,
    database_revision,
    head_revision,
    make_engine,
    upgrade_database,
)
from tests.conftest import PostgresDatabases


@pytest.fixture
def new_database(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Callable[[str], str]:
    """`new_database(name)`: the URL of an empty database, a new SQLite file or a new database
    on the local PostgreSQL (dropped after the test)."""
    if backend == "sqlite":
        return lambda name: f"sqlite:///{tmp_path / name}.db"
    databases: PostgresDatabases = request.getfixturevalue("pg_databases")
    return databases.url


@pytest.fixture
def database_url(new_database: Callable[[str], str]) -> str:
    return new_database("seedgrid")


def create_all_like_seedgrid_0_1(database_url: str) -> None:
    """What the service did at start-up before it had migrations: seedgrid 0.1.0's tables,
    which are revision 0001's, with no alembic_version table."""
    engine = make_engine(database_url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, INITIAL_REVISION)
        connection.exec_driver_sql("DROP TABLE alembic_version")
    engine.dispose()


def create_all_of_the_models(database_url: str) -> None:
    engine = make_engine(database_url)
    SQLModel.metadata.create_all(engine)
    engine.dispose()


def metadata_diffs(database_url: str, metadata: MetaData) -> list[Any]:
    engine = create_engine(database_url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        diffs = compare_metadata(MigrationContext.configure(connection), metadata)
    engine.dispose()
    return diffs


def reflected_schema(database_url: str) -> dict[str, Any]:
    """Every table's columns (with the dialect's types), keys, indexes and unique constraints."""
    engine = create_engine(database_url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        db = inspect(connection)
        schema = {
            table: {
                "columns": [
                    (c["name"], repr(c["type"]), c["nullable"], c.get("default"))
                    for c in db.get_columns(table)
                ],
                "primary_key": db.get_pk_constraint(table)["constrained_columns"],
                "foreign_keys": sorted(
                    (fk["constrained_columns"], fk["referred_table"], fk["referred_columns"])
                    for fk in db.get_foreign_keys(table)
                ),
                "indexes": sorted(
                    (ix["name"], ix["column_names"], ix["unique"]) for ix in db.get_indexes(table)
                ),
                "unique": sorted(
                    (uc["name"], uc["column_names"]) for uc in db.get_unique_constraints(table)
                ),
            }
            for table in sorted(set(db.get_table_names()) - {"alembic_version"})
        }
    engine.dispose()
    return schema


def test_migrated_schema_is_the_models_schema(
    database_url: str, new_database: Callable[[str], str]
) -> None:
    done = upgrade_database(database_url)
    assert done == SchemaUpgrade(before=None, after=head_revision(), stamped=False)
    assert database_revision(database_url) == head_revision()

    # The guard that a model change comes with its migration: Alembic's autogenerate finds
    # nothing to add, drop or alter between the migrated database and SQLModel.metadata.
    assert metadata_diffs(database_url, SQLModel.metadata) == []
    changed = MetaData()
    for table in SQLModel.metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["run"].append_column(Column("gpu_hours", Integer))
    assert [d[0] for d in metadata_diffs(database_url, changed)] == ["add_column"]

    # ...and what the migrations build is exactly what create_all builds of the models, types
    # included.
    models_url = new_database("create_all")
    create_all_of_the_models(models_url)
    assert reflected_schema(database_url) == reflected_schema(models_url)
    assert set(reflected_schema(database_url)) == {
        "experiment",
        "run",
        "runattempt",
        "metricpoint",
        "statscache",
        "comparecache",
        "comparisonresult",
    }
    if database_url.startswith("sqlite"):
        # what reflection does not show: an index's column order (the claim index's descending
        # priority) and the tables whose ids are never reused
        migrated, made = sqlite_schema(database_url), sqlite_schema(models_url)
        assert migrated["index"] == made["index"]
        assert sorted(t for t, sql in migrated["table"].items() if "AUTOINCREMENT" in sql) == [
            "experiment",
            "run",
        ]


def sqlite_schema(database_url: str) -> dict[str, dict[str, str]]:
    """SQLite's own text of every table and index (sqlite_master), by kind and name."""
    engine = create_engine(database_url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        rows = connection.exec_driver_sql(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL "
            "AND name != 'alembic_version'"
        ).all()
    engine.dispose()
    schema: dict[str, dict[str, str]] = {"table": {}, "index": {}}
    for kind, name, sql in rows:
        schema[kind][name] = sql
    return schema


def test_downgrade_to_nothing_and_back(database_url: str) -> None:
    upgrade_database(database_url)
    _migrate(database_url, "base", down=True)
    engine = make_engine(database_url)
    assert set(inspect(engine).get_table_names()) - {"alembic_version"} == set()
    engine.dispose()
    assert upgrade_database(database_url).before is None
    assert metadata_diffs(database_url, SQLModel.metadata) == []


def test_downgrade_to_0001_gives_every_run_its_config_back(database_url: str) -> None:
    upgrade_database(database_url)
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO experiment (name, trainer, spec, metric, status, priority, "
            "n_conditions, n_runs, cancel_requested, created_at) VALUES ('e', 'collapse', "
            "'{\"config\": {\"steps\": 50, \"r\": 0.1}}', 'min_l2', 'queued', 0, 1, 1, false, "
            "'2026-01-01 00:00:00')"
        )
        connection.exec_driver_sql(
            "INSERT INTO run (experiment_id, condition_key, condition, seed, trainer, status, "
            "priority, attempts, max_retries, num_cpus, num_gpus, cancel_requested, metrics, "
            "diagnostics, warnings, provenance, created_at) SELECT id, 'r=0.5', '{\"r\": 0.5}', "
            "0, 'collapse', 'queued', 0, 0, 2, 1, 0, false, '{}', '{}', '[]', '{}', "
            "'2026-01-01 00:00:00' FROM experiment"
        )
    engine.dispose()
    _migrate(database_url, INITIAL_REVISION, down=True)
    engine = make_engine(database_url)
    with engine.begin() as connection:
        (stored,) = connection.exec_driver_sql("SELECT config FROM run").scalars().all()
    engine.dispose()
    assert (json.loads(stored) if isinstance(stored, str) else stored) == {"steps": 50, "r": 0.5}
    assert upgrade_database(database_url).after == head_revision()
    assert metadata_diffs(database_url, SQLModel.metadata) == []


def test_tables_from_before_migrations_are_stamped_not_recreated(database_url: str) -> None:
    create_all_like_seedgrid_0_1(database_url)
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO experiment (name, trainer, spec, metric, status, priority, "
            "n_conditions, n_runs, cancel_requested, created_at) VALUES ('old', 'collapse', "
            "'{\"config\": {\"steps\": 50}}', 'min_l2', 'completed', 0, 1, 1, false, "
            "'2026-01-01 00:00:00')"
        )
        connection.exec_driver_sql(
            "INSERT INTO run (experiment_id, condition_key, condition, seed, config, trainer, "
            "status, priority, attempts, max_retries, num_cpus, num_gpus, cancel_requested, "
            "metrics, diagnostics, warnings, provenance, created_at) SELECT id, 'r=0.5', "
            "'{\"r\": 0.5}', 3, '{\"steps\": 50, \"r\": 0.5}', 'collapse', 'completed', 0, 1, "
            "2, 1, 0, false, '{\"min_l2\": 0.25}', '{}', '[]', '{}', '2026-01-01 00:00:00' "
            "FROM experiment"
        )
    assert database_revision(database_url) is None

    done = upgrade_database(database_url)
    assert done == SchemaUpgrade(before=None, after=head_revision(), stamped=True)
    with engine.connect() as connection:
        names = connection.exec_driver_sql("SELECT name FROM experiment").scalars().all()
        versions = connection.exec_driver_sql("SELECT version_num FROM alembic_version").all()
        runs = connection.exec_driver_sql("SELECT condition_key, seed, status FROM run").all()
    engine.dispose()
    # stamped at 0001, then migrated to head with the rows kept (a run's config now comes from
    # its experiment's spec and its condition)
    assert names == ["old"] and versions == [(head_revision(),)]
    assert runs == [("r=0.5", 3, "completed")]
    assert upgrade_database(database_url) == SchemaUpgrade(
        before=head_revision(), after=head_revision(), stamped=False
    )


def test_some_seedgrid_tables_without_alembic_version_are_refused(database_url: str) -> None:
    engine = make_engine(database_url)
    SQLModel.metadata.tables["experiment"].create(engine)
    engine.dispose()
    with pytest.raises(DatabaseError) as error:
        upgrade_database(database_url)
    message = str(error.value)
    assert "has seedgrid tables experiment but not metricpoint, run, runattempt" in message
    assert "\n" not in message
    assert database_revision(database_url) is None  # and nothing was half-done


# Starts, says "ready", waits for "go" on stdin, migrates, prints where the database was.
START_UP = """
import sys
from service.storage.db import upgrade_database
print("ready", flush=True)
sys.stdin.readline()
print(upgrade_database(sys.argv[1]).before, flush=True)
"""


def test_processes_starting_together_migrate_a_new_database_once(database_url: str) -> None:
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", START_UP, database_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline() == "ready\n"
        for process in processes:  # all at once, as replicas of one deployment start
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        outcomes = [process.communicate(timeout=120) for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert [p.returncode for p in processes] == [0] * 3, [err for _, err in outcomes]
    head = head_revision()
    assert sorted(out.strip() for out, _ in outcomes) == sorted(["None"] + [head] * 2)
    assert metadata_diffs(database_url, SQLModel.metadata) == []


def test_threads_migrating_different_databases_at_once_do_not_mix_them(tmp_path: Path) -> None:
    urls = [f"sqlite:///{tmp_path / f'db{i}.db'}" for i in range(4)]
    barrier = threading.Barrier(len(urls))
    errors: list[BaseException] = []

    def start_up(url: str) -> None:
        barrier.wait()
        try:
            upgrade_database(url)
        except BaseException as exc:  # collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=start_up, args=(url,)) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    for url in urls:
        assert database_revision(url) == head_revision()
        assert metadata_diffs(url, SQLModel.metadata) == []


def test_service_started_on_a_database_from_before_migrations_serves_its_data(
    database_url: str,
) -> None:
    create_all_like_seedgrid_0_1(database_url)
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO experiment (name, trainer, spec, metric, status, priority, "
            "n_conditions, n_runs, cancel_requested, created_at) VALUES ('old', 'collapse', "
            "'{}', 'min_l2', 'completed', 0, 1, 0, false, '2026-01-01 00:00:00')"
        )
    engine.dispose()
    with BackgroundServer(Settings(database_url=database_url), dispatch=False) as server:
        listed = httpx.get(f"{server.url}/experiments", timeout=30).json()
    assert [e["name"] for e in listed] == ["old"]
    assert database_revision(database_url) == head_revision()


def test_text_an_earlier_version_stored_unencodable_is_made_readable(database_url: str) -> None:
    """Seedgrid 0.1.0 accepted a lone surrogate in a config string and stored it as a JSON
    escape; reading it back then gave a 500 for ever. Migration 0002 replaces it."""
    create_all_like_seedgrid_0_1(database_url)
    engine = make_engine(database_url)
    spec = (
        '{"name": "poisoned", "trainer": "collapse", "grid": {"loss": ["mse"]}, '
        '"config": {"data_root": "/x\\udc80", "\\ud800": 1}, "seeds": 1}'
    )
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO experiment (name, trainer, spec, metric, status, priority, "
            "n_conditions, n_runs, cancel_requested, created_at) VALUES ('poisoned', "
            f"'collapse', '{spec}', 'min_l2', 'partial', 0, 1, 1, false, "
            "'2026-01-01 00:00:00')"
        )
        connection.exec_driver_sql(
            "INSERT INTO run (experiment_id, condition_key, condition, seed, config, trainer, "
            "status, priority, attempts, max_retries, num_cpus, num_gpus, cancel_requested, "
            "metrics, diagnostics, warnings, provenance, created_at) SELECT id, 'loss=mse', "
            "'{\"loss\": \"mse\\udfff\"}', 0, '{}', 'collapse', 'failed', 0, 1, 2, 1, 0, "
            "false, '{}', '{}', '[]', '{}', '2026-01-01 00:00:00' FROM experiment"
        )
    engine.dispose()
    with BackgroundServer(Settings(database_url=database_url), dispatch=False) as server:
        detail = httpx.get(f"{server.url}/experiments/1", timeout=30)
        runs = httpx.get(f"{server.url}/experiments/1/runs", timeout=30)
        run = httpx.get(f"{server.url}/runs/1", timeout=30)
    assert (detail.status_code, runs.status_code, run.status_code) == (200, 200, 200)
    assert detail.json()["spec"]["config"] == {"data_root": "/x\ufffd", "\ufffd": 1}
    assert runs.json()[0]["condition"] == {"loss": "mse\ufffd"}


def _migrate(database_url: str, revision: str, *, down: bool = False) -> None:
    engine = make_engine(database_url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        if connection.dialect.name == "sqlite":  # as upgrade_database migrates (service.storage.db)
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        config.attributes["connection"] = connection
        (command.downgrade if down else command.upgrade)(config, revision)
    engine.dispose()


def _insert_run_of_0003(connection: Any, seed: int, trainer: str, status: str) -> None:
    """A run row as revisions 0003-0006 store it (no config column), of the one experiment."""
    connection.exec_driver_sql(
        "INSERT INTO run (experiment_id, condition_key, condition, seed, trainer, "
        "status, priority, attempts, max_retries, num_cpus, num_gpus, cancel_requested, "
        "metrics, diagnostics, warnings, provenance, created_at) SELECT id, '', '{}', "
        f"{seed}, '{trainer}', '{status}', 0, 1, 2, 1, 0, false, '{{}}', '{{}}', '[]', "
        "'{}', '2026-01-01 00:00:00' FROM experiment"
    )


def test_0004_counts_stopped_runs_and_its_downgrade_makes_them_failed(database_url: str) -> None:
    """0004 adds the experiment's runs_stopped (0 for a database 0003 kept); going back to
    0003, which knows no `stopped`, a stopped run becomes failed with the reason, its count
    and attempt move with it, and an experiment completed by stopped runs becomes partial."""
    _migrate(database_url, "0003")
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO experiment (name, trainer, spec, metric, status, priority, "
            "n_conditions, n_runs, cancel_requested, created_at, runs_completed) VALUES ('e', "
            "'feedback', '{}', 'test_accuracy', 'completed', 0, 1, 2, false, "
            "'2026-01-01 00:00:00', 2)"
        )
        for seed in (0, 1):
            _insert_run_of_0003(connection, seed, "feedback", "completed")
    engine.dispose()
    assert upgrade_database(database_url) == SchemaUpgrade(
        before="0003", after=head_revision(), stamped=False
    )
    engine = make_engine(database_url)
    with engine.begin() as connection:
        assert connection.exec_driver_sql(
            "SELECT runs_completed, runs_stopped FROM experiment"
        ).all() == [(2, 0)]
        # what 0004's service writes when seed 1 stops on its check
        connection.exec_driver_sql("UPDATE run SET status = 'stopped' WHERE seed = 1")
        connection.exec_driver_sql("UPDATE experiment SET runs_completed = 1, runs_stopped = 1")
        connection.exec_driver_sql(
            "INSERT INTO runattempt (run_id, attempt, outcome, started_at) SELECT id, 1, "
            "'stopped', '2026-01-01 00:00:00' FROM run WHERE seed = 1"
        )
    engine.dispose()
    _migrate(database_url, "0003", down=True)
    engine = make_engine(database_url)
    with engine.begin() as connection:
        assert connection.exec_driver_sql(
            "SELECT status, runs_completed, runs_failed FROM experiment"
        ).all() == [("partial", 1, 1)]
        assert connection.exec_driver_sql(
            "SELECT seed, status, error FROM run ORDER BY seed"
        ).all() == [
            (0, "completed", None),
            (1, "failed", "stopped early by a check its spec asked to stop on (status 'stopped')"),
        ]
        assert connection.exec_driver_sql("SELECT outcome FROM runattempt").all() == [("failed",)]
    engine.dispose()
    upgrade_database(database_url)
    assert metadata_diffs(database_url, SQLModel.metadata) == []


def seedgrid(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_db_upgrade_and_current_commands(tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    head = head_revision()
    # `db current` reads only: no file, no database made
    missing = seedgrid("db", "current", "--database-url", database_url)
    assert missing.returncode == 2 and not (tmp_path / "seedgrid.db").exists()
    assert f"there is no database at {tmp_path / 'seedgrid.db'}" in missing.stderr
    (tmp_path / "seedgrid.db").touch()  # an empty SQLite database
    before = seedgrid("db", "current", "--database-url", database_url)
    assert before.returncode == 0, before.stderr
    assert "no alembic_version table" in before.stdout

    first = seedgrid("db", "upgrade", env={"SEEDGRID_DATABASE_URL": database_url})
    assert first.returncode == 0, first.stderr
    assert f"schema upgraded from an empty database to {head}" in first.stdout
    again = seedgrid("db", "upgrade", "--database-url", database_url)
    assert again.returncode == 0 and f"schema at revision {head}, up to date" in again.stdout
    current = seedgrid("db", "current", "--database-url", database_url)
    assert current.returncode == 0 and f"revision {head} (head)" in current.stdout
    assert metadata_diffs(database_url, SQLModel.metadata) == []


def test_db_upgrade_command_stamps_a_database_from_before_migrations(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    create_all_like_seedgrid_0_1(url)
    result = seedgrid("db", "upgrade", "--database-url", url)
    assert result.returncode == 0, result.stderr
    assert f"tables made before migrations stamped at revision {INITIAL_REVISION}" in result.stdout
    assert database_revision(url) == head_revision()


@pytest.mark.parametrize(
    ("url", "shown", "reason"),
    [
        (
            "postgresql+psycopg://seedgrid:hunter2@127.0.0.1:1/seedgrid",
            "postgresql+psycopg://seedgrid:***@127.0.0.1:1/seedgrid",
            "Connection refused",
        ),
        (
            "postgresql+psycopg://postgres@127.0.0.1:5432/no_such_seedgrid_db",
            "postgresql+psycopg://postgres@127.0.0.1:5432/no_such_seedgrid_db",
            'database "no_such_seedgrid_db" does not exist',
        ),
        (
            "sqlite:////no/such/directory/seedgrid.db",
            "sqlite:////no/such/directory/seedgrid.db",
            "unable to open database file",
        ),
    ],
)
def test_unreachable_database_is_one_line_naming_the_url(url: str, shown: str, reason: str) -> None:
    for read in (upgrade_database, database_revision):
        with pytest.raises(DatabaseError) as error:
            read(url)
        message = str(error.value)
        assert message.startswith(f"cannot connect to the database {shown}: ")
        assert reason in message and "\n" not in message and "hunter2" not in message


def test_serve_and_db_upgrade_on_an_unreachable_database_stop_with_one_line() -> None:
    url = "postgresql+psycopg://seedgrid:hunter2@127.0.0.1:1/seedgrid"
    for result in (
        seedgrid("serve", env={"SEEDGRID_DATABASE_URL": url}),
        seedgrid("db", "upgrade", "--database-url", url),
    ):
        assert result.returncode == 2
        assert result.stderr.startswith(
            "error: cannot connect to the database postgresql+psycopg://seedgrid:***@127.0.0.1:1/"
            "seedgrid: "
        )
        assert "Connection refused" in result.stderr and result.stderr.count("\n") == 1
        assert "hunter2" not in result.stderr + result.stdout
        assert "Traceback" not in result.stderr


def test_bad_database_url_option_is_named() -> None:
    result = seedgrid("db", "upgrade", "--database-url", "mysql://db/seedgrid")
    assert result.returncode == 2
    assert "--database-url" in result.stderr and "mysql" in result.stderr
    assert "Traceback" not in result.stderr


def test_0006_makes_all_failed_experiments_failed_and_its_downgrade_partial(
    database_url: str,
) -> None:
    """Ended under 0005's rule, an experiment none of whose runs completed is `partial`; 0006
    makes it `failed` as the runs store now derives it, and leaves every other one alone."""
    _migrate(database_url, "0005")
    engine = make_engine(database_url)
    # name, status, then its runs completed, stopped, failed, diverged, cancelled
    rows = [
        ("all-failed", "partial", 0, 0, 2, 1, 0),
        ("some-completed", "partial", 1, 0, 2, 0, 0),
        ("all-stopped", "completed", 0, 3, 0, 0, 0),
        ("all-cancelled", "partial", 0, 0, 0, 0, 3),
        ("cancelled", "cancelled", 0, 0, 3, 0, 0),
    ]
    with engine.begin() as connection:
        for name, status, completed, stopped, failed, diverged, cancelled in rows:
            connection.exec_driver_sql(
                "INSERT INTO experiment (name, trainer, spec, metric, status, priority, "
                "n_conditions, n_runs, cancel_requested, created_at, runs_completed, "
                "runs_stopped, runs_failed, runs_diverged, runs_cancelled) VALUES "
                f"('{name}', 'collapse', '{{}}', 'min_l2', '{status}', 0, 1, 3, "
                f"{'true' if status == 'cancelled' else 'false'}, '2026-01-01 00:00:00', "
                f"{completed}, {stopped}, {failed}, {diverged}, {cancelled})"
            )
    engine.dispose()
    upgrade_database(database_url)

    def statuses() -> dict[str, str]:
        engine = make_engine(database_url)
        with engine.begin() as connection:
            found = dict(connection.exec_driver_sql("SELECT name, status FROM experiment").all())
        engine.dispose()
        return found

    assert statuses() == {
        "all-failed": "failed",
        "some-completed": "partial",
        "all-stopped": "completed",
        "all-cancelled": "partial",
        "cancelled": "cancelled",
    }
    _migrate(database_url, "0005", down=True)
    assert statuses()["all-failed"] == "partial"
    upgrade_database(database_url)
    assert metadata_diffs(database_url, SQLModel.metadata) == []


def test_0007_counts_pending_runs_and_its_downgrade_makes_them_running(database_url: str) -> None:
    """0007 adds the experiment's runs_pending (0 for a database 0006 kept: its running runs
    stay running, for the next dispatcher to re-queue); going back to 0006, which knows no
    `pending`, a pending run is running again (handed to Ray) and its count moves with it."""
    _migrate(database_url, "0006")
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO experiment (name, trainer, spec, metric, status, priority, "
            "n_conditions, n_runs, cancel_requested, created_at, runs_queued, runs_running) "
            "VALUES ('e', 'collapse', '{}', 'min_l2', 'running', 0, 1, 3, false, "
            "'2026-01-01 00:00:00', 1, 2)"
        )
        for seed, status in ((0, "running"), (1, "running"), (2, "queued")):
            _insert_run_of_0003(connection, seed, "collapse", status)
    engine.dispose()
    assert upgrade_database(database_url) == SchemaUpgrade(
        before="0006", after=head_revision(), stamped=False
    )
    engine = make_engine(database_url)
    with engine.begin() as connection:
        assert connection.exec_driver_sql(
            "SELECT runs_queued, runs_pending, runs_running FROM experiment"
        ).all() == [(1, 0, 2)]
        assert connection.exec_driver_sql("SELECT seed, status FROM run ORDER BY seed").all() == [
            (0, "running"),
            (1, "running"),
            (2, "queued"),
        ]
        # what 0007's service writes when it hands seed 2 to Ray
        connection.exec_driver_sql("UPDATE run SET status = 'pending' WHERE seed = 2")
        connection.exec_driver_sql("UPDATE experiment SET runs_queued = 0, runs_pending = 1")
    engine.dispose()
    _migrate(database_url, "0006", down=True)
    engine = make_engine(database_url)
    with engine.begin() as connection:
        assert connection.exec_driver_sql(
            "SELECT status, runs_queued, runs_running FROM experiment"
        ).all() == [("running", 0, 3)]
        assert connection.exec_driver_sql("SELECT seed, status FROM run ORDER BY seed").all() == [
            (0, "running"),
            (1, "running"),
            (2, "running"),
        ]
    engine.dispose()
    upgrade_database(database_url)
    assert metadata_diffs(database_url, SQLModel.metadata) == []


def _rows(database_url: str) -> dict[str, list[tuple[Any, ...]]]:
    engine = make_engine(database_url)
    with engine.connect() as connection:
        rows = {
            table: [
                tuple(row)
                for row in connection.exec_driver_sql(f"SELECT * FROM {table} ORDER BY id")
            ]
            for table in ("experiment", "run", "runattempt", "metricpoint", "statscache")
        }
    engine.dispose()
    return rows


def test_0008_keeps_every_row_and_an_id_is_never_given_twice(database_url: str) -> None:
    """0008 rebuilds SQLite's experiment and run tables so that their ids are never reused,
    keeping every row of every table (and of those that refer to them); after it, the newest
    experiment deleted, the next submission gets a new experiment id and new run ids (on
    SQLite they were max(id) + 1: the deleted experiment's, and its runs')."""
    _migrate(database_url, "0007")
    engine = make_engine(database_url)
    with engine.begin() as connection:
        for name in ("old", "newest"):
            connection.exec_driver_sql(
                "INSERT INTO experiment (name, trainer, spec, metric, status, priority, "
                "n_conditions, n_runs, cancel_requested, created_at, runs_completed) VALUES "
                f"('{name}', 'collapse', '{{\"config\": {{\"steps\": 50}}}}', 'min_l2', "
                "'completed', 0, 1, 2, false, '2026-01-01 00:00:00', 2)"
            )
            for seed in (0, 1):
                connection.exec_driver_sql(
                    "INSERT INTO run (experiment_id, condition_key, condition, seed, trainer, "
                    "status, priority, attempts, max_retries, num_cpus, num_gpus, "
                    "cancel_requested, metrics, diagnostics, warnings, provenance, created_at) "
                    f"SELECT max(id), '', '{{}}', {seed}, 'collapse', 'completed', 0, 1, 2, 1, "
                    "0, false, '{\"min_l2\": 0.5}', '{}', '[]', '{}', '2026-01-01 00:00:00' "
                    "FROM experiment"
                )
        connection.exec_driver_sql(
            "INSERT INTO runattempt (run_id, attempt, outcome, started_at) SELECT id, 1, "
            "'completed', '2026-01-01 00:00:00' FROM run"
        )
        for step in range(3):
            connection.exec_driver_sql(
                "INSERT INTO metricpoint (run_id, step, name, value) SELECT id, "
                f"{step}, 'min_l2', {step / 10} FROM run"
            )
        connection.exec_driver_sql(
            "INSERT INTO statscache (experiment_id, metric, page, n_completed, payload, "
            "computed_at) SELECT id, 'min_l2', 'p', 2, '{}', '2026-01-01 00:00:00' "
            "FROM experiment"
        )
    engine.dispose()
    before = _rows(database_url)
    assert upgrade_database(database_url).before == "0007"
    after = _rows(database_url)
    # 0008's deleted, 0009's stop_message (no run of these was stopped), 0010's tracebacks
    # (none failed), 0011's tags and note, 0012's search text (name, no note, trainer), 0013's
    # catalogue (none recorded before it), 0014's curve names (read from the points before it)
    assert [(*row[:-5], _json(row[-5]), *row[-4:]) for row in after["experiment"]] == [
        (*row, False, None, [], None, f"{row[1]}\n\n{row[2]}", None, None)
        for row in before["experiment"]
    ]
    for table in ("run", "runattempt"):
        assert after[table] == [(*row, None) for row in before[table]]
    grown = {"experiment", "run", "runattempt"}
    assert {t: r for t, r in after.items() if t not in grown} == {
        t: r for t, r in before.items() if t not in grown
    }
    assert metadata_diffs(database_url, SQLModel.metadata) == []

    (newest_id, _), (old_id, _) = [(r[0], r[1]) for r in reversed(before["experiment"])]
    newest_runs = [r[0] for r in before["run"] if r[1] == newest_id]
    engine = make_engine(database_url)
    with Session(engine) as session:
        delete_experiment(session=session, experiment_id=newest_id)
        assert purge_deleted(engine) == [newest_id]
        spec = ExperimentSpec.model_validate(
            {"name": "next", "trainer": "collapse", "config": {"steps": 50}, "seeds": 2}
        )
        created = create_experiment(
            session=session, spec=spec, settings=Settings(database_url=database_url)
        )
        run_ids = session.exec(select(Run.id).where(Run.experiment_id == created.id)).all()
        assert created.id == newest_id + 1
        assert min(run_ids) > max(newest_runs)
        # the older experiment's rows are untouched
        assert (
            session.exec(
                select(func.count()).select_from(Run).where(Run.experiment_id == old_id)
            ).one()
            == 2
        )
    engine.dispose()
    assert _rows(database_url)["metricpoint"] == [
        r for r in before["metricpoint"] if r[1] not in newest_runs
    ]


def test_0008_downgrade_removes_what_a_purge_left_and_gives_ids_back_their_old_rule(
    database_url: str,
) -> None:
    """Going back to 0007, which knows no `deleted`, an experiment marked deleted whose rows a
    purge had not removed yet goes with them (it would come back otherwise); the rebuilt tables
    keep the other rows; upgrading again gives the models' schema."""
    upgrade_database(database_url)
    engine = make_engine(database_url)
    with Session(engine) as session:
        settings = Settings(database_url=database_url)
        for name in ("kept", "deleted"):
            spec = ExperimentSpec.model_validate(
                {"name": name, "trainer": "collapse", "config": {"steps": 50}, "seeds": 2}
            )
            experiment = create_experiment(session=session, spec=spec, settings=settings)
        cancel_experiment(session=session, experiment_id=experiment.id)
        delete_experiment(session=session, experiment_id=experiment.id)  # marked, not purged
    engine.dispose()
    _migrate(database_url, "0007", down=True)
    rows = _rows(database_url)
    assert [r[1] for r in rows["experiment"]] == ["kept"]
    assert [r[1] for r in rows["run"]] == [rows["experiment"][0][0]] * 2
    if database_url.startswith("sqlite"):
        assert not any(
            "AUTOINCREMENT" in sql for sql in sqlite_schema(database_url)["table"].values()
        )
    upgrade_database(database_url)
    assert metadata_diffs(database_url, SQLModel.metadata) == []
    assert _rows(database_url)["run"] == [(*row, None) for row in rows["run"]]  # 0010: traceback


STOPPED = "cancelled: the experiment "  # the prefix of a run error the first-failures stop set


def test_0009_gives_a_stopped_experiment_its_stop_message_from_its_runs_errors(
    database_url: str,
) -> None:
    """0009 moves the first-failures stop's message from the errors of the runs it cancelled
    (kept as they are) into the experiment's stop_message, read as the service read it: only
    of an experiment with a failed run, the prefix stripped; the other experiments get none."""
    _migrate(database_url, "0008")
    message = "stopped after its first 2 runs failed: RuntimeError: boom"
    # name, runs_failed, then its runs' status and error
    experiments = [
        (
            "stopped",
            2,
            [
                ("failed", "RuntimeError: boom"),
                ("failed", "RuntimeError: boom"),
                ("cancelled", STOPPED + message),
                ("cancelled", STOPPED + message),
            ],
        ),
        ("cancelled", 0, [("cancelled", "cancelled before start")]),
        ("no-failure", 0, [("completed", STOPPED + "is a trainer's own words")]),
        ("failed", 1, [("failed", "RuntimeError: boom"), ("completed", None)]),
    ]
    engine = make_engine(database_url)
    with engine.begin() as connection:
        for name, failed, runs in experiments:
            spec = json.dumps({"name": name, "trainer": "collapse", "config": {"steps": 50}})
            connection.execute(
                text(
                    "INSERT INTO experiment (name, trainer, spec, metric, status, priority, "
                    "n_conditions, n_runs, cancel_requested, created_at, runs_failed) VALUES "
                    "(:name, 'collapse', :spec, 'min_l2', 'failed', 0, 1, :n, false, "
                    "'2026-01-01 00:00:00', :failed)"
                ),
                {"name": name, "spec": spec, "n": len(runs), "failed": failed},
            )
            for seed, (status, error) in enumerate(runs):
                connection.execute(
                    text(
                        "INSERT INTO run (experiment_id, condition_key, condition, seed, trainer, "
                        "status, priority, attempts, max_retries, num_cpus, num_gpus, "
                        "cancel_requested, metrics, diagnostics, warnings, provenance, error, "
                        "created_at) SELECT id, '', '{}', :seed, 'collapse', :status, 0, 1, 2, 1, "
                        "0, false, '{}', '{}', '[]', '{}', :error, '2026-01-01 00:00:00' "
                        "FROM experiment WHERE name = :name"
                    ),
                    {"seed": seed, "status": status, "error": error, "name": name},
                )
    engine.dispose()
    errors_before = _rows(database_url)["run"]
    assert upgrade_database(database_url).before == "0008"

    def stop_messages() -> dict[str, str | None]:
        engine = make_engine(database_url)
        with engine.connect() as connection:
            found = dict(
                connection.exec_driver_sql("SELECT name, stop_message FROM experiment").all()
            )
        engine.dispose()
        return found

    assert stop_messages() == {
        "stopped": message,
        "cancelled": None,
        "no-failure": None,
        "failed": None,
    }
    # the runs' errors are kept (and 0010 gave them no traceback)
    assert _rows(database_url)["run"] == [(*row, None) for row in errors_before]
    engine = make_engine(database_url)
    with Session(engine) as session:
        assert [
            experiment_detail(session=session, experiment_id=i).message for i in (1, 2, 3, 4)
        ] == [message, None, None, None]
    engine.dispose()
    _migrate(database_url, "0008", down=True)
    upgrade_database(database_url)
    assert stop_messages()["stopped"] == message
    assert metadata_diffs(database_url, SQLModel.metadata) == []


def test_0010_adds_empty_tracebacks_and_its_downgrade_keeps_the_errors(database_url: str) -> None:
    """0010 gives runs and attempts a `traceback` column, null for those stored before; going
    back to 0009 drops it and keeps every run's one-line error."""
    _migrate(database_url, "0009")
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO experiment (name, trainer, spec, metric, status, priority, "
            "n_conditions, n_runs, cancel_requested, created_at, runs_failed) VALUES "
            "('x', 'collapse', '{}', 'min_l2', 'failed', 0, 1, 1, false, "
            "'2026-01-01 00:00:00', 1)"
        )
        connection.exec_driver_sql(
            "INSERT INTO run (experiment_id, condition_key, condition, seed, trainer, status, "
            "priority, attempts, max_retries, num_cpus, num_gpus, cancel_requested, metrics, "
            "diagnostics, warnings, provenance, error, created_at) SELECT id, '', '{}', 0, "
            "'collapse', 'failed', 0, 1, 2, 1, 0, false, '{}', '{}', '[]', '{}', "
            "'RuntimeError: boom', '2026-01-01 00:00:00' FROM experiment"
        )
    engine.dispose()
    before = _rows(database_url)["run"]
    assert upgrade_database(database_url).before == "0009"
    assert _rows(database_url)["run"] == [(*row, None) for row in before]
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.exec_driver_sql("UPDATE run SET traceback = 'Traceback ...'")
    engine.dispose()
    _migrate(database_url, "0009", down=True)
    assert _rows(database_url)["run"] == before
    upgrade_database(database_url)
    assert metadata_diffs(database_url, SQLModel.metadata) == []


def test_0011_gives_existing_experiments_no_tags_and_they_can_be_tagged_and_found(
    database_url: str,
) -> None:
    """0011 adds an experiment's tags (empty for those stored before) and note (null); the
    service then lists the old experiments, tags one and finds it by its tag and its note;
    going back to 0010 drops both and keeps every experiment."""
    _migrate(database_url, "0010")
    engine = make_engine(database_url)
    with engine.begin() as connection:
        for name in ("old-a", "old-b"):
            spec = json.dumps({"name": name, "trainer": "collapse", "config": {"steps": 50}})
            connection.execute(
                text(
                    "INSERT INTO experiment (name, trainer, spec, metric, status, priority, "
                    "n_conditions, n_runs, cancel_requested, created_at, runs_completed) VALUES "
                    "(:name, 'collapse', :spec, 'min_l2', 'completed', 0, 1, 1, false, "
                    "'2026-01-01 00:00:00', 1)"
                ),
                {"name": name, "spec": spec},
            )
    engine.dispose()
    before = _rows(database_url)["experiment"]
    assert upgrade_database(database_url).before == "0010"
    after = _rows(database_url)["experiment"]
    # tags come back as the stored JSON text on SQLite, parsed on PostgreSQL; 0012's search
    # text, 0013's catalogue (none recorded) and 0014's curve names (none kept) last
    assert [(*row[:-5], _json(row[-5]), *row[-4:]) for row in after] == [
        (*row, [], None, f"{row[1]}\n\ncollapse", None, None) for row in before
    ]

    engine = make_engine(database_url)
    with Session(engine) as session:
        assert [s.tags for s in list_experiments(session=session, limit=10, offset=0)] == [[], []]
        label_experiment(
            session=session,
            experiment_id=1,
            labels=ExperimentLabels(tags=["baseline", "lr_0.1"], note="First Sweep"),
        )
        label_experiment(session=session, experiment_id=2, labels=ExperimentLabels(tags=["lrx0.1"]))
        found = {
            only: [s.name for s in list_experiments(session=session, limit=10, offset=0, only=only)]
            for only in (
                ExperimentFilter(tags=("baseline",)),
                # LIKE's wildcard _ is matched literally: not lrx0.1
                ExperimentFilter(tags=("lr_0.1", "baseline")),
                ExperimentFilter(tags=("lrx0.1",)),
                ExperimentFilter(text="first sweep"),
                ExperimentFilter(text="LRX"),
                ExperimentFilter(created_after=datetime(2025, 12, 31), tags=("baseline",)),
                ExperimentFilter(created_before=datetime(2025, 12, 31)),
            )
        }
        assert list(found.values()) == [
            ["old-a"],
            ["old-a"],
            ["old-b"],
            ["old-a"],
            ["old-b"],
            ["old-a"],
            [],
        ]
    engine.dispose()
    _migrate(database_url, "0010", down=True)
    assert _rows(database_url)["experiment"] == before
    upgrade_database(database_url)
    assert metadata_diffs(database_url, SQLModel.metadata) == []


def test_0012_searches_tag_values_and_folds_unicode_case_on_both_databases(
    database_url: str,
) -> None:
    """On 674b730 `?q=[` matched every experiment (the tags' JSON text) and, on SQLite, `äöü`
    missed `ÄÖÜ-Ünïcode` (lower() folds only ASCII there). An experiment stored before 0012
    gets its search text from the migration; one written after, from the model's events."""
    _migrate(database_url, "0011")
    engine = make_engine(database_url)
    with engine.begin() as connection:
        spec = json.dumps({"name": "ÄÖÜ-Ünïcode", "trainer": "collapse", "config": {}})
        connection.execute(
            text(
                "INSERT INTO experiment (name, trainer, spec, metric, status, priority, "
                "n_conditions, n_runs, cancel_requested, created_at, runs_completed, tags, "
                "note) VALUES ('ÄÖÜ-Ünïcode', 'collapse', :spec, 'min_l2', 'completed', 0, 1, "
                "1, false, '2026-01-01 00:00:00', 1, :tags, 'Straße')"
            ),
            {"spec": spec, "tags": json.dumps(["Baseline"])},
        )
    engine.dispose()
    upgrade_database(database_url)
    engine = make_engine(database_url)
    with Session(engine) as session:
        label_experiment(session=session, experiment_id=1, labels=ExperimentLabels(note="ΣΊΣΥΦΟΣ"))

        def names(text_: str) -> list[str]:
            only = ExperimentFilter(text=text_)
            return [
                e.name for e in list_experiments(session=session, limit=10, offset=0, only=only)
            ]

        assert names("äöü") == names("ÄÖÜ-ÜNÏCODE") == names("baseline") == ["ÄÖÜ-Ünïcode"]
        assert names("σίσυφος") == ["ÄÖÜ-Ünïcode"]  # the note written after 0012
        assert names("[") == names('"') == names("straße") == []  # no JSON; the old note gone
    engine.dispose()


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
