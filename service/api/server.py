"""Running the API under uvicorn in a background thread (embedded `seedgrid run`, tests)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from service.api.app import create_app
from service.settings import Settings


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class BackgroundServer:
    """uvicorn serving seedgrid on loopback from a thread; `with` starts and stops it."""

    def __init__(self, settings: Settings, *, dispatch: bool = True, port: int | None = None):
        self.app = create_app(settings, dispatch=dispatch)
        self.port = port or free_port(settings.host)
        self.url = f"http://{settings.host}:{self.port}"
        config = uvicorn.Config(
            self.app, host=settings.host, port=self.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="seedgrid-api", daemon=True)

    def start(self, timeout_s: float = 60.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the seedgrid API did not start; see the log above")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)

    @property
    def dispatcher(self):  # noqa: ANN201 - the app's Dispatcher, for tests and the CLI
        return self.app.state.dispatcher

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
