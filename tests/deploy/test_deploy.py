"""The deployment files under deploy/: they parse, agree with each other and with the code.

Nothing here builds an image or starts a container (no Docker engine, no cluster, no network).
What is checked: every YAML file parses; the Dockerfile's pins, base Python, copied paths and
Ray version agree with pyproject.toml and the RayCluster, and its numbered non-root user is the
pods' user; the compose file passes `docker-compose config` and a structural check, requires
the API token, the Ray token and the database password and publishes nothing beyond 127.0.0.1
by default, and the Ray dashboard only with its override file; the Kubernetes manifests build
with `kubectl kustomize` (offline), validate against the Kubernetes schemas
(kubernetes-validate), and hang together (names, ports, selectors, GPU counts, the Secret the
documented command creates); Ray's token authentication is on for every Ray process and every
driver, from the Secret or a required host variable, and never handed to the API; every pod
and container runs confined (non-root, no capabilities, no privilege escalation, a read-only
image with volumes where it writes, the default seccomp profile); the network policies admit
only seedgrid's pods to Ray and PostgreSQL; no deploy file carries a token or password; every
seedgrid command line they run exists in the CLI; every SEEDGRID_* variable they set is one
seedgrid reads, with a value its settings accept.

A missing tool (docker-compose, kubectl, kubernetes-validate) skips its test with a message, and
fails it under CI=true: CI must run every check (scripts/test.sh installs docker-compose).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from typer.testing import CliRunner

from service.cli import app as cli_app
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
# The opt-in override that publishes the Ray dashboard on 127.0.0.1.
COMPOSE_DASHBOARD = DEPLOY / "compose.dashboard.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Values for the variables compose.yaml requires from the host (interpolation in the test); the
# token is one seedgrid accepts (16 characters or more, no placeholder).
COMPOSE_ENV = {
    "SEEDGRID_DB_PASSWORD": "test-password",
    "SEEDGRID_API_TOKEN": "test-token-4f1c9a7e2b8d",
    "SEEDGRID_RAY_TOKEN": "test-ray-token-9d3b6a1c",
}
# Values people leave in place when a file says "replace this"; seedgrid refuses them as a token.
PLACEHOLDER_SECRETS = {
    "change-me",
    "change-me-too",
    "changeme",
    "replace-me",
    "replaceme",
    "secret",
    "token",
    "password",
}
DOCS = ROOT / "docs" / "deploy.md"
SEEDGRID_SERVICES = {"ray-head", "ray-gpu-worker", "api", "dispatcher"}
# Variables whose value is a mode, not a secret, though it may read "token" (a placeholder).
NOT_SECRETS = {"RAY_AUTH_MODE"}
# Ray's dashboard port (with its job API, which runs any command on the cluster).
RAY_DASHBOARD_PORT = 8265
# The official postgres image's user: uid and gid 999 (its Dockerfile's groupadd/useradd).
POSTGRES_IMAGE_UID = 999
# The Kubernetes API version the built-in kinds are validated against.
KUBERNETES_VERSION = "1.30.0"


# --------------------------------------------------------------------------------------------
# helpers


def tool_missing(message: str) -> NoReturn:
    """Skip a test whose tool is not installed; under CI=true fail it, so CI runs every check."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {message}")
    pytest.skip(message)


def yaml_documents(path: Path) -> list[Any]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def dockerfile_args() -> dict[str, str]:
    return dict(
        args.split("=", 1) for keyword, args in dockerfile_instructions() if keyword == "ARG"
    )


def pip_requirements(instructions: list[tuple[str, str]]) -> list[str]:
    """Every requirement named after `pip install` in RUN instructions, ARGs substituted."""
    args = dockerfile_args()
    found: list[str] = []
    for keyword, command in instructions:
        if keyword != "RUN":
            continue
        for part in re.split(r"&&|;", command):
            words = shlex.split(part)
            if words[:2] == ["pip", "install"]:
                for word in words[2:]:
                    if not word.startswith("-"):
                        found.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], word))
    return found


def dockerignore_excludes(path: str) -> bool:
    """Whether the root .dockerignore keeps `path` (relative to the repository) out of the
    build context: a pattern matching the path or one of its parents, last match wins."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = Path(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern.lstrip("!").strip("/")
        globs = {body, body.removeprefix("**/")}
        if any(fnmatch.fnmatchcase(c, g) for c in candidates for g in globs):
            excluded = not negated
    return excluded


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable interpolation: ${VAR}, ${VAR:-default}, ${VAR:?error}, $$."""

    def one(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        name, op, arg = match["name"], match["op"], match["arg"]
        if env.get(name):
            return env[name]
        if op == ":?":
            raise AssertionError(f"compose requires {name}: {arg}")
        return arg or ""

    return re.sub(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:-|:\?)(?P<arg>[^}]*))?\}", one, value)


def compose_env(service: dict[str, Any], host: dict[str, str] = COMPOSE_ENV) -> dict[str, str]:
    env = service.get("environment") or {}
    assert isinstance(env, dict), "environment: use the mapping form"
    return {k: interpolate(str(v), host) for k, v in env.items() if v is not None}


def seedgrid_invocations_in_shell(script: str) -> list[list[str]]:
    """The argument lists of `seedgrid ...` commands in a shell command line."""
    return [
        shlex.split(m[1]) for m in re.finditer(r"(?:^|&&|;|\bexec)\s*seedgrid\s+([^;&|]+)", script)
    ]


def read_env_names() -> set[str]:
    """SEEDGRID_* names seedgrid reads: Settings fields, and names its code looks up itself."""
    names = {"SEEDGRID_" + field.upper() for field in Settings.model_fields}
    for package in ("api_schemas", "trainers", "workers", "service"):
        for source in (ROOT / package).rglob("*.py"):
            names |= set(re.findall(r"[\"'](SEEDGRID_[A-Z0-9_]+)[\"']", source.read_text()))
    return names


def check_seedgrid_env(env: dict[str, str], where: str) -> None:
    """Every SEEDGRID_* name is one seedgrid reads, and the settings accept the values."""
    unknown = {k for k in env if k.startswith("SEEDGRID_")} - read_env_names()
    assert not unknown, f"{where}: seedgrid reads no variable named {sorted(unknown)}"
    given = {
        k.removeprefix("SEEDGRID_").lower(): v for k, v in env.items() if k.startswith("SEEDGRID_")
    }
    fields = {k: v for k, v in given.items() if k in Settings.model_fields}
    Settings(**fields)  # raises ValidationError naming the field on a bad value


def check_cli_invocation(args: list[str], where: str) -> None:
    """The seedgrid command line exists: its subcommand and options parse (then --help)."""
    result = CliRunner().invoke(cli_app, [*args, "--help"])
    assert result.exit_code == 0, (
        f"{where} runs `seedgrid {' '.join(args)}`, which the CLI rejects: {result.output}"
    )


# --------------------------------------------------------------------------------------------
# every file


def test_every_yaml_file_under_deploy_parses_into_mappings() -> None:
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert COMPOSE in files and K8S / "kustomization.yaml" in files
    for path in files:
        docs = yaml_documents(path)
        assert docs, f"{path} holds no YAML document"
        for doc in docs:
            assert isinstance(doc, dict), f"{path}: a document is not a mapping"
            if path.parent == K8S and path.name != "kustomization.yaml":
                assert {"apiVersion", "kind", "metadata"} <= doc.keys(), path
                assert doc["metadata"].get("name"), f"{path}: a {doc['kind']} without a name"


# --------------------------------------------------------------------------------------------
# the image


def test_dockerfile_builds_seedgrid_on_the_pinned_torch_as_a_non_root_user() -> None:
    instructions = dockerfile_instructions()
    keywords = [k for k, _ in instructions]
    first_from = keywords.index("FROM")
    assert set(keywords[:first_from]) <= {"ARG"}, "only ARG may come before the first FROM"
    assert keywords.count("FROM") == 1

    # The base image's Python satisfies requires-python.
    base = instructions[first_from][1]
    match = re.fullmatch(r"python:(\d+\.\d+)[-\w.]*", base)
    assert match, f"base image {base!r} is not an official python:X.Y image"
    assert f"{match[1]}.0" in SpecifierSet(PYPROJECT["project"]["requires-python"])

    # Every exact pin of pyproject.toml (torch, torchvision) is installed with the same pin.
    installed = {
        Requirement(r).name: Requirement(r) for r in pip_requirements(instructions) if r != "."
    }
    pins = [Requirement(d) for d in PYPROJECT["project"]["dependencies"]]
    pins = [r for r in pins if len(r.specifier) == 1 and next(iter(r.specifier)).operator == "=="]
    assert {p.name for p in pins} >= {"torch", "torchvision"}
    for pin in pins:
        assert pin.name in installed, f"the Dockerfile does not install {pin}"
        assert installed[pin.name].specifier == pin.specifier, (
            f"Dockerfile installs {installed[pin.name]}, pyproject.toml pins {pin}"
        )
    assert "." in pip_requirements(instructions), "seedgrid itself is not installed"

    # Its Ray version is one pyproject.toml allows.
    ray_version = dockerfile_args()["RAY_VERSION"]
    ray_req = next(
        Requirement(d) for d in PYPROJECT["project"]["dependencies"] if Requirement(d).name == "ray"
    )
    assert ray_version in ray_req.specifier
    assert installed["ray"].specifier == SpecifierSet(f"=={ray_version}")

    # Non-root at run time, `seedgrid` as the entrypoint.
    user = [args for k, args in instructions if k == "USER"]
    assert user and user[-1].split(":")[0] not in {"root", "0"}, "the image runs as root"
    assert keywords.index("USER") > max(i for i, k in enumerate(keywords) if k == "RUN")
    entrypoint = [args for k, args in instructions if k == "ENTRYPOINT"]
    assert entrypoint and yaml.safe_load(entrypoint[-1]) == ["seedgrid"]


def test_dockerfile_copies_every_package_and_the_context_keeps_them() -> None:
    sources: list[str] = []
    for keyword, args in dockerfile_instructions():
        if keyword == "COPY":
            words = [w for w in shlex.split(args) if not w.startswith("--")]
            sources += words[:-1]
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
        assert not dockerignore_excludes(source), f".dockerignore drops {source}, COPY needs it"
    # Every package pyproject.toml installs is copied before `pip install .`.
    packages = [
        p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    ]
    assert set(packages) <= set(sources), f"packages not copied: {set(packages) - set(sources)}"
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} <= set(sources)
    # ... and the heavy or private things stay out of the build context.
    for path in (".venv", ".git", "seedgrid.db", "data/cifar-10-batches-py", "tests"):
        assert dockerignore_excludes(path), f".dockerignore lets {path} into the build context"


def test_what_the_image_copies_builds_a_wheel_with_every_package_file(tmp_path: Path) -> None:
    """The image installs seedgrid from its COPY sources, not in editable mode as the tests do,
    so a module or data file left out of the package would only be missed in the container."""
    context = tmp_path / "context"
    for keyword, args in dockerfile_instructions():
        if keyword == "COPY" and "--from" not in args:
            for source in [w for w in shlex.split(args) if not w.startswith("--")][:-1]:
                if (ROOT / source).is_dir():
                    shutil.copytree(
                        ROOT / source,
                        context / source,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                    )
                else:
                    (context / source).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / source, context / source)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(context),
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "dist"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "dist").glob("seedgrid-*.whl")
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    packages = [
        p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    ]
    expected = {
        path.relative_to(ROOT).as_posix()
        for package in packages
        for path in (ROOT / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert expected, "no package files found"
    assert not expected - in_wheel, f"left out of the installed package: {expected - in_wheel}"


def dockerfile_env() -> dict[str, str]:
    """The variables the Dockerfile's ENV instructions set (KEY=VALUE form)."""
    return dict(
        word.split("=", 1)
        for keyword, args in dockerfile_instructions()
        if keyword == "ENV"
        for word in shlex.split(args)
    )


def image_user() -> tuple[int, int, str]:
    """(uid, gid, home) the image runs as: its last USER, given as uid:gid by number, which the
    one `useradd` of its RUN instructions creates with that home (HOME too)."""
    instructions = dockerfile_instructions()
    user = [args for keyword, args in instructions if keyword == "USER"][-1]
    match = re.fullmatch(r"(\d+):(\d+)", user)
    assert match, f"USER {user}: give uid:gid by number (Kubernetes' runAsNonRoot checks it)"
    uid, gid = int(match[1]), int(match[2])
    commands = [
        shlex.split(part)
        for keyword, args in instructions
        if keyword == "RUN"
        for part in re.split(r"&&|;", args)
    ]
    (useradd,) = [words for words in commands if words[:1] == ["useradd"]]
    options: dict[str, str] = {}
    words = iter(useradd[1:])
    for word in words:
        if word in {"--uid", "--gid", "--home-dir", "--shell"}:
            options[word] = next(words)
    assert (options.get("--uid"), options.get("--gid")) == (str(uid), str(gid)), (
        f"USER {user} is not the user that useradd creates: {useradd}"
    )
    home = options.get("--home-dir", "")
    assert home.startswith("/") and "--create-home" in useradd, f"no home directory: {useradd}"
    assert dockerfile_env().get("HOME") == home, "HOME is not the user's home directory"
    return uid, gid, home


def test_the_image_runs_as_a_numbered_non_root_user_the_pods_run_as() -> None:
    """Kubernetes' runAsNonRoot can only verify a numeric USER; the pods' runAsUser and
    runAsGroup must be that user, whose home and /tmp are where the read-only image lets it
    write (the confinement tests check the volumes there)."""
    uid, gid, home = image_user()
    assert uid != 0 and gid != 0, "the image runs as root"
    assert home != "/" and not home.startswith(("/usr", "/opt", "/etc")), home
    containers = [
        (where, spec, c)
        for where, _, spec in k8s_pods(k8s_objects())
        for c in all_containers(spec)
        if c["image"] == "seedgrid"
    ]
    assert len(containers) == 4, [where for where, _, _ in containers]
    for where, spec, container in containers:
        context = effective_security_context(spec, container)
        assert (context.get("runAsUser"), context.get("runAsGroup")) == (uid, gid), (
            f"{where} runs as {context.get('runAsUser')}:{context.get('runAsGroup')}, "
            f"the image's user is {uid}:{gid}"
        )
    for name in SEEDGRID_SERVICES:
        assert compose_services()[name].get("user") is None, f"compose {name} overrides USER"


# --------------------------------------------------------------------------------------------
# compose


def compose_services() -> dict[str, dict[str, Any]]:
    (doc,) = yaml_documents(COMPOSE)
    return doc["services"]


def test_compose_file_wires_database_ray_gpu_workers_api_and_dispatcher() -> None:
    services = compose_services()
    assert set(services) == {"postgres"} | SEEDGRID_SERVICES

    # One image, built from deploy/Dockerfile with the repository as context.
    images = {services[s]["image"] for s in SEEDGRID_SERVICES}
    assert len(images) == 1, f"seedgrid services use different images: {images}"
    for name in SEEDGRID_SERVICES:
        build = services[name]["build"]
        context = (COMPOSE.parent / build["context"]).resolve()
        assert context == ROOT and (context / build["dockerfile"]) == DOCKERFILE, name

    # depends_on names real services; a health condition needs a healthcheck there.
    for name, service in services.items():
        for dep, condition in (service.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            if condition.get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits on {dep}'s missing check"
    # ... and each process starts once what it connects to answers.
    for name, deps in (
        ("api", {"postgres"}),
        ("dispatcher", {"postgres", "ray-head"}),
        ("ray-gpu-worker", {"ray-head"}),
    ):
        for dep in deps:
            assert services[name]["depends_on"][dep] == {"condition": "service_healthy"}, name

    # The Ray head: GCS port, no runs scheduled on it.
    head = services["ray-head"]
    assert head["entrypoint"] == ["ray"] and head["command"][:2] == ["start", "--head"]
    head_port = next(a.split("=")[1] for a in head["command"] if a.startswith("--port="))
    assert {"--num-cpus=0", "--num-gpus=0", "--block"} <= set(head["command"])

    # GPU workers: join the head, get the NVIDIA GPUs, read datasets from a read-only mount.
    worker = services["ray-gpu-worker"]
    assert worker["entrypoint"] == ["ray"] and worker["command"][0] == "start"
    assert f"--address=ray-head:{head_port}" in worker["command"]
    assert not any(a.startswith(("--num-gpus=0", "--num-cpus=0")) for a in worker["command"])
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    worker_env = compose_env(worker)
    mounts = [interpolate(v, COMPOSE_ENV).rsplit(":", 2) for v in worker["volumes"]]
    assert [worker_env["SEEDGRID_DATA_ROOT"], "ro"] in [m[1:] for m in mounts], (
        "SEEDGRID_DATA_ROOT is not a read-only mount in the GPU worker"
    )
    check_seedgrid_env(worker_env, "compose ray-gpu-worker")

    # API and dispatcher: the same PostgreSQL database, the one the postgres service creates.
    pg_env = compose_env(services["postgres"])
    api_env, dispatcher_env = compose_env(services["api"]), compose_env(services["dispatcher"])
    assert api_env["SEEDGRID_DATABASE_URL"] == dispatcher_env["SEEDGRID_DATABASE_URL"]
    url = urlsplit(api_env["SEEDGRID_DATABASE_URL"])
    assert url.scheme == "postgresql+psycopg" and url.hostname == "postgres"
    assert (url.username, url.password, url.path.lstrip("/")) == (
        pg_env["POSTGRES_USER"],
        pg_env["POSTGRES_PASSWORD"],
        pg_env["POSTGRES_DB"],
    )
    assert dispatcher_env["SEEDGRID_RAY_ADDRESS"] == f"ray-head:{head_port}"

    # The API listens on every interface of its container, always with the host's token ...
    assert api_env["SEEDGRID_HOST"] == "0.0.0.0"
    assert api_env["SEEDGRID_API_TOKEN"] == COMPOSE_ENV["SEEDGRID_API_TOKEN"]
    without_token = {k: v for k, v in COMPOSE_ENV.items() if k != "SEEDGRID_API_TOKEN"}
    with pytest.raises(AssertionError, match="requires SEEDGRID_API_TOKEN"):
        compose_env(services["api"], without_token)
    # ... and the host publishes it, like every port, on 127.0.0.1 unless told otherwise.
    for name, service in services.items():
        for port in service.get("ports", []):
            host_ip = interpolate(port, COMPOSE_ENV).rsplit(":", 2)[0]
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond this machine"
    (api_port,) = services["api"]["ports"]
    bind_all = COMPOSE_ENV | {"SEEDGRID_API_BIND": "0.0.0.0"}
    assert interpolate(api_port, bind_all).rsplit(":", 2)[0] == "0.0.0.0"
    published = interpolate(api_port, COMPOSE_ENV).rsplit(":", 1)[-1]
    assert published == api_env["SEEDGRID_PORT"], "the API's port is not the one published"
    check_seedgrid_env(api_env, "compose api")
    check_seedgrid_env(dispatcher_env, "compose dispatcher")

    # The commands: API-only processes, and one dispatcher on a zero-resource Ray node.
    assert services["api"]["command"][:2] == ["serve", "--no-dispatch"]
    dispatcher = services["dispatcher"]
    assert dispatcher["entrypoint"] == ["bash", "-c"]
    (script,) = dispatcher["command"]
    script = interpolate(script, COMPOSE_ENV)
    assert 'ray start --address="$SEEDGRID_RAY_ADDRESS" --num-cpus=0 --num-gpus=0' in script
    assert seedgrid_invocations_in_shell(script) == [["dispatcher"]]


def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        return ["docker", "compose"]
    return None


def published_host_ips(service: dict[str, Any]) -> list[str]:
    """Host addresses of a resolved service's ports: docker-compose 1.29 writes
    "IP:HOST:CONTAINER/tcp", Compose v2 a mapping with host_ip (absent: every interface)."""
    return [
        p.get("host_ip", "0.0.0.0") if isinstance(p, dict) else p.rsplit(":", 2)[0]
        for p in service.get("ports", [])
    ]


def test_compose_file_passes_docker_compose_config(tmp_path: Path) -> None:
    command = compose_command()
    if command is None:
        tool_missing(
            "docker-compose is not installed (scripts/test.sh installs it as root; by hand: "
            "apt-get install -y --no-install-recommends docker-compose); the structural "
            "compose test still ran"
        )
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("SEEDGRID_")}
    # An empty env file: compose would otherwise read a developer's deploy/.env.
    no_env_file = tmp_path / "empty.env"
    no_env_file.touch()
    run = [*command, "--env-file", str(no_env_file), "-f", str(COMPOSE), "config"]

    def config(host: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(run, env=base_env | host, capture_output=True, text=True, timeout=60)

    done = config(COMPOSE_ENV)
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert set(resolved["services"]) == {"postgres"} | SEEDGRID_SERVICES
    devices = resolved["services"]["ray-gpu-worker"]["deploy"]["resources"]["reservations"]
    assert devices["devices"][0]["driver"] == "nvidia"
    # Nothing is published beyond this machine by default (SEEDGRID_API_BIND: the structural
    # test above).
    for name, service in resolved["services"].items():
        assert set(published_host_ips(service)) <= {"127.0.0.1"}, name
    assert published_host_ips(resolved["services"]["api"]) == ["127.0.0.1"]

    # Ray's token authentication on every Ray process and the dispatcher; no dashboard port.
    for name in ("ray-head", "ray-gpu-worker", "dispatcher"):
        env = resolved["services"][name].get("environment") or {}
        assert env.get("RAY_AUTH_MODE") == "token", f"{name}: Ray's token auth is off"
        assert env.get("RAY_AUTH_TOKEN") == COMPOSE_ENV["SEEDGRID_RAY_TOKEN"], name
    assert "RAY_AUTH_TOKEN" not in resolved["services"]["api"]["environment"]
    assert published_ports(resolved["services"]["ray-head"]) == []
    # ... which the override publishes on 127.0.0.1 only.
    run_with_dashboard = [*run[:-1], "-f", str(COMPOSE_DASHBOARD), "config"]
    done = subprocess.run(
        run_with_dashboard, env=base_env | COMPOSE_ENV, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    with_dashboard = yaml.safe_load(done.stdout)["services"]
    assert published_ports(with_dashboard["ray-head"]) == [
        ("127.0.0.1", str(RAY_DASHBOARD_PORT), RAY_DASHBOARD_PORT)
    ]
    assert with_dashboard["api"] == resolved["services"]["api"]

    # Without the database password or a token the file refuses to resolve, naming it; an empty
    # token (authentication off) too.
    for required, value in (
        ("SEEDGRID_DB_PASSWORD", None),
        ("SEEDGRID_API_TOKEN", None),
        ("SEEDGRID_API_TOKEN", ""),
        ("SEEDGRID_RAY_TOKEN", None),
        ("SEEDGRID_RAY_TOKEN", ""),
    ):
        host = {k: v for k, v in COMPOSE_ENV.items() if k != required}
        done = config(host if value is None else host | {required: value})
        assert done.returncode != 0 and f"set {required}" in done.stderr, (
            f"compose resolves with {required}={value!r}"
        )


def published_ports(
    service: dict[str, Any], host: dict[str, str] = COMPOSE_ENV
) -> list[tuple[str, str, int]]:
    """(host address, host port, container port) of a service's ports: the short syntax
    "[IP:][HOST:]CONTAINER[/proto]" of the files and of docker-compose 1.29's output, or Compose
    v2's mapping; no address is every interface."""
    found = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            found.append(
                (
                    port.get("host_ip", "0.0.0.0"),
                    str(port.get("published", "")),
                    int(port["target"]),
                )
            )
            continue
        parts = interpolate(str(port), host).split("/")[0].rsplit(":", 2)
        parts = ["0.0.0.0"] * (3 - len(parts)) + parts
        found.append((parts[0], parts[1], int(parts[2])))
    return found


def compose_tmpfs(service: dict[str, Any]) -> dict[str, dict[str, str]]:
    """A service's tmpfs mounts: path -> options ("exec", "mode=1777", "uid=1000", ...)."""
    mounts = {}
    for entry in service.get("tmpfs", []):
        path, _, options = entry.partition(":")
        mounts[path] = dict((o.split("=", 1) + [""])[:2] for o in options.split(",") if o)
    return mounts


def compose_connects_to_ray(service: dict[str, Any]) -> bool:
    """Whether a compose service runs a Ray process or a Ray driver: `ray` as its entrypoint, a
    `ray start` in its shell command, or a Ray address seedgrid joins."""
    command = service.get("command") or []
    script = " ".join(command) if isinstance(command, list) else command
    return (
        service.get("entrypoint") == ["ray"]
        or "ray start" in script
        or bool(compose_env(service).get("SEEDGRID_RAY_ADDRESS"))
    )


def test_compose_turns_on_ray_token_auth_for_every_ray_process_and_driver() -> None:
    """Ray's token authentication (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN) on the Ray head, the
    GPU worker and the dispatcher (a Ray node and the driver), the token from one required host
    variable; the API, which does not join Ray, never gets it."""
    services = compose_services()
    connecting = {name for name, service in services.items() if compose_connects_to_ray(service)}
    assert connecting == {"ray-head", "ray-gpu-worker", "dispatcher"}, connecting
    variables = set()
    for name in connecting:
        raw = services[name].get("environment") or {}
        assert raw.get("RAY_AUTH_MODE") == "token", f"compose {name}: Ray's token auth is off"
        token = re.fullmatch(r"\$\{(\w+):\?[^}]*\}", str(raw.get("RAY_AUTH_TOKEN", "")))
        assert token, f"compose {name}: RAY_AUTH_TOKEN is not a required host variable"
        variables.add(token[1])
        assert compose_env(services[name])["RAY_AUTH_TOKEN"] == COMPOSE_ENV[token[1]]
    assert len(variables) == 1, f"the Ray processes take their token from {sorted(variables)}"
    (variable,) = variables
    assert variable != "SEEDGRID_API_TOKEN", "the Ray token is the API's token"
    without = {k: v for k, v in COMPOSE_ENV.items() if k != variable}
    with pytest.raises(AssertionError, match=f"requires {variable}"):
        compose_env(services["ray-head"], without)
    for name in set(services) - connecting:
        assert not {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(compose_env(services[name])), (
            f"compose {name} does not join Ray but holds the Ray token"
        )
    # The Ray node in the dispatcher's container does not inherit the database URL, which only
    # the dispatcher process needs.
    (script,) = services["dispatcher"]["command"]
    assert re.search(r"env -u SEEDGRID_DATABASE_URL\s+ray start ", script), script


def test_compose_publishes_the_ray_dashboard_only_with_its_override_file() -> None:
    services = compose_services()
    for name, service in services.items():
        for _, host_port, container in published_ports(service):
            assert container != RAY_DASHBOARD_PORT, f"compose {name} publishes the dashboard"
            assert host_port != str(RAY_DASHBOARD_PORT), f"compose {name} takes port 8265"
    (override,) = yaml_documents(COMPOSE_DASHBOARD)
    assert set(override) == {"services"} and set(override["services"]) == {"ray-head"}
    assert set(override["services"]["ray-head"]) == {"ports"}, "the override changes more"
    assert published_ports(override["services"]["ray-head"]) == [
        ("127.0.0.1", str(RAY_DASHBOARD_PORT), RAY_DASHBOARD_PORT)
    ]
    head = services["ray-head"]["command"]
    assert "--dashboard-host=0.0.0.0" in head, "the override would publish a port no one serves"


def test_compose_seedgrid_containers_run_confined() -> None:
    """The compose counterpart of the pods' security contexts: no capabilities, no privilege
    gain, a read-only image with tmpfs mounts where the image's user writes (Docker applies its
    default seccomp profile by itself; nothing may turn it off)."""
    services = compose_services()
    for name in SEEDGRID_SERVICES:
        service = services[name]
        assert service.get("read_only") is True, f"compose {name}: writable image"
        assert service.get("cap_drop") == ["ALL"] and not service.get("cap_add"), name
        options = service.get("security_opt") or []
        assert "no-new-privileges:true" in options, f"compose {name}: no no-new-privileges"
        assert not [o for o in options if "unconfined" in o], f"compose {name}: {options}"
        assert not service.get("privileged") and not service.get("network_mode"), name
        tmpfs = compose_tmpfs(service)
        uid, _, home = image_user()
        assert {"/tmp", home} <= tmpfs.keys(), f"compose {name}: tmpfs {sorted(tmpfs)}"
        assert tmpfs[home].get("uid") == str(uid), f"compose {name}: the home is not the user's"


# --------------------------------------------------------------------------------------------
# Kubernetes


def k8s_objects() -> list[dict[str, Any]]:
    kustomization = yaml_documents(K8S / "kustomization.yaml")[0]
    listed = kustomization["resources"]
    on_disk = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk, "kustomization.yaml and deploy/k8s/ list different files"
    return [doc for name in listed for doc in yaml_documents(K8S / name)]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def pod_containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return obj["spec"]["template"]["spec"]["containers"]


def k8s_pods(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    """(name, labels, pod spec) of every kind of pod the manifests make: the Deployments' and
    the StatefulSet's, and the RayCluster's head and worker groups with the labels KubeRay adds
    to their pods (ray.io/cluster, ray.io/node-type, ray.io/group, ray.io/is-ray-node)."""
    pods = []
    for obj in objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        assert kind not in {"Pod", "Job", "CronJob", "DaemonSet", "ReplicaSet"}, kind
        if kind in {"Deployment", "StatefulSet"}:
            template = obj["spec"]["template"]
            pods.append(
                (f"{kind} {name}", template["metadata"].get("labels", {}), template["spec"])
            )
        elif kind == "RayCluster":
            groups = [("head", "headgroup", obj["spec"]["headGroupSpec"])] + [
                ("worker", g["groupName"], g) for g in obj["spec"]["workerGroupSpecs"]
            ]
            for node_type, group, spec in groups:
                template = spec["template"]
                labels = (template.get("metadata") or {}).get("labels", {}) | {
                    "ray.io/cluster": name,
                    "ray.io/node-type": node_type,
                    "ray.io/group": group,
                    "ray.io/is-ray-node": "yes",
                }
                pods.append((f"RayCluster {name} {group}", labels, template["spec"]))
    return pods


def all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def literal_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's env items that carry a value (not valueFrom)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def secret_env(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The container's env items taken from a Secret: name -> (Secret, key)."""
    return {
        e["name"]: (ref["name"], ref["key"])
        for e in container.get("env", [])
        if (ref := (e.get("valueFrom") or {}).get("secretKeyRef"))
    }


def effective_security_context(spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The container's security context with the pod's fields it inherits (the container's own
    win, as in Kubernetes)."""
    pod = spec.get("securityContext") or {}
    inherited = {
        k: pod[k] for k in ("runAsNonRoot", "runAsUser", "runAsGroup", "seccompProfile") if k in pod
    }
    return inherited | (container.get("securityContext") or {})


def writable_volume_mounts(spec: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """mountPath -> kind ("emptyDir", "persistentVolumeClaim", ...) of the container's mounts
    that it may write to; a StatefulSet's claim templates count as persistentVolumeClaim."""
    volumes = {v["name"]: next(k for k in v if k != "name") for v in spec.get("volumes", [])}
    found = {}
    for mount in container.get("volumeMounts", []):
        if not mount.get("readOnly"):
            found[mount["mountPath"]] = volumes.get(mount["name"], "persistentVolumeClaim")
    return found


def k8s_connects_to_ray(
    container: dict[str, Any], in_raycluster: bool, config: dict[str, str]
) -> bool:
    """Whether a container runs a Ray process or a Ray driver: every RayCluster container, and
    a container that runs `ray start` or whose Ray address (the ConfigMap's, unless its own env
    overrides it) is not empty."""
    if in_raycluster:
        return True
    env = dict(config) if any("configMapRef" in r for r in container.get("envFrom", [])) else {}
    env |= literal_env(container)
    command = " ".join([*container.get("command", []), *container.get("args", [])])
    return "ray start" in command or bool(env.get("SEEDGRID_RAY_ADDRESS"))


# Stand-ins for running the documented commands with no cluster: kubectl prints its arguments
# (\x1f after each, \x1e after each call); `openssl rand -hex N` prints N bytes in hex, fixed
# bytes so that the two copies of the command (docs, kustomization.yaml) compare equal.
SHELL_STUBS = r"""
kubectl() { printf '%s\x1f' "$@"; printf '\x1e'; }
openssl() {
  [ "$1 $2" = "rand -hex" ] || return 1
  local i
  for ((i = 0; i < $3; i++)); do printf '%02x' $(((i * 37 + 11) % 256)); done
}
"""


def documented_secret_scripts() -> dict[str, str]:
    """The shell lines that tell the operator to create seedgrid-secrets: the bash block of
    docs/deploy.md and the indented comment lines of kustomization.yaml."""
    blocks = [
        textwrap.dedent(m[2])
        for m in re.finditer(r"^( *)```bash\n(.*?)^\1```", DOCS.read_text(), re.M | re.S)
    ]
    (docs,) = [b for b in blocks if "create secret generic seedgrid-secrets" in b]
    comment = "\n".join(
        line.removeprefix("#   ")
        for line in (K8S / "kustomization.yaml").read_text().splitlines()
        if line.startswith("#   ")
    )
    return {"docs/deploy.md": docs, "kustomization.yaml": comment}


def documented_secret(where: str, script: str) -> dict[str, str]:
    """Runs the documented lines with kubectl stubbed and returns the Secret they create, after
    checking that the namespace is applied first and the Secret created in it."""
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", SHELL_STUBS + script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, f"{where}: {done.stderr}"
    calls = [call.split("\x1f")[:-1] for call in done.stdout.split("\x1e")[:-1]]
    namespace = yaml_documents(K8S / "kustomization.yaml")[0]["namespace"]
    find(yaml_documents(K8S / "namespace.yaml"), "Namespace", namespace)
    creates = [i for i, call in enumerate(calls) if "create" in call and "secret" in call]
    assert len(creates) == 1, f"{where}: {len(creates)} `kubectl create secret` commands"
    (i,) = creates
    assert calls[i][:6] == ["-n", namespace, "create", "secret", "generic", "seedgrid-secrets"], (
        f"{where}: kubectl {' '.join(calls[i])}"
    )
    assert ["apply", "-f", "deploy/k8s/namespace.yaml"] in calls[:i], (
        f"{where}: the Secret is created before its namespace exists"
    )
    literals = calls[i][6:]
    assert all(a.startswith("--from-literal=") for a in literals), f"{where}: {literals}"
    return dict(a.removeprefix("--from-literal=").split("=", 1) for a in literals)


def secret_key_refs(node: Any) -> Iterator[dict[str, str]]:
    """Every secretKeyRef (name, key) in a manifest tree."""
    if isinstance(node, dict):
        if "secretKeyRef" in node:
            yield node["secretKeyRef"]
        for value in node.values():
            yield from secret_key_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from secret_key_refs(item)


def test_kustomize_builds_everything_into_the_seedgrid_namespace() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        tool_missing(
            "kubectl is not installed (kustomize v4.1 or newer, i.e. kubectl 1.22 or "
            "newer: Debian 12's kubernetes-client 1.20 is too old for the "
            "kustomization); the structural Kubernetes tests still ran"
        )
    # `kubectl apply --dry-run=client` needs an API server even for client-side dry runs
    # (discovery); `kubectl kustomize` is the part of kubectl that works with no cluster.
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S)],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"KUBECONFIG": os.devnull},
    )
    assert done.returncode == 0, done.stderr
    built = [d for d in yaml.safe_load_all(done.stdout) if d]
    kustomization = yaml_documents(K8S / "kustomization.yaml")[0]
    namespace = kustomization["namespace"]
    assert {(o["kind"], o["metadata"]["name"]) for o in built} == {
        (o["kind"], o["metadata"]["name"]) for o in k8s_objects()
    }
    for obj in built:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == namespace, obj["metadata"]["name"]
    find(built, "Namespace", namespace)
    # The images: entry reaches every seedgrid container, the RayCluster's included.
    (image,) = kustomization["images"]
    wanted = f"{image['newName']}:{image['newTag']}"
    cluster = find(built, "RayCluster", "seedgrid")["spec"]
    containers = [
        *pod_containers(find(built, "Deployment", "seedgrid-api")),
        *pod_containers(find(built, "Deployment", "seedgrid-dispatcher")),
        *cluster["headGroupSpec"]["template"]["spec"]["containers"],
        *(c for g in cluster["workerGroupSpecs"] for c in g["template"]["spec"]["containers"]),
    ]
    assert {c["image"] for c in containers} == {wanted}


def test_builtin_kinds_validate_against_the_kubernetes_schemas() -> None:
    try:
        import kubernetes_validate
    except ImportError:
        tool_missing(
            "kubernetes-validate is not installed (it is in the dev extras: "
            "pip install -e '.[dev]'); the structural Kubernetes tests still ran"
        )
    objects = k8s_objects()
    checked = []
    for obj in objects:
        if obj["kind"] == "RayCluster":
            # The operator's CRD is not in the schemas; its pod templates are plain pods.
            groups = [obj["spec"]["headGroupSpec"], *obj["spec"]["workerGroupSpecs"]]
            for i, group in enumerate(groups):
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"ray-{i}"},
                    "spec": group["template"]["spec"],
                }
                kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
                checked.append(f"RayCluster group {i}")
            continue
        # Raises ValidationError with the field path on an unknown or mistyped field.
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        checked.append(obj["kind"])
    assert {"Deployment", "Service", "StatefulSet", "ConfigMap", "NetworkPolicy"} <= set(checked)


def test_raycluster_has_a_head_and_gpu_workers_whose_ray_gpus_match_their_limits() -> None:
    objects = k8s_objects()
    (cluster,) = [o for o in objects if o["kind"] == "RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    spec = cluster["spec"]
    assert spec["rayVersion"] == dockerfile_args()["RAY_VERSION"], (
        "rayVersion differs from the Ray version the image installs"
    )
    head = spec["headGroupSpec"]
    groups = spec["workerGroupSpecs"]
    for group in (head, *groups):
        params = group["rayStartParams"]
        assert all(isinstance(v, str) for v in params.values()), "rayStartParams must be strings"
        assert group["template"]["spec"]["containers"][0]["image"] == "seedgrid"
    assert head["rayStartParams"]["num-cpus"] == "0", "runs would be scheduled on the head"

    gpu_groups = 0
    for group in groups:
        assert group["groupName"]
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        (container,) = group["template"]["spec"]["containers"]
        resources = container["resources"]
        limit = int(resources.get("limits", {}).get("nvidia.com/gpu", 0))
        request = resources.get("requests", {}).get("nvidia.com/gpu")
        assert request is None or int(request) == limit, "GPU request differs from the limit"
        ray_gpus = int(group["rayStartParams"].get("num-gpus", limit))
        assert ray_gpus == limit, (
            f"group {group['groupName']}: Ray is told {ray_gpus} GPUs, the pod gets {limit}"
        )
        if limit:
            gpu_groups += 1
            env = literal_env(container)
            data_root = env["SEEDGRID_DATA_ROOT"]
            check_seedgrid_env(env, f"RayCluster group {group['groupName']}")
            mount = next(m for m in container["volumeMounts"] if m["mountPath"] == data_root)
            assert mount.get("readOnly") is True
            volume = next(
                v for v in group["template"]["spec"]["volumes"] if v["name"] == mount["name"]
            )
            find(objects, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert gpu_groups >= 1, "no worker group gets an nvidia.com/gpu"

    # The address seedgrid joins is the Service KubeRay makes for the head: <name>-head-svc.
    config = find(objects, "ConfigMap", "seedgrid-config")["data"]
    gcs_port = next(
        p["containerPort"]
        for p in head["template"]["spec"]["containers"][0]["ports"]
        if p["name"] == "gcs"
    )
    assert config["SEEDGRID_RAY_ADDRESS"] == f"{cluster['metadata']['name']}-head-svc:{gcs_port}"


def test_the_documented_secret_gives_what_the_manifests_read() -> None:
    """The kustomization ships no Secret (a placeholder in it would be a usable token): the
    operator creates seedgrid-secrets with the command of docs/deploy.md, repeated in
    kustomization.yaml. Both copies create the same keys, every key the manifests read from
    it, a token seedgrid accepts and a Ray token."""
    objects = k8s_objects()
    secrets = {
        where: documented_secret(where, script)
        for where, script in documented_secret_scripts().items()
    }
    assert secrets["kustomization.yaml"] == secrets["docs/deploy.md"], (
        "kustomization.yaml's comment and docs/deploy.md create different Secrets"
    )
    secret = secrets["docs/deploy.md"]
    referenced = {
        ref["key"] for ref in secret_key_refs(objects) if ref["name"] == "seedgrid-secrets"
    }
    # Whatever the pods read (secretKeyRef), and always the database URL (without it each pod
    # would open a SQLite file of its own), the API token (without it anyone who reaches the
    # Service is served) and Ray's token (without it Ray's token authentication cannot start).
    missing = (
        referenced | {"SEEDGRID_DATABASE_URL", "SEEDGRID_API_TOKEN", "RAY_AUTH_TOKEN"}
    ) - secret.keys()
    assert not missing, f"the documented Secret lacks {sorted(missing)}"
    for key in ("SEEDGRID_API_TOKEN", "RAY_AUTH_TOKEN"):
        token = secret[key]
        assert len(token) >= 16 and token.lower() not in PLACEHOLDER_SECRETS, (key, token)


def test_k8s_api_dispatcher_and_postgres_hang_together() -> None:
    objects = k8s_objects()
    config = find(objects, "ConfigMap", "seedgrid-config")["data"]
    secret = documented_secret("docs/deploy.md", documented_secret_scripts()["docs/deploy.md"])
    check_seedgrid_env(config | secret, "ConfigMap + the documented Secret")

    # The API: API-only processes behind a Service that reaches their port.
    api = find(objects, "Deployment", "seedgrid-api")
    (api_container,) = pod_containers(api)
    assert api_container["args"][:2] == ["serve", "--no-dispatch"]
    api_env = literal_env(api_container)
    check_seedgrid_env(config | secret | api_env, "the API Deployment")
    port = next(
        p for p in api_container["ports"] if p["containerPort"] == int(api_env["SEEDGRID_PORT"])
    )
    assert api_env["SEEDGRID_HOST"] == "0.0.0.0"
    assert api_container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    service = find(objects, "Service", "seedgrid-api")
    labels = api["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert api["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] in (port["name"], port["containerPort"])

    # The dispatcher: exactly one, never two during an update, on a zero-resource Ray node.
    dispatcher = find(objects, "Deployment", "seedgrid-dispatcher")
    assert dispatcher["spec"]["replicas"] == 1
    assert dispatcher["spec"]["strategy"]["type"] == "Recreate"
    (container,) = pod_containers(dispatcher)
    assert container["command"] == ["bash", "-c"]
    (script,) = container["args"]
    assert 'ray start --address="$SEEDGRID_RAY_ADDRESS" --num-cpus=0 --num-gpus=0' in script
    assert seedgrid_invocations_in_shell(script) == [["dispatcher"]]

    # Both read the ConfigMap, and of the Secret the operator creates only the keys each needs
    # (never the whole Secret through envFrom): the dispatcher no API token, the API no Ray
    # token (Ray's token authentication: test_k8s_ray_token_authentication_...).
    for deployment, keys in (
        (api, {"SEEDGRID_DATABASE_URL", "SEEDGRID_API_TOKEN"}),
        (dispatcher, {"SEEDGRID_DATABASE_URL", "RAY_AUTH_TOKEN"}),
    ):
        (container,) = pod_containers(deployment)
        refs = container["envFrom"]
        assert {r["configMapRef"]["name"] for r in refs if "configMapRef" in r} == {
            "seedgrid-config"
        }
        assert not [r for r in refs if "secretRef" in r], "the whole Secret in a pod's env"
        assert secret_env(container) == {k: ("seedgrid-secrets", k) for k in keys}, deployment[
            "metadata"
        ]["name"]

    # PostgreSQL: the URL in the documented Secret reaches the StatefulSet's Service with its
    # credentials.
    postgres = find(objects, "StatefulSet", "postgres")
    pg_service = find(objects, "Service", postgres["spec"]["serviceName"])
    assert pg_service["spec"]["selector"].items() <= (
        postgres["spec"]["template"]["metadata"]["labels"].items()
    )
    assert postgres["spec"]["volumeClaimTemplates"], "PostgreSQL without a persistent volume"
    (pg,) = pod_containers(postgres)
    pg_env = {e["name"]: e.get("value") for e in pg["env"]}
    password_ref = next(e for e in pg["env"] if e["name"] == "POSTGRES_PASSWORD")
    assert password_ref["valueFrom"]["secretKeyRef"]["name"] == "seedgrid-secrets"
    url = urlsplit(secret["SEEDGRID_DATABASE_URL"])
    assert url.scheme == "postgresql+psycopg"
    assert url.hostname == pg_service["metadata"]["name"]
    assert url.port == pg_service["spec"]["ports"][0]["port"]
    assert (url.username, url.path.lstrip("/")) == (pg_env["POSTGRES_USER"], pg_env["POSTGRES_DB"])
    assert url.password == secret[password_ref["valueFrom"]["secretKeyRef"]["key"]], (
        "the password in SEEDGRID_DATABASE_URL differs from POSTGRES_PASSWORD"
    )


def test_k8s_ray_token_authentication_is_on_for_every_ray_container_and_driver() -> None:
    """RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from the Secret in every Ray container (KubeRay
    copies the worker's env into its wait-gcs-ready init container) and the dispatcher; no pod
    that does not join Ray holds the token; the head keeps its dashboard on its loopback."""
    objects = k8s_objects()
    config = find(objects, "ConfigMap", "seedgrid-config")["data"]
    secret = documented_secret("docs/deploy.md", documented_secret_scripts()["docs/deploy.md"])
    connecting, others = [], []
    for where, _, spec in k8s_pods(objects):
        for container in all_containers(spec):
            joins = k8s_connects_to_ray(container, where.startswith("RayCluster"), config)
            (connecting if joins else others).append((where, container))
    assert {where for where, _ in connecting} == {
        "RayCluster seedgrid headgroup",
        "RayCluster seedgrid gpu",
        "Deployment seedgrid-dispatcher",
    }, [where for where, _ in connecting]
    for where, container in connecting:
        assert literal_env(container).get("RAY_AUTH_MODE") == "token", (
            f"{where}: Ray's token authentication is off"
        )
        assert secret_env(container).get("RAY_AUTH_TOKEN") == (
            "seedgrid-secrets",
            "RAY_AUTH_TOKEN",
        ), f"{where}: RAY_AUTH_TOKEN not from the Secret"
    assert secret.get("RAY_AUTH_TOKEN"), "the documented Secret has no RAY_AUTH_TOKEN"
    assert not {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & config.keys()
    for where, container in others:
        env = literal_env(container) | secret_env(container)
        assert "RAY_AUTH_TOKEN" not in env, f"{where} does not join Ray but holds the Ray token"
        assert not [r for r in container.get("envFrom", []) if "secretRef" in r], where

    cluster = find(objects, "RayCluster", "seedgrid")["spec"]
    # KubeRay's authOptions would generate a second token, which the dispatcher lacks.
    assert "authOptions" not in cluster, "authOptions next to the token from the Secret"
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"].get("dashboard-host") == "127.0.0.1", (
        "the dashboard (and its job API) listens beyond the head pod's loopback"
    )
    ports = {p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert 10001 not in ports, "the head publishes the Ray Client port"
    # The Ray node in the dispatcher's pod does not inherit the database URL.
    (container,) = pod_containers(find(objects, "Deployment", "seedgrid-dispatcher"))
    assert re.search(r"env -u SEEDGRID_DATABASE_URL\s+ray start ", container["args"][0])


def test_k8s_every_pod_and_container_runs_confined() -> None:
    """runAsNonRoot with a non-root uid, the RuntimeDefault seccomp profile, no privilege
    escalation, every capability dropped, a read-only root filesystem, and a writable volume
    wherever the process writes (emptyDirs: /tmp and the home of the seedgrid image, the socket
    directory and /tmp of PostgreSQL, whose data lives on its claim)."""
    objects = k8s_objects()
    pods = k8s_pods(objects)
    assert len(pods) == 5, [where for where, _, _ in pods]
    for where, _, spec in pods:
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(flag), f"{where}: {flag}"
        for container in all_containers(spec):
            at = f"{where}, container {container['name']}"
            context = effective_security_context(spec, container)
            assert context.get("runAsNonRoot") is True, f"{at}: runAsNonRoot"
            assert isinstance(context.get("runAsUser"), int) and context["runAsUser"] > 0, at
            assert (context.get("seccompProfile") or {}).get("type") == "RuntimeDefault", at
            assert context.get("allowPrivilegeEscalation") is False, f"{at}: privilege escalation"
            assert not context.get("privileged"), f"{at}: privileged"
            capabilities = context.get("capabilities") or {}
            assert "ALL" in capabilities.get("drop", []), f"{at}: capabilities not dropped"
            assert not capabilities.get("add"), f"{at}: adds {capabilities['add']}"
            assert context.get("readOnlyRootFilesystem") is True, f"{at}: writable image"
            writable = writable_volume_mounts(spec, container)
            if container["image"] == "seedgrid":
                needed = {"/tmp": "emptyDir", image_user()[2]: "emptyDir"}
            else:
                assert container["image"].startswith("postgres:"), at
                assert context["runAsUser"] == POSTGRES_IMAGE_UID, f"{at}: not the postgres user"
                pod = spec["securityContext"]
                assert pod.get("fsGroup") == POSTGRES_IMAGE_UID, f"{at}: its claim is not its own"
                assert pod.get("fsGroupChangePolicy") == "OnRootMismatch", at
                pgdata = next(e["value"] for e in container["env"] if e["name"] == "PGDATA")
                data = next(path for path in writable if pgdata.startswith(path + "/"))
                needed = {
                    "/tmp": "emptyDir",
                    "/var/run/postgresql": "emptyDir",
                    data: "persistentVolumeClaim",
                }
            assert needed.items() <= writable.items(), f"{at}: writable {writable}"


def policy_peers(rule: dict[str, Any], pods: list[tuple[str, dict[str, str], Any]]) -> set[str]:
    """The sources an ingress rule admits: the names of the manifests' pods its podSelectors
    match (same namespace), "anywhere" for a rule with no `from` or a peer beyond them."""
    if not rule.get("from"):
        return {"anywhere"}
    found = set()
    for peer in rule["from"]:
        if set(peer) != {"podSelector"}:
            found.add("anywhere")  # a namespaceSelector or an ipBlock reaches beyond the pods
            continue
        selector = peer["podSelector"]
        assert set(selector) == {"matchLabels"} and selector["matchLabels"], selector
        found |= {
            name for name, labels, _ in pods if selector["matchLabels"].items() <= labels.items()
        }
    return found


def admitted_ingress(
    policies: list[dict[str, Any]],
    pods: list[tuple[str, dict[str, str], Any]],
    target: tuple[str, dict[str, str], dict[str, Any]],
) -> dict[str, Any] | None:
    """NetworkPolicy's ingress semantics for one pod: None when no policy selects it (open to
    all), else source -> the container ports it may reach ("all" for a rule without ports)."""
    _, labels, spec = target
    selecting = [
        p["spec"]
        for p in policies
        if p["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
    ]
    for policy in selecting:
        assert policy.get("policyTypes"), "policyTypes left to the defaults"
        assert set(policy["podSelector"]) <= {"matchLabels"}, policy["podSelector"]
    selecting = [p for p in selecting if "Ingress" in p["policyTypes"]]
    if not selecting:
        return None
    named = {
        port["name"]: port["containerPort"]
        for c in spec["containers"]
        for port in c.get("ports", [])
        if "name" in port
    }
    admitted: dict[str, Any] = {}
    for policy in selecting:
        for rule in policy.get("ingress", []):
            ports = (
                {named.get(p["port"], p["port"]) for p in rule["ports"]}
                if rule.get("ports")
                else "all"
            )
            for source in policy_peers(rule, pods):
                previous = admitted.get(source, set())
                admitted[source] = "all" if "all" in (ports, previous) else previous | ports
    return admitted


def test_network_policies_admit_only_seedgrid_pods_to_ray_and_postgres() -> None:
    """Every pod is closed to inbound connections but for: the API's port (from anywhere), the
    Ray pods (from the Ray pods and the dispatcher only: the head's GCS, Ray Client and
    dashboard ports included), the dispatcher (from the Ray pods), PostgreSQL's port (from the
    API and the dispatcher only)."""
    objects = k8s_objects()
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert all(o["apiVersion"] == "networking.k8s.io/v1" for o in policies)
    pods = k8s_pods(objects)
    by_name = {pod[0]: pod for pod in pods}
    api, dispatcher = "Deployment seedgrid-api", "Deployment seedgrid-dispatcher"
    head, workers = "RayCluster seedgrid headgroup", "RayCluster seedgrid gpu"
    postgres = "StatefulSet postgres"
    assert set(by_name) == {api, dispatcher, head, workers, postgres}
    admitted = {name: admitted_ingress(policies, pods, pod) for name, pod in by_name.items()}
    for name, sources in admitted.items():
        assert sources is not None, f"no network policy selects {name}: open to every pod"

    ray_nodes = {head, workers, dispatcher}
    for name in (head, workers):
        assert set(admitted[name]) == ray_nodes, f"{name} admits {sorted(admitted[name])}"
    assert set(admitted[dispatcher]) <= ray_nodes, f"the dispatcher admits {admitted[dispatcher]}"
    assert {head, workers} <= set(admitted[dispatcher]), "the Ray pods cannot reach the driver"
    (pg_port,) = [
        p["containerPort"] for c in by_name[postgres][2]["containers"] for p in c["ports"]
    ]
    assert admitted[postgres] == {api: {pg_port}, dispatcher: {pg_port}}, admitted[postgres]
    # ... and the API stays reachable, on its port only.
    (api_port,) = [p["containerPort"] for c in by_name[api][2]["containers"] for p in c["ports"]]
    assert admitted[api] == {"anywhere": {api_port}}, admitted[api]


# --------------------------------------------------------------------------------------------
# secrets


def yaml_strings(node: Any, name: str = "") -> Iterator[tuple[str, str]]:
    """(name, value) of every string in a YAML tree, named by its mapping key, or by its item's
    `name` for Kubernetes' {name: ..., value: ...} env items."""
    if isinstance(node, dict):
        item_name = node.get("name")
        for key, value in node.items():
            own = item_name if key == "value" and isinstance(item_name, str) else str(key)
            yield from yaml_strings(value, own)
    elif isinstance(node, list):
        for item in node:
            yield from yaml_strings(item, name)
    elif isinstance(node, str):
        yield name, node


def test_no_deploy_file_carries_a_token_or_a_password() -> None:
    """A token or password shipped in a deploy file is one that someone will leave in place: the
    kustomization creates no Secret, compose requires both from the host (${VAR:?message}, no
    default), and no file under deploy/ holds a known placeholder."""
    kustomization = yaml_documents(K8S / "kustomization.yaml")[0]
    assert "secretGenerator" not in kustomization
    assert "Secret" not in {o["kind"] for o in k8s_objects()}
    required_from_host = re.compile(r"\$\{\w+:\?[^}]*\}")
    # Dotfiles are not shipped: deploy/.env is where an operator keeps the real values.
    files = [p for p in sorted(DEPLOY.rglob("*")) if p.is_file() and not p.name.startswith(".")]
    assert DOCKERFILE in files and COMPOSE in files
    for path in files:
        where = path.relative_to(ROOT)
        placeholders = re.findall(
            r"\b(?:change-?me(?:-too)?|replace-?me)\b", path.read_text(), re.I
        )
        assert not placeholders, f"{where} holds {placeholders}"
        if path.suffix not in {".yaml", ".yml"}:
            continue
        for doc in yaml_documents(path):
            for name, value in yaml_strings(doc):
                if name in NOT_SECRETS:
                    continue
                assert value.strip().lower() not in PLACEHOLDER_SECRETS, f"{where}: {name}"
                secrets = [value] if re.search(r"TOKEN|PASSWORD", name, re.I) else []
                secrets += re.findall(r"://[^:/@\s]+:([^@]+)@", value)  # a URL's password
                for secret in secrets:
                    assert required_from_host.fullmatch(secret), (
                        f"{where}: {name} carries {secret!r}, not a required host variable"
                    )


# --------------------------------------------------------------------------------------------
# the commands


def manifest_invocations() -> dict[str, list[str]]:
    """Every seedgrid command line the compose file and the Kubernetes manifests run."""
    found: dict[str, list[str]] = {}
    for name, service in compose_services().items():
        entrypoint, command = service.get("entrypoint"), service.get("command")
        if name in SEEDGRID_SERVICES and entrypoint is None:  # the image's: ["seedgrid"]
            found[f"compose {name}"] = command
        elif entrypoint == ["bash", "-c"]:
            for i, args in enumerate(seedgrid_invocations_in_shell(command[0])):
                found[f"compose {name} #{i}"] = args
    for obj in k8s_objects():
        if obj["kind"] != "Deployment":
            continue
        for container in pod_containers(obj):
            where = f"Deployment {obj['metadata']['name']}"
            if "command" not in container:  # the image's entrypoint: seedgrid
                found[where] = container["args"]
            elif container["command"] == ["bash", "-c"]:
                for i, args in enumerate(seedgrid_invocations_in_shell(container["args"][0])):
                    found[f"{where} #{i}"] = args
    return found


def test_every_seedgrid_command_line_in_the_manifests_exists_in_the_cli() -> None:
    invocations = manifest_invocations()
    subcommands = {args[0] for args in invocations.values()}
    assert subcommands == {"serve", "dispatcher"}, invocations
    assert len(invocations) == 4, invocations  # API and dispatcher, compose and Kubernetes
    for where, args in invocations.items():
        check_cli_invocation(args, where)
