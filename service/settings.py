"""Service settings, read once from SEEDGRID_* environment variables and validated at start-up."""

from __future__ import annotations

import os
import sys
from functools import cached_property, lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from api_schemas.data_roots import parse_data_roots

MIN_TOKEN_LENGTH = 16
# A secret of 16 characters drawn from few symbols is guessable (`aaaaaaaaaaaaaaaa` was once
# accepted); `openssl rand -hex 32` gives 16 distinct ones, a passphrase of words many.
MIN_DISTINCT_TOKEN_CHARACTERS = 8
# Values shipped in examples and templates: a token anyone can read is no token.
PLACEHOLDER_TOKENS = frozenset(
    {
        "change-me",
        "change-me-too",
        "changeme",
        "change_me",
        "replace-me",
        "replaceme",
        "secret",
        "token",
        "password",
        "seedgrid",
        "example",
        "placeholder",
        "your-token-here",
        "xxxxxxxx",
        "0123456789abcdef",
        "changemechangeme",
    }
)


def data_directory() -> Path:
    """seedgrid's directory in the platform's per-user data directory: $XDG_DATA_HOME/seedgrid,
    else ~/.local/share/seedgrid (Linux and other Unix); ~/Library/Application Support/seedgrid
    (macOS); %LOCALAPPDATA%\\seedgrid (Windows)."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = str(Path.home() / "Library" / "Application Support")
    else:
        xdg = os.environ.get("XDG_DATA_HOME", "")
        # the XDG base directory spec: a relative path is invalid and is ignored
        base = xdg if os.path.isabs(xdg) else str(Path.home() / ".local" / "share")
    return Path(base) / "seedgrid"


def default_database_path() -> Path:
    """The embedded SQLite file when SEEDGRID_DATABASE_URL is unset: one per user, wherever a
    command runs (the current directory would give each directory a database of its own)."""
    return data_directory() / "seedgrid.db"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SEEDGRID_", extra="ignore")

    # Any SQLAlchemy URL; the default is an embedded SQLite file in WAL mode, in the user's data
    # directory (default_database_path).
    database_url: str = Field(default_factory=lambda: f"sqlite:///{default_database_path()}")
    # None starts a local Ray; "auto" or "host:6379" joins a cluster (Ray Client, ray://, cannot
    # carry the workers' streaming generators).
    ray_address: str | None = None
    # CPUs of the local Ray instance (ignored when joining a cluster); None lets Ray decide.
    ray_num_cpus: int | None = Field(None, ge=1)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_runs_per_experiment: int = Field(10_000, ge=1)
    # Tasks submitted to Ray and not yet finished (their runs `pending` while they wait in Ray's
    # queue for resources, then `running`; a seed-batched task holds several runs); None: 4 x
    # the cluster's CPUs, at least 32.
    max_in_flight: int | None = Field(None, ge=1)
    # How often a worker sends its buffered metric points.
    metrics_batch_interval_s: float = Field(0.5, gt=0, le=60)
    # How often a worker samples its process's CPU, memory and GPU into its runs' points
    # (sys/... series, docs/system-metrics.md); 0 turns the sampling off.
    system_metrics_interval_s: float = Field(5.0, ge=0, le=3600)
    # How often the dispatcher looks for queued runs and cancellations while runs are in
    # flight; idle, it doubles its wait up to service.scheduling.dispatcher.IDLE_POLL_MAX_S.
    dispatch_poll_interval_s: float = Field(0.05, gt=0, le=10)
    # Fail a run at once when no alive node of the cluster has the CPUs and GPUs it asks for
    # (Ray would keep it pending for ever). Turn off on an autoscaling cluster, where such a
    # node may still be added.
    fail_infeasible_runs: bool = True
    # How long a submission waits for its pre-flight (service.scheduling.preflight: the dataset's
    # files
    # and the device, checked by one task on a node where its runs will go) before it queues
    # the runs unchecked; 0 turns the pre-flight off.
    preflight_timeout_s: float = Field(10.0, ge=0, le=300)
    log_level: str = "info"
    # Bearer token every endpoint but GET /healthz requires; empty: no authentication.
    api_token: SecretStr = SecretStr("")
    # Larger request bodies are refused with 413 before they are read.
    max_request_body_bytes: int = Field(1_048_576, ge=1024)
    # Specs whose runs would each need more memory (the trainer's estimate from the config:
    # parameters, optimiser state, activations, dataset) are refused with 422.
    max_run_memory_gb: float = Field(64.0, gt=0)
    # Specs whose runs would each log more metric points are refused with 422.
    max_points_per_run: int = Field(1_000_000, ge=1)
    # Runs queued over all experiments; a spec that would pass it gets 429 with Retry-After.
    max_queued_runs: int = Field(100_000, ge=1)
    # Heavy reads (a /stats page or /compare not stored yet, an export) one API process runs at
    # once; one more gets 503 with Retry-After at once. Stored pages are not counted.
    max_heavy_reads: int = Field(2, ge=1)
    # Named dataset roots a spec may select with config.data_root ("name=/path,name=/path");
    # without one, runs read $SEEDGRID_DATA_ROOT. Workers read the same variables.
    data_roots: str = ""
    # Let runs ask torchvision to download missing dataset files (config.download) into the
    # operator's data root; off, such specs are refused.
    allow_download: bool = False

    @field_validator("database_url")
    @classmethod
    def _valid_url(cls, value: str) -> str:
        try:
            url = make_url(value)
        except ArgumentError as exc:
            raise ValueError(f"not a SQLAlchemy database URL: {value!r}") from exc
        if url.get_backend_name() not in {"sqlite", "postgresql"}:
            raise ValueError(
                f"unsupported database {url.get_backend_name()!r}: use sqlite or postgresql"
            )
        return value

    @field_validator("api_token")
    @classmethod
    def _token(cls, value: SecretStr) -> SecretStr:
        token = value.get_secret_value().strip()
        if any(not ("!" <= c <= "~") for c in token):
            raise ValueError("the token must be printable ASCII without spaces")
        return SecretStr(token)

    @field_validator("api_token")
    @classmethod
    def _not_a_placeholder(cls, value: SecretStr) -> SecretStr:
        token = value.get_secret_value()
        if token and (token.lower() in PLACEHOLDER_TOKENS or len(token) < MIN_TOKEN_LENGTH):
            raise ValueError(
                f"the token must be a secret of at least {MIN_TOKEN_LENGTH} characters, not a "
                "placeholder (e.g. `openssl rand -hex 32`)"
            )
        if token and len(set(token)) < MIN_DISTINCT_TOKEN_CHARACTERS:
            raise ValueError(
                f"the token uses only {len(set(token))} distinct characters: a secret needs at "
                f"least {MIN_DISTINCT_TOKEN_CHARACTERS} (e.g. `openssl rand -hex 32`)"
            )
        return value

    @field_validator("data_roots")
    @classmethod
    def _data_roots(cls, value: str) -> str:
        parse_data_roots(value)  # raises ValueError naming the bad entry
        return value

    @cached_property
    def data_root_names(self) -> list[str]:
        return sorted(parse_data_roots(self.data_roots))

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        if value.lower() not in {"critical", "error", "warning", "info", "debug"}:
            raise ValueError(f"unknown log level {value!r}")
        return value.lower()


@lru_cache
def get_settings() -> Settings:
    return Settings()
