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
    passes, started = dispatcher.passes, time.monotonic()
    time.sleep(3.0)
    idle = dispatcher.passes - passes
    elapsed = time.monotonic() - started
    # at most one pass per IDLE_POLL_MAX_S once ramped (a busy machine makes fewer, not more);
    # at the poll interval it would have made elapsed / poll (60 in 3 s)
    assert idle <= elapsed / IDLE_POLL_MAX_S + 2, (idle, elapsed)
    assert elapsed / poll > 4 * (elapsed / IDLE_POLL_MAX_S + 2)  # the bound is a real cut
    woken = dispatcher.idle_waits_woken
    experiment = service.submit(SPEC)
    detail = service.wait(experiment["id"])
    assert detail["counts"]["completed"] == 1, detail
    assert dispatcher.idle_waits_woken > woken  # the submit ended the idle wait
