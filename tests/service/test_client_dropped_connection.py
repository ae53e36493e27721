"""A kept-alive connection the server closes while a request is on its way (uvicorn closes one
idle for 5 s; a watch polling every few seconds on a busy machine sent its next GET just then:
`seedgrid add-seeds --wait` stopped with "cannot reach the seedgrid API ... Connection reset by
peer" while the API ran on). The client sends a read-only request once more, on a new
connection, and never sends a writing one twice.

The server here is a real HTTP/1.1 server on a socket: it answers the first request of each
connection with keep-alive, and resets the connection (RST, no answer) when a second request
comes on it, which is what a request racing an idle close meets."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from service.client import Client
from service.client.http import Unreachable

BODY = b'{"status": "ok"}'
ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: keep-alive\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY)
)


class DroppingServer:
    """Answers each connection's first request; resets the connection on its second."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests: list[bytes] = []  # the request lines, in order
        self.resets = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _read_request(self, connection: socket.socket) -> bytes | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = connection.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            rest += connection.recv(65536)
        return head.split(b"\r\n", 1)[0]

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            first = self._read_request(connection)
            if first is None:
                return
            with self._lock:
                self.requests.append(first)
            connection.sendall(ANSWER)
            second = self._read_request(connection)
            if second is None:
                return
            with self._lock:
                self.requests.append(second)
                self.resets += 1
            # close with an RST, as a socket closed with unread data or a dropped peer does
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def server() -> Iterator[DroppingServer]:
    running = DroppingServer()
    yield running
    running.close()


def test_a_get_on_a_dropped_connection_is_sent_again_on_a_new_one(server: DroppingServer) -> None:
    client = Client(url=server.url)
    assert client.request("GET", "/healthz") == {"status": "ok"}
    # the second GET goes out on the kept-alive connection, which the server resets
    assert client.request("GET", "/healthz") == {"status": "ok"}
    assert server.resets == 1
    assert server.requests == [b"GET /healthz HTTP/1.1"] * 3
    with client.stream("GET", "/healthz") as response:  # a stream's too, before its answer
        assert response.read() == BODY
    assert server.resets == 2


def test_a_post_on_a_dropped_connection_is_not_sent_twice(server: DroppingServer) -> None:
    client = Client(url=server.url)
    client.request("GET", "/healthz")
    with pytest.raises(Unreachable, match="cannot reach the seedgrid API"):
        client.request("POST", "/experiments/1/seeds", json={"seeds": [5]})
    assert server.requests == [b"GET /healthz HTTP/1.1", b"POST /experiments/1/seeds HTTP/1.1"]
