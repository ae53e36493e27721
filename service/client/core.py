"""The Client class (service.client): the API's calls, the one pager and the one retry policy,
answers as api_schemas models or pandas DataFrames."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from api_schemas import (
    AddSeeds,
    ExperimentComparison,
    ExperimentCreated,
    ExperimentDetail,
    ExperimentImported,
    ExperimentSpec,
    ExperimentStatus,
    ExperimentSummary,
    Health,
    ParamsTable,
    RunDetail,
    RunOut,
    RunStatus,
    SeedsAdded,
    Stats,
    TrainerInfo,
    environment,
)
from api_schemas.pages import (
    COMPARE_PAGE,
    COMPARISONS_PAGE,
    EXPERIMENTS_PAGE,
    POINTS_PAGE,
    RUNS_PAGE,
)
from service.client.http import (
    MAX_RETRIES,
    MAX_RETRY_WAIT_S,
    RETRIED_STATUSES,
    ApiError,
    RetryHook,
    Unreachable,
    default_address,
    error_detail,
    resend_on_new_connection,
    retry_after_s,
)
from service.client.imports import results_body
from service.spec_file import load_spec_file

if TYPE_CHECKING:
    import pandas as pd

POINT_COLUMNS = ["step", "epoch", "name", "value"]


@dataclass(frozen=True)
class StatsFrames:
    """/stats as DataFrames: one row per condition, one per comparison, and the full answer
    (multiplicity families, omnibus tests, source decomposition) as served. Unpacks as
    `conditions, comparisons = client.stats(id)`."""

    conditions: pd.DataFrame
    comparisons: pd.DataFrame
    stats: Stats

    def __iter__(self) -> Iterator[pd.DataFrame]:
        return iter((self.conditions, self.comparisons))


class Client:
    """The seedgrid API over HTTP. `url` defaults to `default_url()` (`url_source` says where
    it came from, for messages), `token` to SEEDGRID_API_TOKEN (none: no Authorization header).
    A 503 or 429 answer is sent again after its Retry-After, `retries` times and
    `max_retry_wait_s` of waiting in all (`on_retry` is told before each); `transport` replaces
    the network (httpx.MockTransport, in tests)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 60.0,
        retries: int = MAX_RETRIES,
        max_retry_wait_s: float = MAX_RETRY_WAIT_S,
        on_retry: RetryHook | None = None,
        url_source: str = "the url given",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if url:
            self.url, self.url_source = url, url_source
        else:
            self.url, self.url_source = default_address()
        self.retries = retries
        self.max_retry_wait_s = max_retry_wait_s
        self.on_retry = on_retry
        token = token if token is not None else environment.text(environment.API_TOKEN)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=self.url, timeout=timeout_s, headers=headers, transport=transport
        )

    @property
    def base_url(self) -> str:
        """The URL requests go to, as httpx holds it (with its trailing slash)."""
        return str(self._http.base_url)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- experiments ---------------------------------------------------------------------------
    def submit(self, spec: Mapping[str, Any] | ExperimentSpec | str | Path) -> ExperimentCreated:
        """Submit a spec: a dict, an ExperimentSpec, or the path of a .json or .yaml file."""
        body: Any
        if isinstance(spec, ExperimentSpec):
            body = spec.model_dump(mode="json", exclude_unset=True)
        elif isinstance(spec, str | Path):
            body = load_spec_file(Path(spec))
        else:
            body = dict(spec)
        return ExperimentCreated.model_validate(self.request("POST", "/experiments", json=body))

    def experiment(self, experiment_id: int) -> ExperimentDetail:
        return ExperimentDetail.model_validate(self.request("GET", f"/experiments/{experiment_id}"))

    def experiments(
        self,
        status: ExperimentStatus | str | None = None,
        *,
        tags: Collection[str] = (),
        trainer: str | None = None,
        created_after: datetime | date | str | None = None,
        created_before: datetime | date | str | None = None,
        search: str | None = None,
    ) -> list[ExperimentSummary]:
        """Every experiment (newest first) that passes every filter given: its status, all of
        `tags`, its trainer, created at or after `created_after` and before `created_before`
        (dates or times, UTC unless they say), `search` in its name, note, tags or trainer."""
        params: dict[str, Any] = {"tag": list(tags)}
        for name, value in (
            ("status", status),
            ("trainer", trainer),
            ("created_after", created_after),
            ("created_before", created_before),
            ("q", search),
        ):
            if value is not None:
                params[name] = value.isoformat() if isinstance(value, date) else str(value)
        return [
            ExperimentSummary.model_validate(e)
            for e in self.pages("/experiments", EXPERIMENTS_PAGE, params)
        ]

    def label(
        self,
        experiment_id: int,
        *,
        tags: Collection[str] | None = None,
        note: str | None = None,
    ) -> ExperimentDetail:
        """Replace the experiment's tags and/or note (PATCH); what is None stays as it is (an
        empty note removes it)."""
        body: dict[str, Any] = {}
        if tags is not None:
            body["tags"] = list(tags)
        if note is not None:
            body["note"] = note
        return ExperimentDetail.model_validate(
            self.request("PATCH", f"/experiments/{experiment_id}", json=body)
        )

    def tag(
        self, experiment_id: int, add: Collection[str] = (), remove: Collection[str] = ()
    ) -> ExperimentDetail:
        """Add the tags `add` and remove the tags `remove`; the others stay. One request that
        the service applies to the tags as stored: concurrent edits do not undo each other."""
        body = {"add_tags": list(add), "remove_tags": list(remove)}
        return ExperimentDetail.model_validate(
            self.request("PATCH", f"/experiments/{experiment_id}", json=body)
        )

    def params(self, experiment_id: int, metric: str | None = None) -> pd.DataFrame:
        """The params table: one row per condition, `condition_key`, its n, mean and std of
        `metric` (default: the spec's), then every config field as `config.<name>` (those that
        vary across the conditions first; their names are the frame's `attrs["varying"]`)."""
        import pandas as pd

        table = self.params_table(experiment_id, metric)
        rows = [
            {
                "condition_key": c.condition_key,
                "n": c.n,
                "mean": c.mean,
                "std": c.std,
                **{f"config.{field}": c.config.get(field) for field in table.fields},
            }
            for c in table.conditions
        ]
        columns = ["condition_key", "n", "mean", "std", *(f"config.{f}" for f in table.fields)]
        frame = pd.DataFrame(rows, columns=columns)
        frame.attrs.update(metric=table.metric, varying=list(table.varying))
        return frame

    def params_table(self, experiment_id: int, metric: str | None = None) -> ParamsTable:
        """GET /experiments/{id}/params as the API's model."""
        params = {} if metric is None else {"metric": metric}
        return ParamsTable.model_validate(
            self.request("GET", f"/experiments/{experiment_id}/params", params=params)
        )

    def wait(
        self,
        experiment_id: int,
        *,
        progress: bool = True,
        poll_s: float = 0.5,
        timeout_s: float | None = None,
    ) -> ExperimentDetail:
        """Poll until every run of the experiment has ended; with `progress`, a progress bar of
        ended runs (rich). TimeoutError after `timeout_s` (None: no limit)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        detail = self.experiment(experiment_id)
        if not progress:
            while not _ended(detail):
                _sleep_or_time_out(poll_s, deadline, detail)
                detail = self.experiment(experiment_id)
            return detail
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
        ) as bar:
            task = bar.add_task(detail.name, total=detail.n_runs, counts="")
            while True:
                counts = detail.counts.model_dump()
                ended = sum(n for status, n in counts.items() if status not in RunStatus.active())
                # an adaptive experiment's total grows with each round
                bar.update(
                    task,
                    total=detail.n_runs,
                    completed=ended,
                    counts=", ".join(f"{s} {n}" for s, n in counts.items() if n),
                )
                if _ended(detail):
                    return detail
                _sleep_or_time_out(poll_s, deadline, detail)
                detail = self.experiment(experiment_id)

    def cancel(self, experiment_id: int) -> ExperimentDetail:
        return ExperimentDetail.model_validate(
            self.request("POST", f"/experiments/{experiment_id}/cancel")
        )

    def add_seeds(self, experiment_id: int, seeds: int | list[int]) -> SeedsAdded:
        """More seeds for every condition: a count (the next unused seeds) or explicit seeds."""
        body = AddSeeds.model_validate({"seeds": seeds}).model_dump(mode="json", exclude_unset=True)
        return SeedsAdded.model_validate(
            self.request("POST", f"/experiments/{experiment_id}/seeds", json=body)
        )

    def import_results(
        self,
        results: Mapping[str, Any] | str | Path,
        *,
        into: int | None = None,
        name: str | None = None,
        seed_column: str | None = None,
        metrics: list[str] | None = None,
        metric: str | None = None,
    ) -> ExperimentImported:
        """Import per-seed results (a .csv or .json file, or a body with `runs` or `csv`) as a
        new experiment named `name` (default: the file's), or into the imported experiment
        `into`; ResultsFileError for a file that cannot be read."""
        body = results_body(
            results,
            new=into is None,
            name=name,
            seed_column=seed_column,
            metrics=metrics,
            metric=metric,
        )
        path = "/experiments/import" if into is None else f"/experiments/{into}/import"
        return ExperimentImported.model_validate(self.request("POST", path, json=body))

    # -- runs ----------------------------------------------------------------------------------
    def run_list(self, experiment_id: int, status: RunStatus | str | None = None) -> list[RunOut]:
        """Every run of the experiment as the API's models, in run order."""
        params = {} if status is None else {"status": str(status)}
        return [
            RunOut.model_validate(r)
            for r in self.pages(f"/experiments/{experiment_id}/runs", RUNS_PAGE, params)
        ]

    def runs(self, experiment_id: int, status: RunStatus | str | None = None) -> pd.DataFrame:
        """One row per run: id, seed, status, condition_key, one column per grid factor, each
        final metric as `metric.<name>`, attempts, error, times and the warning count."""
        import pandas as pd

        rows = []
        for run in self.run_list(experiment_id, status):
            row: dict[str, Any] = {
                "run_id": run.id,
                "seed": run.seed,
                "status": str(run.status),
                "condition_key": run.condition_key,
            }
            row.update(_factor_columns(run.condition, reserved=row))
            row.update({f"metric.{name}": value for name, value in run.metrics.items()})
            row.update(
                {
                    "attempts": run.attempts,
                    "error": run.error,
                    "started_at": run.started_at,
                    "finished_at": run.finished_at,
                    "warnings": len(run.warnings),
                }
            )
            rows.append(row)
        return pd.DataFrame(rows)

    def run(self, run_id: int) -> RunDetail:
        return RunDetail.model_validate(self.request("GET", f"/runs/{run_id}"))

    def curves(
        self,
        experiment_id: int | None = None,
        *,
        run_ids: list[int] | None = None,
        name: str | None = None,
    ) -> pd.DataFrame:
        """Metric curves in long form: run_id, seed, condition_key, one column per grid factor,
        step, epoch, name, value; of every run of an experiment, or of the given runs.
        `name` keeps one metric."""
        import pandas as pd

        if (experiment_id is None) == (run_ids is None):
            raise ValueError("give either experiment_id or run_ids")
        runs: list[RunOut] = (
            self.run_list(experiment_id)
            if experiment_id is not None
            else [self.run(i) for i in run_ids or []]
        )
        frames = []
        for run in runs:
            points = list(
                self.pages(
                    f"/runs/{run.id}/metrics", POINTS_PAGE, {} if name is None else {"name": name}
                )
            )
            head: dict[str, Any] = {
                "run_id": run.id,
                "seed": run.seed,
                "condition_key": run.condition_key,
            }
            head.update(_factor_columns(run.condition, reserved={*head, *POINT_COLUMNS}))
            frame = pd.DataFrame(points, columns=POINT_COLUMNS).assign(**head)
            frames.append(frame[[*head, *POINT_COLUMNS]])
        if not frames:
            return pd.DataFrame(columns=["run_id", "seed", "condition_key", *POINT_COLUMNS])
        return pd.concat(frames, ignore_index=True)

    # -- statistics ----------------------------------------------------------------------------
    def stats(
        self,
        experiment_id: int,
        metric: str | None = None,
        factor: str | None = None,
        scale: str | None = None,
    ) -> StatsFrames:
        """/stats of `metric` (default: the spec's) on `scale` ("raw" or "log"; default: the
        spec's analysis.scale), every comparison (pages followed), as DataFrames: conditions
        (one column per grid factor, then the summary; intervals split into `<name>_low` and
        `<name>_high`) and comparisons (`within` as served: null for a comparison pooled over
        the other factors; a ratio interval's missing high end, as in `primary_ci95_high`, is
        unbounded). Each comparison's primary test is `primary_p`, raw, and
        `primary_p_holm_factor` / `primary_p_holm_all`, Holm-adjusted."""
        import pandas as pd

        params: dict[str, Any] = {"limit": COMPARISONS_PAGE}
        for name, value in (("metric", metric), ("factor", factor), ("scale", scale)):
            if value is not None:
                params[name] = value
        path = f"/experiments/{experiment_id}/stats"
        stats = Stats.model_validate(self.request("GET", path, params=params))
        comparisons = list(stats.comparisons)
        while stats.next_offset is not None:
            page = Stats.model_validate(
                self.request("GET", path, params={**params, "offset": stats.next_offset})
            )
            comparisons += page.comparisons
            stats = stats.model_copy(update={"next_offset": page.next_offset})
        stats = stats.model_copy(update={"comparisons": comparisons, "offset": 0})

        condition_rows = []
        for condition in stats.conditions:
            fields = condition.model_dump(mode="json", exclude={"condition", "runs"})
            row = _factor_columns(condition.condition, reserved=fields)
            row.update(_split_intervals(fields))
            condition_rows.append(row)
        comparison_rows = [_split_intervals(c.model_dump(mode="json")) for c in comparisons]
        return StatsFrames(
            conditions=pd.DataFrame(condition_rows),
            comparisons=pd.DataFrame(comparison_rows),
            stats=stats,
        )

    def compare(self, a: int, b: int, metric: str | None = None) -> ExperimentComparison:
        """/compare of two experiments, every shared condition (pages followed)."""
        params: dict[str, Any] = {"a": a, "b": b, "limit": COMPARE_PAGE}
        if metric is not None:
            params["metric"] = metric
        result = ExperimentComparison.model_validate(self.request("GET", "/compare", params=params))
        conditions = list(result.conditions)
        while result.next_offset is not None:
            page = ExperimentComparison.model_validate(
                self.request("GET", "/compare", params={**params, "offset": result.next_offset})
            )
            conditions += page.conditions
            result = result.model_copy(update={"next_offset": page.next_offset})
        return result.model_copy(update={"conditions": conditions, "offset": 0})

    # -- the service ---------------------------------------------------------------------------
    def trainers(self) -> list[TrainerInfo]:
        return [TrainerInfo.model_validate(t) for t in self.request("GET", "/trainers")]

    def health(self) -> Health:
        return Health.model_validate(self.request("GET", "/healthz"))

    # -- exports -------------------------------------------------------------------------------
    def export(
        self, experiment_id: int, target: str | Path, file_format: str = "csv", what: str = "runs"
    ) -> int:
        """GET /experiments/{id}/export (`what`: runs or curves; `file_format`: csv or parquet)
        streamed into `target`, through a temporary file beside it, so that a broken download
        never leaves a truncated file under the name asked for; the bytes written. An OSError
        of the file is raised as it is."""
        target = Path(target)
        partial = target.with_name(target.name + ".part")
        written = 0
        with self.stream(
            "GET",
            f"/experiments/{experiment_id}/export",
            params={"format": file_format, "what": what},
        ) as response:
            try:
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes():
                        written += out.write(chunk)
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
        partial.replace(target)
        return written

    # -- HTTP ----------------------------------------------------------------------------------
    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The API's JSON answer as served (None for an empty one), after the retries a 503 or
        429 asks for; ApiError for an error answer, Unreachable when none comes."""
        retry, waited_s, resent = 0, 0.0, False
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.HTTPError as exc:
                if not resent and resend_on_new_connection(method, exc):
                    resent = True
                    continue
                raise Unreachable(self.url, exc) from exc
            if response.status_code < 400:
                return response.json() if response.content else None
            wait = self._retry_wait(method, path, response, retry, waited_s)
            time.sleep(wait)
            retry, waited_s = retry + 1, waited_s + wait

    @contextmanager
    def stream(self, method: str, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """A response whose body is read as it comes, after request()'s retries; an error
        answer raises ApiError, a connection lost before or while reading Unreachable."""
        retry, waited_s, resent, answered = 0, 0.0, False, False
        while True:
            try:
                with self._http.stream(method, path, **kwargs) as response:
                    answered = True
                    if response.status_code < 400:
                        yield response
                        return
                    response.read()
            except httpx.HTTPError as exc:
                if not answered and not resent and resend_on_new_connection(method, exc):
                    resent = True
                    continue
                raise Unreachable(self.url, exc) from exc
            wait = self._retry_wait(method, path, response, retry, waited_s)
            time.sleep(wait)
            retry, waited_s = retry + 1, waited_s + wait

    def pages(
        self, path: str, limit: int, params: Mapping[str, Any] | None = None
    ) -> Iterator[Any]:
        """Every item of a paged list: pages of `limit` (the endpoint's page size,
        api_schemas.pages) from offset 0 until one comes back short."""
        offset = 0
        while True:
            page = self.request(
                "GET", path, params={**(params or {}), "limit": limit, "offset": offset}
            )
            yield from page
            if len(page) < limit:
                return
            offset += len(page)

    def _retry_wait(
        self, method: str, path: str, response: httpx.Response, retry: int, waited_s: float
    ) -> float:
        """The seconds to wait before sending a refused request again, after telling
        `on_retry`; raises the answer as an ApiError when it is not one to retry, or when the
        retries or their time are used up."""
        error = ApiError(method, path, response.status_code, error_detail(response))
        if response.status_code not in RETRIED_STATUSES:
            raise error
        wait = retry_after_s(response)
        if retry >= self.retries or waited_s + wait > self.max_retry_wait_s:
            error.retries, error.waited_s, error.retry_after_s = retry, waited_s, wait
            raise error
        error.retries = retry
        if self.on_retry is not None:
            self.on_retry(error, wait)
        return wait


def has_ended(status: ExperimentStatus | str, counts: Mapping[str, int]) -> bool:
    """Whether an experiment is over: its status one that has ended, and none of its runs
    (`counts`: runs per run status) still active."""
    return status in ExperimentStatus.ended() and not any(
        counts.get(s, 0) for s in RunStatus.active()
    )


def _ended(detail: ExperimentDetail) -> bool:
    return has_ended(detail.status, detail.counts.model_dump())


def _sleep_or_time_out(poll_s: float, deadline: float | None, detail: ExperimentDetail) -> None:
    if deadline is not None and time.monotonic() + poll_s > deadline:
        raise TimeoutError(
            f"experiment {detail.id} is still {detail.status} ({detail.counts.model_dump()})"
        )
    time.sleep(poll_s)


def _factor_columns(condition: Mapping[str, Any], *, reserved: Collection[str]) -> dict[str, Any]:
    """A condition's factors as columns; a factor whose name another column already has
    becomes `condition.<name>`."""
    return {(f"condition.{k}" if k in reserved else k): v for k, v in condition.items()}


def _split_intervals(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Interval fields ([low, high] or null) as `<name>_low` and `<name>_high` columns."""
    row: dict[str, Any] = {}
    for key, value in fields.items():
        if "ci95" in key and not key.endswith(("_method", "_reason")):
            low, high = value if isinstance(value, list) else (None, None)
            row[f"{key}_low"], row[f"{key}_high"] = low, high
        else:
            row[key] = value
    return row
