"""The `seedgrid` commands that run the service: serve (the API, and by default the
dispatcher), dispatcher, run (the service in this process for one spec), and `db upgrade` /
`db current` (schema migrations); with the settings, database and Ray helpers they share.

Without SEEDGRID_DATABASE_URL the database is one per user, in the platform's data directory
(service.settings.default_database_path): the commands that write make it, `db current` only
reads. The commands that start Ray (serve, run, dispatcher) shut it down however they end."""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import pydantic
import typer

import service.cli.remote as remote
import service.cli.render as render
from service.cli.common import DatabaseUrlOpt, TrainersOpt, fail, load_spec
from service.cli.follow import exit_on_trouble, report, watch

if TYPE_CHECKING:  # the client commands need no settings: SQLAlchemy's import is 0.2 s
    from service.settings import Settings

# How long `serve --workers N`'s supervisor (uvicorn) waits for a worker process to answer its
# health check before it kills it as hung and starts another. uvicorn's default, 5 s, is less
# than a worker's start-up (a new interpreter importing the app) takes on a busy machine: on 2
# cores beside other CPU-bound work the supervisor killed each worker it started, and the API
# never answered.
WORKER_HEALTHCHECK_TIMEOUT_S = 60


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def log_to_stderr(level: str) -> None:
    """seedgrid's own log lines (the dispatcher's active/standby/take-over) on stderr."""
    logger = logging.getLogger("seedgrid")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level.upper())


def load_trainers(option: str | None) -> None:
    """The operator's trainer modules (SEEDGRID_TRAINER_MODULES, then `--trainers`) imported
    and registered before Ray or the API starts, or the command stops with one line naming
    the module and why. The commands check their settings and the database first: those
    checks need no trainer, and importing the trainers (torch, scipy) takes seconds.
    `--trainers` joins the variable, so that the processes this command starts (the API's
    workers, Ray's) load the same modules."""
    from api_schemas import environment

    try:
        import trainers

        if option:
            trainers.load_trainer_modules(option, "--trainers")
    except ImportError as exc:
        raise fail(str(exc)) from None
    if option:
        entries = [environment.text(environment.TRAINER_MODULES), option]
        environment.set_text(environment.TRAINER_MODULES, ",".join(e for e in entries if e))


def load_settings(**options: Any) -> Settings:
    """Settings from the environment, overridden by the command's `options` (None: not given).
    On the default database, a warning when the old default, ./seedgrid.db, is here."""
    from service.settings import Settings

    given = {name: value for name, value in options.items() if value is not None}
    try:
        settings = Settings(**given)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        field = ("--" + name.replace("_", "-")) if name in given else "SEEDGRID_" + name.upper()
        raise fail(f"{field if name else 'settings'}: {first['msg']}") from None
    warn_of_the_old_default(settings)
    return settings


def on_default_database(settings: Settings) -> bool:
    """Whether the database is the default one (SEEDGRID_DATABASE_URL and --database-url unset)."""
    return "database_url" not in settings.model_fields_set


def sqlite_file(database_url: str) -> Path | None:
    """The file a SQLite URL names; None for another database, or one in memory."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    if (
        url.get_backend_name() != "sqlite"
        or url.database in (None, "", ":memory:")
        or url.query.get("uri")
    ):
        return None
    return Path(url.database)


def warn_of_the_old_default(settings: Settings) -> None:
    """Before the default database moved to the user's data directory, it was ./seedgrid.db
    wherever a command ran: say, once, how to keep using one found here."""
    from service.settings import default_database_path

    old = Path("seedgrid.db").absolute()
    default = default_database_path()
    if not on_default_database(settings) or not old.is_file() or old == default.absolute():
        return
    move = "" if default.exists() else f", or move it to {default}"
    render.err.print(
        f"warning: {old} is seedgrid's old default database; the default is now "
        f"{default}. To keep using this one, set "
        f"SEEDGRID_DATABASE_URL=sqlite:///{old}{move}",
        markup=False,
        soft_wrap=True,
        style="yellow",
    )


def database_name(settings: Settings) -> str:
    """The database as the commands print it: the default's file, saying it is the default;
    another by its URL (password masked)."""
    from service.settings import default_database_path
    from service.storage.db import masked_url

    if on_default_database(settings):
        return f"{default_database_path()} (the default; SEEDGRID_DATABASE_URL selects another)"
    return masked_url(settings.database_url)


def refuse_open_exposure(settings: Settings, insecure: bool, host_option: bool = False) -> None:
    """A service other machines can reach needs the token: without it, anyone who can connect
    submits work to the cluster. Loopback addresses stay open for local use."""
    from service.api.security import is_loopback

    if settings.api_token.get_secret_value() or insecure or is_loopback(settings.host):
        return
    host = f"--host {settings.host}" if host_option else f"SEEDGRID_HOST={settings.host}"
    raise fail(
        f"{host} is reachable from other machines and "
        "SEEDGRID_API_TOKEN is not set: set a token (e.g. `openssl rand -hex 32`), "
        "listen on 127.0.0.1, or pass --insecure to serve it open anyway"
    )


def upgrade_schema(settings: Settings) -> None:
    """Migrate the database to the newest schema (making the default one, and its directory,
    when there is none yet), or stop with one line naming it."""
    from service.settings import default_database_path
    from service.storage.db import INITIAL_REVISION, DatabaseError, upgrade_database

    if on_default_database(settings):
        try:
            default_database_path().parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise fail(
                f"cannot make the directory of the default database "
                f"{default_database_path()}: {exc.strerror}"
            ) from None
    try:
        done = upgrade_database(settings.database_url)
    except DatabaseError as exc:
        raise fail(str(exc)) from None
    if done.stamped:
        change = f"tables made before migrations stamped at revision {INITIAL_REVISION}"
        change += f", upgraded to {done.after}" if done.after != INITIAL_REVISION else ""
    elif done.before == done.after:
        change = f"schema at revision {done.after}, up to date"
    else:
        change = f"schema upgraded from {done.before or 'an empty database'} to {done.after}"
    render.console.print(
        f"database {database_name(settings)}: {change}", markup=False, soft_wrap=True
    )


def end_ray() -> None:
    """Shut down this process's Ray: the local instance it started, with every process of it
    (the raylet's dashboard and runtime-env agents too), or its connection to a cluster."""
    ray = sys.modules.get("ray")  # never imported: nothing to end, and no import to pay for
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def connect_ray(settings: Settings, quiet: bool = False) -> None:
    """Join SEEDGRID_RAY_ADDRESS's cluster, or start a local Ray, or stop with one line
    (`quiet`: without Ray's own INFO lines, ensure_ray).

    From the main thread, before a dispatcher starts: Ray started from another thread (a
    dispatcher's, when a standby takes over; the server's in `seedgrid run`) installs its own
    SIGTERM handler, which aborts the process 3 s after the signal, before Ray is shut down;
    from the main thread, ensure_ray keeps the command's handler."""
    from service.scheduling.ray_helpers import ensure_ray

    try:
        ensure_ray(settings, quiet)
    except Exception as exc:
        where = (
            f"connect to Ray at SEEDGRID_RAY_ADDRESS={settings.ray_address}"
            if settings.ray_address
            else "start a local Ray"
        )
        raise fail(f"cannot {where}: {_first_line(exc)}") from None


@contextmanager
def ray_ended_on_exit() -> Iterator[None]:
    """Ray ends with the command however the command ends: on return, an error, Ctrl-C or
    SIGTERM. SIGTERM's default action would end the process before Ray's shutdown, leaving the
    agents the raylet started behind; here it raises SystemExit instead (uvicorn, serving,
    shuts down first and then raises the signal again), Ray is shut down, and the process then
    ends by SIGTERM as it would have."""
    terminated: list[int] = []

    def on_sigterm(signum: int, _frame: object) -> None:
        terminated.append(signum)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one does not cut Ray's short
        try:
            end_ray()
        finally:
            signal.signal(signal.SIGTERM, previous)
        if terminated:
            sys.stdout.flush()
            sys.stderr.flush()
            signal.raise_signal(signal.SIGTERM)


def serve(
    dispatch: Annotated[
        bool,
        typer.Option(
            help="run the dispatcher in this process (embedded mode); --no-dispatch: "
            "the API only, with `seedgrid dispatcher` running elsewhere"
        ),
    ] = True,
    workers: Annotated[
        int, typer.Option(min=1, help="API worker processes (more than 1 needs --no-dispatch)")
    ] = 1,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="listen on a non-loopback SEEDGRID_HOST without "
            "SEEDGRID_API_TOKEN (anyone who reaches it can submit)",
        ),
    ] = False,
    host: Annotated[
        str | None,
        typer.Option(
            help="address to listen on [default: SEEDGRID_HOST, else 127.0.0.1]", show_default=False
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            help="port to listen on [default: SEEDGRID_PORT, else 8000]; the client commands "
            "find it when SEEDGRID_PORT says the same",
            show_default=False,
        ),
    ] = None,
    trainers: TrainersOpt = None,
) -> None:
    """Serve the REST API (and, by default, the dispatcher) with uvicorn."""
    import uvicorn

    if workers > 1 and dispatch:
        raise fail(
            "--workers: more than one worker process needs --no-dispatch (run the "
            "dispatcher as its own process: `seedgrid dispatcher`)"
        )
    settings = load_settings(host=host, port=port)
    refuse_open_exposure(settings, insecure, host_option=host is not None)
    log_to_stderr(settings.log_level)
    with ray_ended_on_exit():
        upgrade_schema(settings)
        load_trainers(trainers)
        print(serving_banner(settings.host, settings.port), file=sys.stderr, flush=True)
        if dispatch:
            from service.api.app import create_app

            # Ray from the main thread (see connect_ray), also for a standby: it is then ready to
            # take over at once.
            connect_ray(settings)
            uvicorn.run(
                create_app(settings, dispatch=True),
                host=settings.host,
                port=settings.port,
                log_level=settings.log_level,
            )
        else:
            # Each worker process builds its app from the same SEEDGRID_* environment.
            uvicorn.run(
                "service.api.app:create_api_app",
                factory=True,
                workers=workers,
                timeout_worker_healthcheck=WORKER_HEALTHCHECK_TIMEOUT_S,
                host=settings.host,
                port=settings.port,
                log_level=settings.log_level,
            )


def conditions_times_seeds(n_conditions: int, n_runs: int) -> str:
    """ "8 conditions x 5 seeds = 40 runs" (the seeds per condition when every condition has as
    many; else the total alone)."""
    if n_conditions and n_runs % n_conditions == 0:
        seeds = n_runs // n_conditions
        return (
            f"{n_conditions} condition{'s' * (n_conditions != 1)} x {seeds} "
            f"seed{'s' * (seeds != 1)} = {n_runs} run{'s' * (n_runs != 1)}"
        )
    return f"{n_conditions} conditions, {n_runs} runs"


def serving_banner(host: str, port: int) -> str:
    """Where `seedgrid serve` answers: the API and its dashboard (a host that listens on every
    interface is shown as this machine's loopback, the address a browser here opens)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    base = f"http://{shown}:{port}"
    return f"seedgrid API at {base} (docs {base}/docs); the dashboard at {base}/ui"


def dispatcher(trainers: TrainersOpt = None) -> None:
    """Run the dispatcher alone: the database queue -> Ray, results -> the database.

    Exactly one dispatcher acts per trainer on a database: this one dispatches the runs of the
    trainers it has loaded whose locks are free, waits as a standby for those another process
    holds (a `seedgrid dispatcher`, an embedded `seedgrid serve`, a `seedgrid run`), and takes
    each over when its holder is gone. SIGTERM or SIGINT stops it cleanly: runs in flight go
    back to the queue.
    """
    import threading

    from service.scheduling.dispatcher import Dispatcher
    from service.storage.db import make_engine

    settings = load_settings()
    log_to_stderr(settings.log_level)
    upgrade_schema(settings)
    load_trainers(trainers)
    # Connect now: a wrong address fails here, and a standby is ready to take over at once.
    connect_ray(settings)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    engine = make_engine(settings.database_url)
    worker = Dispatcher(settings, engine)
    try:
        worker.start()
        while worker.alive and not stopping.wait(0.5):
            pass
    except Exception as exc:
        raise fail(f"the dispatcher could not start: {_first_line(exc)}") from None
    finally:
        worker.stop()
        engine.dispose()
        end_ray()
    if worker.error is not None and not stopping.is_set():
        raise fail(f"the dispatcher stopped: {_first_line(worker.error)}")


def run(
    spec_file: Path,
    metric: Annotated[str | None, typer.Option(help="metric to compare")] = None,
    trainers: TrainersOpt = None,
) -> None:
    """Start the service in this process, run one spec to completion, print its statistics."""
    settings = load_settings()
    refuse_open_exposure(settings, insecure=False)
    spec = load_spec(spec_file)
    started = time.perf_counter()
    with ray_ended_on_exit():
        upgrade_schema(settings)
        load_trainers(trainers)
        from service.api.server import BackgroundServer

        # from the main thread, not the server's (see connect_ray); Ray's INFO lines would
        # break into the progress and tables below: this line says which Ray instead
        connect_ray(settings, quiet=True)
        render.console.print(f"Ray {settings.ray_address or 'local (started here)'}", markup=False)
        with (
            BackgroundServer(settings) as server,
            remote.connect(server.url, 120) as client,
        ):
            created = remote.ask(client, "POST", "/experiments", json=spec)
            render.console.print(
                f"experiment {created['id']} {created['name']}: "
                f"{conditions_times_seeds(created['n_conditions'], created['n_runs'])} "
                f"(API at {server.url})",
                markup=False,
            )
            render.print_seed_warnings(created.get("seed_warnings", []))
            watch(client, created["id"], in_process=database_name(settings))
            trouble = report(client, created["id"], metric)
    render.console.print(f"wall time {time.perf_counter() - started:.1f} s")
    exit_on_trouble(trouble)


def db_upgrade(database_url: DatabaseUrlOpt = None) -> None:
    """Apply every migration the database lacks (`alembic upgrade head`); safe to repeat."""
    upgrade_schema(load_settings(database_url=database_url))


def db_current(database_url: DatabaseUrlOpt = None) -> None:
    """The schema revision the database is at, and the newest one this seedgrid knows. Reads
    only: a SQLite file that does not exist is not made."""
    from service.storage.db import DatabaseError, database_revision, head_revision

    settings = load_settings(database_url=database_url)
    name = database_name(settings)
    path = sqlite_file(settings.database_url)
    if path is not None and not path.is_file():
        raise fail(
            f"there is no database at {path}"
            + (
                " (the default; `seedgrid serve` or `seedgrid db upgrade` makes it, "
                "SEEDGRID_DATABASE_URL or --database-url selects another)"
                if on_default_database(settings)
                else ""
            )
        )
    try:
        revision = database_revision(settings.database_url)
    except DatabaseError as exc:
        raise fail(str(exc)) from None
    head = head_revision()
    if revision is None:
        state = f"no alembic_version table (`seedgrid db upgrade` brings it to revision {head})"
    else:
        state = f"revision {revision}" + (" (head)" if revision == head else f", head is {head}")
    render.console.print(f"database {name}: {state}", markup=False, soft_wrap=True)
