"""The dispatcher's (and the pre-flight's) dealings with Ray itself: joining it, and whether
a run's resources fit any of its nodes; one line of an exception for a run's error."""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import threading
from typing import Any

import ray

from api_schemas.environment import TRAINER_MODULES
from service.settings import Settings
from trainers import LOADED_MODULES


def infeasible(num_cpus: float, num_gpus: float, nodes: list[tuple[float, float]]) -> str | None:
    """Why no node in `nodes` ((CPUs, GPUs) each) can ever hold a run asking for these, or
    None when one can (or when nothing is known about the nodes)."""
    if not nodes or any(c >= num_cpus and g >= num_gpus for c, g in nodes):
        return None
    cpus, gpus = max(c for c, _ in nodes), max(g for _, g in nodes)
    return (
        f"no node of the Ray cluster can hold this run: it asks for num_cpus={num_cpus:g}, "
        f"num_gpus={num_gpus:g}, and the largest nodes have {cpus:g} CPUs and {gpus:g} GPUs "
        f"(set SEEDGRID_FAIL_INFEASIBLE_RUNS=false on an autoscaling cluster)"
    )


def worker_runtime_env() -> dict[str, Any]:
    """The Ray job's runtime environment: when the operator's trainer modules
    (SEEDGRID_TRAINER_MODULES or `--trainers`, as this process loaded them) include a file or
    package folder, those are shipped to every node (Ray's `py_modules`: uploaded once, put on
    each worker's sys.path), so that a cluster's nodes need no copy of the code, and every
    module is named to every worker."""
    modules = list(LOADED_MODULES)
    shipped = [str(m.path) for m in modules if m.path is not None]
    if not shipped:
        # modules named by import name only: importable on every node already (their
        # PYTHONPATH, an image), named to its workers by the nodes' own environment
        return {}
    return {
        "py_modules": shipped,
        "env_vars": {TRAINER_MODULES: ",".join(m.name for m in modules)},
    }


# A traceback frame in Ray's copy of a shipped module on a node (py_modules: unpacked under
# .../runtime_resources/py_modules_files/_ray_pkg_<hash>/, the file or the package folder
# inside it under its own name).
_RAY_COPY = re.compile(
    r'(?<=File ")(?P<copy>[^"\n]*[/\\]_ray_pkg_[0-9a-fA-F]+[/\\])(?P<rest>[^"\n]+)(?=")'
)


def operator_paths(traceback: str) -> str:
    """A worker's traceback with every frame in Ray's temporary copy of a shipped trainer
    module named by the path the operator gave (`--trainers FILE` or
    SEEDGRID_TRAINER_MODULES, as this process loaded it): the file they edit, not a copy on
    a node that Ray removes. A frame of a module this process did not ship stays as it is."""
    shipped = {m.path.name: m.path for m in LOADED_MODULES if m.path is not None}
    if not shipped:
        return traceback

    def named(match: re.Match[str]) -> str:
        rest = match["rest"]
        origin = shipped.get(re.split(r"[/\\]", rest, maxsplit=1)[0])
        return str(origin.parent / rest) if origin is not None else match[0]

    return _RAY_COPY.sub(named, traceback)


def own_ray_token() -> None:
    """Ray's token authentication for the local Ray this process is about to start (no
    RAY_ADDRESS: ray.init starts one): RAY_AUTH_MODE=token, and, unless the operator gave a
    token (RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH), a random one of this process alone, in its
    environment only, which the Ray processes it starts inherit: never written to disk (Ray
    would write ~/.ray/auth_token, the same for every local Ray of the user). Ray's servers
    listen on every interface whatever the node address (Ray 2.60: ray.init maps a loopback
    node address to the machine's own), so this token is what keeps others out: anyone who
    reaches a Ray port and lacks it is refused (docs/deploy.md). An operator's explicit
    RAY_AUTH_MODE is kept, `disabled` included."""
    if os.environ.get("RAY_ADDRESS"):
        return  # ray.init joins that cluster: its token is the operator's
    if "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = "token"
    if os.environ["RAY_AUTH_MODE"].lower() != "token":
        return
    if not os.environ.get("RAY_AUTH_TOKEN") and not os.environ.get("RAY_AUTH_TOKEN_PATH"):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_urlsafe(32)
    # Ray caches its config (the authentication mode among it) in this process at first use:
    # read the environment again, as Ray's own default-token switch does.
    from ray._raylet import Config  # type: ignore[attr-defined]

    Config.initialize("")


def ensure_ray(settings: Settings, quiet: bool = False) -> None:
    """Join the configured cluster, or start a local Ray, once per process, with the
    operator's trainer modules in its runtime environment (worker_runtime_env). `quiet`: Ray's
    own INFO lines ("Started a local Ray instance.", in Ray's log format) stay out of this
    process's output, warnings and errors only: `seedgrid run` says which Ray it uses in its
    own words, where Ray's lines broke into its progress and tables; a server's log keeps them."""
    logging_level = logging.WARNING if quiet else logging.INFO
    if ray.is_initialized():
        return
    runtime_env = worker_runtime_env() or None
    # ray.init makes SIGTERM exit the process at once; keep the handler we had (uvicorn's, the
    # dispatcher command's), so that SIGTERM still stops seedgrid cleanly.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        if settings.ray_address:
            ray.init(
                address=settings.ray_address,
                log_to_driver=False,
                runtime_env=runtime_env,
                logging_level=logging_level,
            )
        else:
            own_ray_token()
            ray.init(
                num_cpus=settings.ray_num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env=runtime_env,
                logging_level=logging_level,
            )
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def error_line(exc: BaseException) -> str:
    """The first line of an exception (of the driver's error, for a database one)."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
