"""How an imported table is read (service.experiments.import_tables), without a service: which
columns are factors, metrics and ignored, how a cell becomes a level, and the refusals that
name a column of the header."""

from __future__ import annotations

from typing import Any

import pytest

from api_schemas import ExperimentImport
from service.errors import SpecError
from service.experiments.import_tables import ImportTable, parse_level, read_import


def table(text: str, **options: Any) -> ImportTable:
    return read_import(ExperimentImport(name="t", csv=text, **options))


def refusal(text: str, **options: Any) -> dict[str, Any]:
    with pytest.raises(SpecError) as raised:
        table(text, **options)
    return raised.value.errors[0]


@pytest.mark.parametrize(
    ("cell", "level"),
    [
        ("", None),
        ("  ", None),
        ("true", True),
        ("False", False),
        ("3", 3),
        ("-2", -2),
        ("0.1", 0.1),
        ("1e-3", 0.001),
        ("inf", "inf"),
        ("1_000", "1_000"),
        ("adam", "adam"),
        # full-width and other scripts' digits are text (on 674b730 "１２" read as 12)
        ("１２", "１２"),
        ("٣", "٣"),
        ("1.５", "1.５"),
    ],
)
def test_a_cell_becomes_a_number_a_boolean_null_or_text(cell: str, level: Any) -> None:
    got = parse_level(cell)
    assert got == level and type(got) is type(level)


def test_a_plain_csv_has_factors_before_the_seed_and_metrics_after_it() -> None:
    read = table("\ufeffoptimizer,lr,seed,acc,loss\n\nsgd,0.1,0,0.9,\nsgd,0.1,1,0.8,0.3\n")
    assert (read.source, read.factors, read.metrics, read.metric) == (
        "csv",
        ["optimizer", "lr"],
        ["acc", "loss"],
        "acc",
    )
    assert [(r.seed, r.factors, r.metrics) for r in read.rows] == [
        (0, {"optimizer": "sgd", "lr": 0.1}, {"acc": 0.9}),  # an empty metric is not recorded
        (1, {"optimizer": "sgd", "lr": 0.1}, {"acc": 0.8, "loss": 0.3}),
    ]
    named = table("seed,acc,optimizer,loss\n0,0.9,sgd,0.3\n", metrics=["loss", "acc"])
    assert (named.factors, named.metrics, named.metric) == (["optimizer"], ["acc", "loss"], "acc")
    primary = table("optimizer,seed,acc,loss\nsgd,0,0.9,0.3\n", metric="loss")
    assert primary.metric == "loss"


def test_a_run_table_export_keeps_its_prefixed_columns_and_ignores_the_rest() -> None:
    read = table(
        "ID,config.seed,config.opt,summary.acc,summary._step,summary.loss,tags.x\n"
        "a,0,sgd,0.9,100,0.3,y\n",
        metrics=["acc"],
    )
    assert (read.source, read.factors, read.metrics) == ("wandb", ["opt"], ["acc"])
    assert read.ignored == ["ID", "summary._step", "summary.loss", "tags.x"]
    assert read.seed_column == "config.seed" and read.column("opt") == "config.opt"
    mlflow = table("run_id,params.seed,params.opt,metrics.acc\nr,3,sgd,0.5\n")
    assert (mlflow.source, mlflow.rows[0].seed) == ("mlflow", 3)


def test_header_refusals_name_the_column() -> None:
    clash = refusal("seed,config.lr,params.lr,metrics.acc\n0,1,1,0.5\n")
    assert clash["loc"] == ["body", "csv", "header", "params.lr"]
    assert "'config.lr' and 'params.lr' both name 'lr'" in clash["msg"]
    twice = refusal("seed,acc,acc\n0,1,2\n")
    assert twice["loc"] == ["body", "csv", "header", "acc"] and "twice" in twice["msg"]
    missing = refusal("seed,opt,acc\n0,sgd,1\n", metrics=["loss"])
    assert missing["loc"] == ["body", "metrics", "loss"]
    reserved = refusal("varying_source,seed,acc\ninit,0,1\n")
    assert reserved["loc"] == ["body", "csv", "header", "varying_source"]
    unnamed = refusal("seed,,acc\n0,x,1\n")
    assert unnamed["loc"] == ["body", "csv", "header", 1]


def test_seeds_must_be_whole_numbers_in_range() -> None:
    assert table("seed,acc\n4.0,1\n").rows[0].seed == 4
    for cell in ("-1", "x", "2147483648", "1" * 30, ""):
        problem = refusal(f"seed,acc\n{cell},1\n")
        assert problem["loc"] == ["body", "csv", "row 1", "seed"], cell


def test_a_factors_integer_and_decimal_levels_are_one_type() -> None:
    # on 674b730 `1` and `1.0` were two conditions
    read = table("lr,seed,acc\n1,0,0.5\n1.0,1,0.6\n0.5,0,0.7\n2,0,0.4\n")
    assert [r.factors["lr"] for r in read.rows] == [1.0, 1.0, 0.5, 2.0]
    assert all(type(r.factors["lr"]) is float for r in read.rows)
    integers = table("width,seed,acc\n1,0,0.5\n2,0,0.6\n")  # all integers stay integers
    assert [type(r.factors["width"]) for r in integers.rows] == [int, int]
    runs = read_import(
        ExperimentImport(
            name="t",
            runs=[
                {"condition": {"lr": 1}, "seed": 0, "metrics": {"acc": 0.5}},
                {"condition": {"lr": 1.0}, "seed": 1, "metrics": {"acc": 0.6}},
                {"condition": {"lr": 0.5}, "seed": 0, "metrics": {"acc": 0.7}},
            ],
        )
    )
    assert [r.factors["lr"] for r in runs.rows] == [1.0, 1.0, 0.5]


@pytest.mark.parametrize("column", ["lr", "acc"])
def test_a_number_that_underflows_to_zero_is_refused_naming_its_cell(column: str) -> None:
    # on 674b730 1e-400 was stored as 0
    cells = {"lr": "0.1", "acc": "0.5", column: "1e-400"}
    error = refusal(f"lr,seed,acc\n{cells['lr']},0,{cells['acc']}\n")
    assert error["loc"] == ["body", "csv", "row 1", column], error
    assert "'1e-400' is too small for a double" in error["msg"]
    assert table("lr,seed,acc\n0e-400,0,0.0e5\n").rows[0].metrics == {"acc": 0.0}  # zeros stay
