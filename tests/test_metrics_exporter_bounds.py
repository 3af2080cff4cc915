"""The metrics HTTP server (the workers' exporter, and ``rpc.metrics.start_http_server``)
runs a thread per connection, so it bounds them: connections past ``max_connections`` are
closed at once, and each one is closed ``timeout`` seconds after its accept, however it
trickles; threads stay within the bound and scrapes work again while the idle clients
still hold their sockets. (Idle connections used to keep a thread each, forever.)"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, Counter, make_wsgi_app

from rpc import metrics, workers_metrics
from tests.test_metrics import scrape

pytestmark = pytest.mark.timeout(60)

CAP = 4
TIMEOUT = 1.5
EXTRA = 6


@dataclass
class Running:
    port: int
    threads_before: int


@pytest.fixture(params=["exporter", "start_http_server"])
def served(request: pytest.FixtureRequest) -> Iterator[Running]:
    registry = CollectorRegistry()
    Counter("exporter_hits", "a sample to scrape", registry=registry).inc()
    before = threading.active_count()
    if request.param == "exporter":
        sock = workers_metrics.bind("127.0.0.1", 0)
        app = make_wsgi_app(registry)
        server, thread = workers_metrics.serve(sock, app, timeout=TIMEOUT, max_connections=CAP)
    else:
        server, thread = metrics.start_http_server(
            "127.0.0.1", 0, registry=registry, timeout=TIMEOUT, max_connections=CAP
        )
    try:
        yield Running(server.server_port, before)
    finally:
        server.shutdown()
        thread.join(timeout=5)
        server.server_close()


def is_closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (called once select says it is readable)."""
    try:
        return sock.recv(1) == b""
    except OSError:  # reset
        return True


def closed_by(socks: list[socket.socket], deadline: float, count: int) -> list[socket.socket]:
    """Wait until ``count`` of ``socks`` were closed by the server, or ``deadline``."""
    closed: list[socket.socket] = []
    while len(closed) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        readable, _, _ = select.select([s for s in socks if s not in closed], [], [], left)
        closed += [s for s in readable if is_closed(s)]
    return closed


def test_connections_past_the_cap_close_at_once_idle_ones_at_the_timeout(
    served: Running,
) -> None:
    started = time.monotonic()
    address = ("127.0.0.1", served.port)
    held = [socket.create_connection(address, timeout=5) for _ in range(CAP + EXTRA)]
    try:
        # those past the cap are closed well before the others time out
        extra = closed_by(held, started + TIMEOUT, EXTRA)
        assert len(extra) == EXTRA
        idle = [s for s in held if s not in extra]
        assert not select.select(idle, [], [], 0)[0]  # the served ones are still open
        assert threading.active_count() <= served.threads_before + 1 + CAP  # + accept loop

        # the idle ones: closed at their timeout (counted from their accept)
        assert len(closed_by(idle, started + TIMEOUT + 5, CAP)) == CAP
        assert time.monotonic() - started >= TIMEOUT
        # the clients still hold every socket: a scrape gets through
        assert scrape(served.port).value("exporter_hits_total") == 1
    finally:
        for sock in held:
            sock.close()


def test_a_trickling_request_is_closed_at_its_deadline(served: Running) -> None:
    """A byte every 0.1 s would keep a per-read timeout from ever firing."""
    started = time.monotonic()
    request = b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"a" * 2000
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
        closed = False
        for byte in request:
            if time.monotonic() > started + TIMEOUT + 5:
                break
            if select.select([sock], [], [], 0.1)[0] and is_closed(sock):  # the pace
                closed = True
                break
            try:
                sock.send(bytes([byte]))
            except OSError:
                closed = True
                break
        assert closed
        assert TIMEOUT <= time.monotonic() - started < TIMEOUT + 5
    assert scrape(served.port).value("exporter_hits_total") == 1


def test_bounds_must_allow_a_scrape() -> None:
    with workers_metrics.bind("127.0.0.1", 0) as sock:
        with pytest.raises(ValueError):
            workers_metrics.Exporter(sock, None, max_connections=0)
        with pytest.raises(ValueError):
            workers_metrics.Exporter(sock, None, timeout=0.0)
