"""What every part of a dispatcher (service.scheduling.dispatcher) shares: its settings, its
lock and the sessions it runs on, and the runs it has in flight. The parts: launching (claim and
submit), harvesting (read from Ray and store), and the dispatcher's life cycle and loop."""

from __future__ import annotations

import threading

from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.scheduling.flights import Harvest, InFlight, RunTemplate
from service.scheduling.lease import DispatchLock
from service.scheduling.metrics import DispatcherMetrics
from service.scheduling.run_records import AttemptKey
from service.settings import Settings


class DispatcherBase:
    """The state the parts share; service.scheduling.dispatcher.Dispatcher sets it up."""

    settings: Settings
    engine: Engine
    metrics: DispatcherMetrics
    identity: str
    lock: DispatchLock
    in_flight: dict[int, InFlight]
    max_in_flight: int
    _stop: threading.Event
    _wake: threading.Event  # set by stop() and by service.scheduling.wakeups
    idle_waits_woken: int
    _last_cancel_check: float
    _nodes: list[tuple[float, float]]
    _nodes_checked_at: float
    _unsaved: Harvest | None
    _unsaved_since: float  # time.monotonic() when the first part of _unsaved was read
    _templates: dict[int, RunTemplate | str]
    _refused: list[tuple[AttemptKey, str]]

    def _session(self) -> Session:
        """A session for the holder's work; on PostgreSQL it runs on the lock's connection."""
        return Session(bind=self.lock.bind(self.engine))
