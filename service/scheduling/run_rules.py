"""The runs store's rules (service.scheduling.run_store), decided without the database: what
a lost attempt becomes (the one retry policy), an experiment's status from its run counts, and
when an experiment whose first runs all failed stops."""

from __future__ import annotations

from collections.abc import Sequence

from api_schemas import ExperimentCounts, ExperimentStatus, RunStatus, first_line
from api_schemas.tracebacks import innermost_frame

ORPHANED = "its dispatcher stopped without finishing it (the process died or lost its lock)"
# A run a dispatcher holds: handed to Ray (pending) or started by a worker (running), in that
# order.
HELD = tuple(s for s in RunStatus if s in RunStatus.active() and s != RunStatus.queued)
# What a worker's result can end a run as: every end but a cancel.
RESULT_STATUSES = RunStatus.ended() - {RunStatus.cancelled}


class IllegalRunMove(RuntimeError):
    """The runs store was about to move a run where RunStatus.moves() does not allow: a bug in
    the store, never the caller's request."""


def check_move(old: RunStatus, new: RunStatus) -> None:
    """Raise IllegalRunMove unless a run in `old` may move to `new` (RunStatus.moves())."""
    if not old.may_move_to(new):
        allowed = ", ".join(sorted(RunStatus.moves()[old])) or "nothing: it has ended"
        raise IllegalRunMove(
            f"internal error: the runs store moved a run from {old.value} to "
            f"{new.value}; a {old.value} run may move to {allowed}"
        )


def cancelled_error(held: RunStatus) -> str:
    """The error of a pending or running run that ends cancelled."""
    return "cancelled before start" if held == RunStatus.pending else "cancelled while running"


# An attempt lost before any worker reported starting it (its task waited in Ray's queue, or
# was one of a sequential task's later seeds) is not charged: whatever killed the worker, it was
# not this run. So that a task Ray can never start cannot come back for ever, a run whose
# attempts were lost unstarted more than max_retries + 1 + this many times fails.
UNSTARTED_LOSSES_ALLOWED = 5


def retry_decision(
    *,
    cancel_requested: bool,
    charged_attempts: int,
    max_retries: int,
    reason: str,
    unstarted_losses: int = 0,
) -> tuple[RunStatus, str | None]:
    """What a run whose attempt was lost (worker or node died, dispatcher gone) becomes: the
    one retry policy. A cancel asked for wins; then the run is re-queued while its charged
    attempts are within max_retries + 1 and its attempts lost before a worker started them
    within max_retries + 1 + UNSTARTED_LOSSES_ALLOWED; then it fails with the last reason."""
    if cancel_requested:
        return RunStatus.cancelled, "cancelled"
    if unstarted_losses > max_retries + 1 + UNSTARTED_LOSSES_ALLOWED:
        return RunStatus.failed, (
            f"lost before any worker started it on each of "
            f"{unstarted_losses} attempts; last: {reason}"
        )
    if charged_attempts <= max_retries:
        return RunStatus.queued, None
    return RunStatus.failed, f"lost on each of {charged_attempts} attempts; last: {reason}"


def experiment_status(
    *, cancel_requested: bool, n_runs: int, counts: ExperimentCounts, deciding: bool = False
) -> ExperimentStatus:
    """An experiment's status from its run counts. Once every run has ended, it is completed
    when each run completed or was stopped by a check its spec asked to stop on (the outcomes
    the spec asked for), failed when none did and some failed or diverged (calling that partial
    would hide that there is nothing to compare), partial otherwise. An adaptive
    experiment whose next look is due (`deciding`, no run queued, pending or running) is still
    running: its next round may follow. One with runs pending (handed to Ray) is running. A
    cancelled one is cancelling while runs of it are still pending or running."""
    if cancel_requested:
        return ExperimentStatus.cancelling if counts.active else ExperimentStatus.cancelled
    if counts.active == 0 and deciding:
        return ExperimentStatus.running
    if counts.active == 0:
        succeeded = counts.succeeded
        if succeeded == n_runs:
            return ExperimentStatus.completed
        if succeeded == 0 and counts.went_wrong > 0:
            return ExperimentStatus.failed
        return ExperimentStatus.partial
    if any(getattr(counts, s.value) for s in RunStatus if s != RunStatus.queued):
        return ExperimentStatus.running
    return ExperimentStatus.queued


# The error of a run the first-failures stop cancelled starts with this; the rest is the
# experiment's message, which the runs store also records as the experiment's stop_message.
STOPPED_RUN_PREFIX = "cancelled: the experiment "


def failure_stop(*, counts: ExperimentCounts, stop_after: int) -> bool:
    """Whether an experiment stops now because its first runs all failed: at least
    `stop_after` (> 0) of its runs have ended and every one of them `failed` (none completed,
    stopped or diverged, and none was cancelled: a cancel, or this stop, came first), while
    some are still queued, pending or running. A lost worker's retry is not an end; a run lost
    on every attempt is a failure."""
    return (
        stop_after > 0
        and counts.failed >= stop_after
        and counts.ended == counts.failed
        and counts.active > 0
    )


def failure_stop_message(
    n_failed: int, errors: Sequence[str | None], tracebacks: Sequence[str | None] = ()
) -> str:
    """The experiment's message when its first runs all failed: the first failure's error
    (its first line) and, when its traceback has one, the innermost frame of the trainer's
    code it came from; and how many other errors there were."""
    lines = [first_line(e) for e in errors] or ["(no error message)"]
    others = len(set(lines)) - 1
    runs = "run" if n_failed == 1 else f"{n_failed} runs"
    frame = innermost_frame(tracebacks[0]) if tracebacks else None
    where = f" (at {frame})" if frame is not None else ""
    return f"stopped after its first {runs} failed: {lines[0][:1000]}{where}" + (
        f" (and {others} other errors: see its failed runs)" if others else ""
    )
