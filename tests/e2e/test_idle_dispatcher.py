"""An idle dispatcher does not keep passing over its database (an idle `seedgrid serve` took
7.7% of a core at 20 passes a second), and new work submitted to the API of its process ends
its wait at once (service.scheduling.wakeups). Counted in passes and wake-ups, not timed."""

from __future__ import annotations

import time

from service.scheduling.dispatcher import IDLE_POLL_MAX_S
from tests.conftest import Service

SPEC = {
    "name": "idle-then-work",
    "trainer": "collapse",
    "config": {"n_samples": 200, "steps": 200},
    "grid": {},
    "seeds": 1,
}


def test_an_idle_dispatcher_backs_off_and_new_work_wakes_it(service: Service) -> None:
    dispatcher = service.server.dispatcher
    poll = service.server.app.state.settings.dispatch_poll_interval_s
    while dispatcher.in_flight or dispatcher.passes < 8:  # past the back-off's ramp
        time.sleep(0.2)
    # six more passes, waited for (not slept through): once ramped, each idle wait is the whole
    # IDLE_POLL_MAX_S (a busy machine only makes them longer); at the poll interval the six
    # would take about 6 * poll (0.3 s)
    passes, started = dispatcher.passes, time.monotonic()
    deadline = started + 120
    while dispatcher.passes < passes + 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    assert dispatcher.passes >= passes + 6, "the idle dispatcher stopped passing"
    assert elapsed >= 0.9 * 5 * IDLE_POLL_MAX_S, (elapsed, poll)
    woken = dispatcher.idle_waits_woken
    experiment = service.submit(SPEC)
    detail = service.wait(experiment["id"])
    assert detail["counts"]["completed"] == 1, detail
    assert dispatcher.idle_waits_woken > woken  # the submit ended the idle wait
