"""Experiments as the API handles them, in three parts: `validation` (a spec checked before
anything is stored), `commands` (submit, add seeds, cancel, delete) and `views` (rows mapped to
the response models). The errors they raise are service.errors'; what a spec means is
service.specs'. The names below are the ones the routes call."""

from service.errors import Conflict, NotFound, QueueFull, SpecError
from service.experiments.commands import (
    add_seeds,
    cancel_experiment,
    create_experiment,
    delete_experiment,
    label_experiment,
)
from service.experiments.importing import import_results
from service.experiments.params import params_table
from service.experiments.validation import validate_spec
from service.experiments.views import (
    ExperimentFilter,
    experiment_detail,
    experiment_summary,
    list_experiments,
    list_runs,
    logged_curves,
    run_curves,
    run_detail,
    run_out,
    stop_message,
)
from service.specs import condition_key, run_config
from service.storage.lookup import get_experiment, get_run

__all__ = [
    "Conflict",
    "ExperimentFilter",
    "NotFound",
    "QueueFull",
    "SpecError",
    "add_seeds",
    "cancel_experiment",
    "condition_key",
    "create_experiment",
    "delete_experiment",
    "experiment_detail",
    "experiment_summary",
    "get_experiment",
    "get_run",
    "import_results",
    "label_experiment",
    "list_experiments",
    "list_runs",
    "logged_curves",
    "params_table",
    "run_config",
    "run_curves",
    "run_detail",
    "run_out",
    "stop_message",
    "validate_spec",
]
