"""Tags, notes, the list's filters and the params table (docs/organising.md) over real HTTP, a
real SQLite file and a real local Ray: set in the spec and by PATCH, every filter alone and
combined with paging, the bad values a user can type refused naming the parameter, and the
params table equal to the runs' own configs and to /stats; then the same through the Python
client. (The filters' SQL on PostgreSQL: tests/service/test_migrations.py's 0011 test.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from service.client import ApiError, Client
from tests.conftest import Service

QUICK = {"n_samples": 64, "steps": 60}


def names(service: Service, **params: Any) -> list[str]:
    response = service.client.get("/experiments", params=params)
    assert response.status_code == 200, response.text
    return [e["name"] for e in response.json()]


def refused(service: Service, method: str, path: str, **kwargs: Any) -> list[Any]:
    """The locations a 422 names."""
    response = service.client.request(method, path, **kwargs)
    assert response.status_code == 422, response.text
    return [e["loc"] for e in response.json()["detail"]]


def test_tags_notes_filters_and_params_table(service: Service) -> None:
    sweep = service.submit(
        {
            "name": "stop-grad sweep",
            "trainer": "collapse",
            "config": {**QUICK, "r": 0.1},
            "grid": {"stop_gradient": [False, True]},
            "seeds": 2,
            "metric": "min_l2",
            "tags": ["sweep", "cpu"],
            "note": "First look at the Stop-Gradient",
        }
    )["id"]
    baseline = service.submit(
        {"name": "baseline", "trainer": "collapse", "config": QUICK, "seeds": 1, "tags": ["cpu"]}
    )["id"]
    # A tag or note that cannot be one, and an unknown spec field, store nothing.
    assert refused(
        service,
        "POST",
        "/experiments",
        json={"name": "x", "trainer": "collapse", "tags": ["has space"]},
    ) == [["body", "tags", 0]]
    assert refused(
        service,
        "POST",
        "/experiments",
        json={"name": "x", "trainer": "collapse", "tags": ["a", "a"]},
    ) == [["body", "tags"]]
    assert refused(
        service,
        "POST",
        "/experiments",
        json={"name": "x", "trainer": "collapse", "note": "n" * 5001},
    ) == [["body", "note"]]
    assert refused(
        service, "POST", "/experiments", json={"name": "x", "trainer": "collapse", "label": "a"}
    ) == [["body", "label"]]
    assert service.wait(sweep, timeout_s=600)["status"] == "completed"
    assert service.wait(baseline, timeout_s=600)["status"] == "completed"

    detail = service.client.get(f"/experiments/{sweep}").json()
    assert (detail["tags"], detail["note"]) == (["sweep", "cpu"], "First look at the Stop-Gradient")
    assert (detail["spec"]["tags"], detail["spec"]["note"]) == (detail["tags"], detail["note"])

    # Every filter, alone and combined, newest first.
    today = datetime.now(UTC).date()
    assert names(service, tag="cpu") == ["baseline", "stop-grad sweep"]
    assert names(service, tag=["cpu", "sweep"]) == ["stop-grad sweep"]
    assert names(service, tag="gpu") == []
    assert names(service, trainer="collapse") == ["baseline", "stop-grad sweep"]
    assert names(service, trainer="ssl") == []
    assert names(service, status="completed", tag="sweep") == ["stop-grad sweep"]
    assert names(service, status="running") == []
    assert names(service, created_after=today.isoformat()) == ["baseline", "stop-grad sweep"]
    assert names(service, created_after=(today + timedelta(days=1)).isoformat()) == []
    assert names(service, created_before=today.isoformat()) == []
    assert names(service, q="stop-GRADIENT") == ["stop-grad sweep"]  # the note
    assert names(service, q="BASE") == ["baseline"]  # the name
    assert names(service, q="swe") == ["stop-grad sweep"]  # a tag
    assert names(service, q="collap") == ["baseline", "stop-grad sweep"]  # the trainer
    assert names(service, q="cpu", tag="sweep", trainer="collapse") == ["stop-grad sweep"]
    # ... paged: a full page links to the next
    first = service.client.get("/experiments", params={"tag": "cpu", "limit": 1})
    assert [e["id"] for e in first.json()] == [baseline]
    assert 'rel="next"' in first.headers["link"] and "tag=cpu" in first.headers["link"]
    assert names(service, tag="cpu", limit=1, offset=1) == ["stop-grad sweep"]

    # Bad filter values: a 422 naming the parameter.
    assert refused(service, "GET", "/experiments", params={"tag": "no space"}) == [["query", "tag"]]
    assert refused(service, "GET", "/experiments", params={"status": "done"}) == [
        ["query", "status"]
    ]
    assert refused(service, "GET", "/experiments", params={"created_after": "yesterday"}) == [
        ["query", "created_after"]
    ]
    assert refused(
        service,
        "GET",
        "/experiments",
        params={"created_after": today.isoformat(), "created_before": "2020-01-01"},
    ) == [["query", "created_before"]]
    assert refused(service, "GET", "/experiments", params={"q": "x" * 101}) == [["query", "q"]]
    assert refused(service, "GET", "/experiments", params={"tag": ["a"] * 21}) == [["query", "tag"]]

    # PATCH replaces what it names, keeps the rest; its refusals name the field.
    patched = service.client.patch(f"/experiments/{sweep}", json={"tags": ["sweep", "kept"]})
    assert patched.status_code == 200, patched.text
    assert (patched.json()["tags"], patched.json()["note"]) == (
        ["sweep", "kept"],
        "First look at the Stop-Gradient",
    )
    assert names(service, tag="cpu") == ["baseline"]
    assert names(service, tag="kept") == ["stop-grad sweep"]
    patched = service.client.patch(f"/experiments/{sweep}", json={"note": ""})
    assert (patched.json()["tags"], patched.json()["note"]) == (["sweep", "kept"], None)
    assert names(service, q="gradient") == []
    assert refused(service, "PATCH", f"/experiments/{sweep}", json={"tags": ["x y"]}) == [
        ["body", "tags", 0]
    ]
    assert refused(service, "PATCH", f"/experiments/{sweep}", json={"colour": "red"}) == [
        ["body", "colour"]
    ]
    assert service.client.patch("/experiments/999", json={"tags": []}).status_code == 404

    # The params table: every condition's config as its runs ran it, with the n, mean and std
    # /stats serves. The fields that vary come first: stop_gradient, and lr, whose default the
    # trainer resolves per condition (the paper's 0.5 without stop-gradient, 0.2 with it).
    table = service.client.get(f"/experiments/{sweep}/params").json()
    stats = service.client.get(f"/experiments/{sweep}/stats").json()
    assert table["metric"] == "min_l2"
    assert table["varying"] == table["fields"][:2] == ["stop_gradient", "lr"]
    assert [c["config"]["lr"] for c in table["conditions"]] == [0.5, 0.2]
    assert {"r", "n_samples", "steps", "lr"} <= set(table["fields"])
    summaries = {c["condition_key"]: c for c in stats["conditions"]}
    runs = service.runs(sweep)
    assert [c["condition_key"] for c in table["conditions"]] == [
        "stop_gradient=false",
        "stop_gradient=true",
    ]
    for row in table["conditions"]:
        run = next(r for r in runs if r["condition_key"] == row["condition_key"])
        ran = service.client.get(f"/runs/{run['id']}").json()["config"]
        assert row["config"] == ran
        assert row["config"]["r"] == 0.1 and row["config"]["steps"] == 60
        summary = summaries[row["condition_key"]]
        assert (row["n"], row["mean"], row["std"]) == (2, summary["mean"], summary["std"])
    one = service.client.get(f"/experiments/{baseline}/params").json()
    assert one["varying"] == [] and len(one["conditions"]) == 1
    assert refused(service, "GET", f"/experiments/{sweep}/params", params={"metric": "min_l3"}) == [
        ["query", "metric"]
    ]
    assert service.client.get("/experiments/999/params").status_code == 404

    # The same through the Python client.
    with Client(service.server.url) as client:
        assert [e.name for e in client.experiments(tags=["sweep"], search="kept")] == [
            "stop-grad sweep"
        ]
        assert [e.name for e in client.experiments(created_after=today, trainer="collapse")] == [
            "baseline",
            "stop-grad sweep",
        ]
        assert client.tag(sweep, add=["cpu", "sweep"], remove=["kept"]).tags == ["sweep", "cpu"]
        assert client.label(sweep, note="second look").note == "second look"
        assert client.experiment(sweep).tags == ["sweep", "cpu"]
        frame = client.params(sweep)
        assert list(frame.columns[:5]) == [
            "condition_key",
            "n",
            "mean",
            "std",
            "config.stop_gradient",
        ]
        assert frame.attrs["varying"] == ["stop_gradient", "lr"]
        assert list(frame["config.stop_gradient"]) == [False, True]
        assert list(frame["mean"]) == [row["mean"] for row in table["conditions"]]
        try:
            client.experiments(tags=["no space"])
        except ApiError as error:
            assert error.status_code == 422 and "tag" in str(error)
        else:
            raise AssertionError("a malformed tag was not refused")


IMPORTED = "lr,seed,loss\n0.1,0,0.5\n0.1,1,0.6\n"


def test_concurrent_tag_edits_all_take_effect(backend_service: Service) -> None:
    """Twelve clients add a tag each at once, through the client's one-request edit: every tag
    stays (on 674b730 each read the tags, added one and wrote them all: 6 concurrent
    `seedgrid tag` left 5), on SQLite and PostgreSQL."""
    from concurrent.futures import ThreadPoolExecutor

    service = backend_service
    created = service.client.post("/experiments/import", json={"name": "tagged", "csv": IMPORTED})
    assert created.status_code == 201, created.text
    experiment_id = created.json()["id"]
    clients = [Client(service.server.url) for _ in range(12)]
    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            list(pool.map(lambda i: clients[i].tag(experiment_id, [f"t{i}"]), range(12)))
        stored = service.client.get(f"/experiments/{experiment_id}").json()["tags"]
        assert sorted(stored) == sorted(f"t{i}" for i in range(12))
        after = clients[0].tag(experiment_id, ["t0", "new"], remove=["t1", "absent"])
        assert after.tags == [*(t for t in stored if t != "t1"), "new"]  # order kept
    finally:
        for client in clients:
            client.close()
    path = f"/experiments/{experiment_id}"
    assert refused(service, "PATCH", path, json={"tags": ["a"], "add_tags": ["b"]}) == [["body"]]
    too_many = {"add_tags": [f"x{i}" for i in range(9)]}  # 12 + 9 > 20
    assert refused(service, "PATCH", path, json=too_many) == [["body", "add_tags"]]
    assert service.client.get(path).json()["tags"] == after.tags  # nothing half-written
