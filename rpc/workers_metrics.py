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
- when a worker exits, its live gauges are dropped (``mark_process_dead``).

The parent runs no thread (a process that forks should not); prometheus-client is imported
only once the multiprocess directory is set.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import socketserver
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from rpc.metrics_dir import ENV


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
    """Drop the live gauges of worker ``pid``; its counters stay in the totals."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, os.environ[ENV])


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


class _Exporter(socketserver.ThreadingMixIn, WSGIServer):
    """A WSGI server on a socket the parent bound and listens on."""

    daemon_threads = True

    def __init__(self, sock: socket.socket, app: Any) -> None:
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
        """The parent listens already."""


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
    server = _Exporter(sock, make_wsgi_app(registry))
    thread = threading.Thread(target=server.serve_forever, name="peerwire-metrics", daemon=True)
    thread.start()
    try:
        _wait_for_eof(lifeline_r)
    finally:
        server.shutdown()
        server.server_close()


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(0)  # SIGTERM from the parent: a clean exit


def _wait_for_eof(fd: int) -> None:
    """Until EOF on ``fd`` (nothing is written to the lifeline: EOF once the parent went).
    The fd may be non-blocking (it shares its flags with the workers' copies)."""
    while True:
        select.select([fd], [], [])
        try:
            if not os.read(fd, 512):
                return
        except BlockingIOError:
            continue
