"""Metrics of every worker process in one scrape: ``serve_workers(..., metrics=(host, port))``.

The parent of :func:`rpc.workers.serve_workers` owns all of it:

- a directory for prometheus-client's multiprocess mode (:func:`rpc.metrics_dir.owned`: a
  temporary one, removed when serving ends), set before any worker is forked, so each
  worker's :class:`~rpc.metrics.Metrics` writes its values to files of its own there;
- the metrics socket, bound (port 0 resolved) and listening in the parent, so a bad
  address fails at once and the port stays held while the exporter restarts;
- an exporter process, forked like a worker and restarted like one, which serves
  ``GET /metrics`` on that socket: every process's values, counters summed over every
  worker that ever ran, gauges (open connections, calls in flight) over live ones;
- when a worker exits, its live gauges are dropped (``mark_process_dead``), in a
  ``PROMETHEUS_MULTIPROC_DIR`` of the user's too.

The parent runs no thread (a process that forks should not); prometheus-client is imported
only once the multiprocess directory is set.

The HTTP server (:func:`serve`, also behind :func:`rpc.metrics.start_http_server`) runs one
thread per connection, so both are bounded: at most :data:`MAX_CONNECTIONS` (16) at once,
further ones are closed at once; each has :data:`TIMEOUT` (10 s) from its accept to send
its request and take the reply, then it is closed (a client that sends nothing, or a byte
now and then, holds its thread no longer).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import select
import signal
import socket
import socketserver
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from rpc.metrics_dir import ENV

log = logging.getLogger("peerwire.workers")


def bind(host: str, port: int) -> socket.socket:
    """The metrics socket, listening (port 0 picks one). Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=64)


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/metrics"


def worker_metrics() -> Any:
    """A worker's :class:`~rpc.metrics.Metrics` (in the worker, after the fork)."""
    from rpc.metrics import Metrics

    return Metrics()


def worker_exited(pid: int) -> None:
    """Drop the live gauges of worker ``pid`` (its counters stay in the totals), as
    prometheus-client's multiprocess mode asks of whoever runs the processes
    (``mark_process_dead``), in the ``PROMETHEUS_MULTIPROC_DIR`` set: the parent's own or
    the user's, whose exporter would show a dead worker's gauges (peerwire's, and those
    of the served module) for good. Nothing when it is not set, or prometheus-client is
    not installed (nothing was written there through it); a file that cannot be removed
    is logged, not raised (the supervisor goes on)."""
    directory = os.environ.get(ENV) or os.environ.get(ENV.lower())
    if not directory:
        return
    try:
        from prometheus_client import multiprocess
    except ImportError:
        return
    try:
        multiprocess.mark_process_dead(pid, directory)
    except OSError as exc:
        log.warning("cannot drop the gauges of pid %d in %s: %s", pid, directory, exc)


TIMEOUT = 10.0
"""Seconds a metrics connection has, from its accept, to send its request and take the
reply (a scrape's usual timeout is 10 s too)."""
MAX_CONNECTIONS = 16
"""Metrics connections served at once (a thread each); more are closed at once."""


class _Deadline(io.RawIOBase):
    """A connection's reads, each waiting only for what is left of its deadline: a client
    that trickles bytes is closed on time, not a timeout after its latest byte."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("metrics request not received in time")
        self._sock.settimeout(left)  # also bounds the reply's sendall that follows
        return self._sock.recv_into(buffer)


class _QuietHandler(WSGIRequestHandler):
    server: Exporter

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # nothing read yet: replaced by one that keeps the deadline
        deadline = time.monotonic() + self.server.connection_timeout
        self.rfile = io.BufferedReader(_Deadline(self.connection, deadline))

    def handle(self) -> None:
        with contextlib.suppress(OSError):  # timed out or gone: the server closes it
            super().handle()

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


class Exporter(socketserver.ThreadingMixIn, WSGIServer):
    """A WSGI server on a socket bound and listening already: a thread per connection, at
    most ``max_connections`` of them (more are closed at once), each connection closed
    ``timeout`` seconds after its accept."""

    daemon_threads = True

    def __init__(
        self,
        sock: socket.socket,
        app: Any,
        timeout: float = TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if timeout <= 0 or max_connections < 1:
            raise ValueError("timeout must be positive and max_connections at least 1")
        self.connection_timeout = timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        self._adopted = sock
        super().__init__(sock.getsockname()[:2], _QuietHandler)
        self.set_app(app)

    def server_bind(self) -> None:
        self.socket.close()
        self.socket = self._adopted
        host, port = self.socket.getsockname()[:2]
        self.server_address = (host, port)
        self.server_name, self.server_port = host, port
        self.setup_environ()

    def server_activate(self) -> None:
        """The socket listens already."""

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # every thread taken: closed at once
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()  # no thread was started for it
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def serve(
    sock: socket.socket, app: Any, timeout: float = TIMEOUT, max_connections: int = MAX_CONNECTIONS
) -> tuple[Exporter, threading.Thread]:
    """Serve the WSGI ``app`` on the listening ``sock`` from a daemon thread (an
    :class:`Exporter`: limits above); ``server.shutdown()`` stops it, ``server_close()``
    closes ``sock``."""
    server = Exporter(sock, app, timeout, max_connections)
    thread = threading.Thread(target=server.serve_forever, name="peerwire-metrics", daemon=True)
    thread.start()
    return server, thread


def exporter_main(
    sock: socket.socket, lifeline_r: int, close_fds: tuple[int, ...], others: list[socket.socket]
) -> None:
    """The exporter process: serve every process's metrics on ``sock`` until SIGTERM or
    the parent's death (EOF on ``lifeline_r``). ``close_fds`` and ``others`` (the
    parent's pipes and listening sockets) are closed first: they are not the exporter's."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for fd in close_fds:
        os.close(fd)
    for other in others:
        other.close()
    from prometheus_client import CollectorRegistry, make_wsgi_app, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    server, _ = serve(sock, make_wsgi_app(registry))
    try:
        wait_for_eof(lifeline_r)
    finally:
        server.shutdown()
        server.server_close()


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(0)  # SIGTERM from the parent: a clean exit


def wait_for_eof(fd: int) -> None:
    """Until EOF on ``fd`` (nothing is written to the lifeline: EOF once the parent went).
    The fd may be non-blocking (it shares its flags with the workers' copies)."""
    while True:
        select.select([fd], [], [])
        try:
            if not os.read(fd, 512):
                return
        except BlockingIOError:
            continue
