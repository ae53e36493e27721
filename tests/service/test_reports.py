"""Cross-run reports (trainers.reports) are served for any trainer that declares one, with no
change to the service: throwaway trainers registered for the test, their experiments and runs
stored directly, the reports read over HTTP (no dispatcher, no Ray)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from pydantic import BaseModel
from sqlmodel import Session

import trainers
from api_schemas import RunStatus
from service.api.server import BackgroundServer
from service.experiments import condition_key
from service.settings import Settings
from service.storage.db import Experiment, Run, make_engine
from trainers.base import ResourceEstimate, TrainerConfig
from trainers.reports import CrossRunReport, ExperimentRecord, RunRecord
from trainers.runtime import RunContext, TrainerBase, TrainOutput


class SeenRun(BaseModel):
    run_id: int
    seed: int
    status: RunStatus
    config: dict[str, Any]
    loss: float | None


class Tally(BaseModel):
    """What the report saw: the experiment and every run, as the service handed them over."""

    experiment_id: int
    trainer: str
    grid_axes: list[str]
    runs: list[SeenRun]


class CompletedCount(BaseModel):
    n_completed: int


def tally(experiment: ExperimentRecord, runs: Sequence[RunRecord]) -> Tally:
    return Tally(
        experiment_id=experiment.id,
        trainer=experiment.trainer,
        grid_axes=list(experiment.grid),
        runs=[
            SeenRun(
                run_id=r.id,
                seed=r.seed,
                status=r.status,
                config=dict(r.config),
                loss=r.metrics.get("loss"),
            )
            for r in runs
        ],
    )


def completed_count(_: ExperimentRecord, runs: Sequence[RunRecord]) -> CompletedCount:
    return CompletedCount(n_completed=sum(r.status == RunStatus.completed for r in runs))


class ToyConfig(TrainerConfig):
    width: int = 4  # the toy trainers' runs are rows the tests write; their loop is trivial
    depth: int = 1


class ToyTrainer(TrainerBase):
    name: ClassVar[str] = "toy"
    description: ClassVar[str] = "A trainer that never runs, with a report."
    paper: ClassVar[str] = "none"
    Config: ClassVar[type[ToyConfig]] = ToyConfig
    metrics: ClassVar[tuple[str, ...]] = ("loss",)
    diagnostics: ClassVar[tuple[str, ...]] = ()
    primary_metric: ClassVar[str] = "loss"
    reports: ClassVar[tuple[CrossRunReport[Any], ...]] = (
        CrossRunReport(
            name="tally",
            description="Every run as the report sees it.",
            response_model=Tally,
            build=tally,
        ),
    )

    def train(self, config: ToyConfig, run: RunContext) -> TrainOutput:
        return TrainOutput(metrics={"loss": float(config.width)})

    def estimate(self, config: ToyConfig) -> ResourceEstimate:
        return ResourceEstimate(1024, (), 1, ())


class OtherToyTrainer(ToyTrainer):
    """Declares a report of the same name with another model: the route serves both."""

    name: ClassVar[str] = "toy2"
    reports: ClassVar[tuple[CrossRunReport[Any], ...]] = (
        CrossRunReport(
            name="tally",
            description="How many runs completed.",
            response_model=CompletedCount,
            build=completed_count,
        ),
    )


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[BackgroundServer]:
    """A service created after the toy trainers joined the registry, as a deployment with
    them installed would be."""
    monkeypatch.setitem(trainers.REGISTRY, "toy", ToyTrainer())
    monkeypatch.setitem(trainers.REGISTRY, "toy2", OtherToyTrainer())
    with BackgroundServer(
        Settings(database_url=f"sqlite:///{tmp_path / 'seedgrid.db'}"), dispatch=False
    ) as server:
        yield server


def store(database_url: str, trainer: str, runs: list[tuple[dict[str, Any], int, str]]) -> int:
    """An experiment of `trainer` over a `width` grid with base config depth=3, and its runs
    (condition, seed, status) in this order; its id."""
    engine = make_engine(database_url)
    with Session(engine) as session:
        experiment = Experiment(
            name="reports",
            trainer=trainer,
            metric="loss",
            spec={
                "name": "reports",
                "trainer": trainer,
                "config": {"depth": 3},
                "grid": {"width": [4, 8]},
            },
            n_conditions=2,
            n_runs=len(runs),
        )
        session.add(experiment)
        session.commit()
        assert experiment.id is not None
        for condition, seed, status in runs:
            session.add(
                Run(
                    experiment_id=experiment.id,
                    condition=condition,
                    condition_key=condition_key(condition),
                    seed=seed,
                    trainer=trainer,
                    status=status,
                    metrics={"loss": 0.5 + seed} if status == "completed" else {},
                )
            )
        session.commit()
        experiment_id = experiment.id
    engine.dispose()
    return experiment_id


def database_url(server: BackgroundServer) -> str:
    return server.app.state.settings.database_url


def test_a_declared_report_is_served_for_its_trainer(server: BackgroundServer) -> None:
    toy = store(
        database_url(server), "toy", [({"width": 8}, 1, "completed"), ({"width": 4}, 0, "failed")]
    )
    other = store(
        database_url(server), "toy2", [({"width": 4}, 0, "completed"), ({"width": 8}, 0, "queued")]
    )
    with httpx.Client(base_url=server.url, timeout=30) as client:
        seen = client.get(f"/experiments/{toy}/reports/tally")
        counted = client.get(f"/experiments/{other}/reports/tally")
        listed = {t["name"]: t["reports"] for t in client.get("/trainers").json()}
        schema = client.get("/openapi.json").json()
    assert seen.status_code == 200, seen.text
    first_run = seen.json()["runs"][0]["run_id"]
    # runs in id order, any status, each config the base config with the run's condition
    assert seen.json() == {
        "experiment_id": toy,
        "trainer": "toy",
        "grid_axes": ["width"],
        "runs": [
            {
                "run_id": first_run,
                "seed": 1,
                "status": "completed",
                "config": {"depth": 3, "width": 8},
                "loss": 1.5,
            },
            {
                "run_id": first_run + 1,
                "seed": 0,
                "status": "failed",
                "config": {"depth": 3, "width": 4},
                "loss": None,
            },
        ],
    }
    assert counted.status_code == 200, counted.text
    assert counted.json() == {"n_completed": 1}
    assert listed["toy"] == listed["toy2"] == ["tally"]
    assert listed["feedback"] == ["protocol"] and listed["collapse"] == []
    operation = schema["paths"]["/experiments/{experiment_id}/reports/tally"]["get"]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "anyOf": [
            {"$ref": "#/components/schemas/Tally"},
            {"$ref": "#/components/schemas/CompletedCount"},
        ],
        "title": "Response Get Tally Report",
    }
    assert operation["operationId"] == "get_tally_report"
    assert operation["description"] == "Every run as the report sees it. How many runs completed."


def test_a_report_the_trainer_does_not_declare_is_a_404_naming_its_reports(
    server: BackgroundServer,
) -> None:
    collapse = store(database_url(server), "collapse", [({"width": 4}, 0, "completed")])
    toy = store(database_url(server), "toy", [({"width": 4}, 0, "completed")])
    retired = store(database_url(server), "retired", [({"width": 4}, 0, "completed")])
    with httpx.Client(base_url=server.url, timeout=30) as client:

        def detail(path: str) -> str:
            response = client.get(path)
            assert response.status_code == 404, response.text
            return str(response.json()["detail"])

        assert detail(f"/experiments/{collapse}/reports/tally") == (
            f"experiment {collapse} ran trainer 'collapse', which has no 'tally' report (its "
            "reports: none); 'tally' is a report of trainers 'toy', 'toy2'"
        )
        assert detail(f"/experiments/{toy}/reports/protocol") == (
            f"experiment {toy} ran trainer 'toy', which has no 'protocol' report (its reports: "
            "tally); 'protocol' is a report of trainer 'feedback'"
        )
        assert detail(f"/experiments/{toy}/protocol") == detail(
            f"/experiments/{toy}/reports/protocol"
        )
        assert detail(f"/experiments/{toy}/reports/summary") == (
            f"experiment {toy} ran trainer 'toy', which has no 'summary' report (its reports: "
            "tally); no trainer has a 'summary' report"
        )
        assert detail(f"/experiments/{retired}/reports/tally") == (
            f"experiment {retired} ran trainer 'retired', which this seedgrid does not have; "
            "'tally' is a report of trainers 'toy', 'toy2'"
        )
        assert detail("/experiments/987654/reports/tally") == "experiment 987654 not found"
        assert detail("/experiments/987654/reports/summary") == "experiment 987654 not found"
        assert client.get(f"/experiments/{toy}/reports/Not%20a%20name").status_code == 422
        assert client.get("/experiments/0/reports/tally").status_code == 422
