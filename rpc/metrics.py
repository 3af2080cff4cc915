"""Prometheus metrics for peerwire servers and clients (the ``metrics`` extra).

    metrics = Metrics()                                   # on prometheus_client's REGISTRY
    server = await rpc.serve(url, metrics=metrics)        # calls, connections, bytes
    peer = await rpc.connect(url, metrics=metrics)        # our calls (side="client")
    start_http_server("127.0.0.1", 9100)                  # GET /metrics

Per call (labels ``side``, ``protocol``, ``op``; ops no handler is registered for are
counted as ``(unknown)`` (:func:`rpc.middleware.op_name`, as spans are named), so a hostile
peer cannot grow the label set):
``peerwire_requests_total`` (and ``kind``: request, stream, notification),
``peerwire_errors_total`` (and ``error``: rejected, unknown_operation, payload, handler, remote,
timeout, connection, local, cancelled), ``peerwire_retries_total`` (retry results sent by a
server's middleware or handlers, or received by a client), ``peerwire_request_duration_seconds``
(histogram; a streamed result until its last part) and ``peerwire_requests_in_flight``.
Per server (label ``protocol``): ``peerwire_connections_open``,
``peerwire_connections_accepted_total``, ``peerwire_connections_refused_total`` (past
``max_connections``), ``peerwire_received_bytes_total``, ``peerwire_sent_bytes_total`` (RPC
bytes: over TLS the plaintext, over WebSocket the message payloads) and
``peerwire_protocol_violations_total`` (and ``kind``).

Requests refused by ``Options.max_concurrent``, and requests already past their caller's
deadline, are answered before any middleware: the caller's metrics count them. Several
processes: ``serve_workers(..., metrics=(host, port))`` (``peerwire serve --workers N
--metrics``) does it all (:mod:`rpc.workers_metrics`); by hand, set
``PROMETHEUS_MULTIPROC_DIR`` before prometheus_client is first imported
(:func:`rpc.metrics_dir.prepare`); every process then writes its own files and one
:func:`start_http_server` shows them all (gauges summed over live processes; call
:func:`worker_exited` when a process ends).
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from typing import Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    make_wsgi_app,
    multiprocess,
)

from rpc import workers_metrics
from rpc.middleware import UNKNOWN_OP as UNKNOWN_OP  # the op label of unregistered ops
from rpc.middleware import Call, CallNext, on_finish, op_name, outcome
from rpc.peer import Peer

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
"""Seconds; the default buckets of ``peerwire_request_duration_seconds``."""

_CALL = ("side", "protocol", "op")


class Metrics:
    """Every peerwire metric, registered once in ``registry`` (default: the global one;
    a second instance on the same registry raises ValueError: share one)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        buckets: tuple[float, ...] = LATENCY_BUCKETS,
    ) -> None:
        reg = registry if registry is not None else REGISTRY
        self.requests = Counter(
            "peerwire_requests", "Calls started", (*_CALL, "kind"), registry=reg
        )
        self.errors = Counter(
            "peerwire_errors", "Calls ended by an error", (*_CALL, "error"), registry=reg
        )
        self.retries = Counter(
            "peerwire_retries", "Retry results sent (server) or received (client)", _CALL,
            registry=reg,
        )  # fmt: skip
        self.duration = Histogram(
            "peerwire_request_duration_seconds", "Call latency", _CALL, buckets=buckets,
            registry=reg,
        )  # fmt: skip
        self.in_flight = Gauge(
            "peerwire_requests_in_flight", "Calls running", _CALL, registry=reg,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.connections_open = Gauge(
            "peerwire_connections_open", "Open server connections", ("protocol",),
            registry=reg, multiprocess_mode="livesum",
        )  # fmt: skip
        self.connections_accepted = Counter(
            "peerwire_connections_accepted", "Connections admitted", ("protocol",), registry=reg
        )
        self.connections_refused = Counter(
            "peerwire_connections_refused", "Connections closed at once past max_connections",
            ("protocol",), registry=reg,
        )  # fmt: skip
        self.received_bytes = Counter(
            "peerwire_received_bytes", "Bytes received by servers", ("protocol",), registry=reg
        )
        self.sent_bytes = Counter(
            "peerwire_sent_bytes", "Bytes sent by servers", ("protocol",), registry=reg
        )
        self.violations = Counter(
            "peerwire_protocol_violations", "Connections closed for breaking the protocol",
            ("protocol", "kind"), registry=reg,
        )  # fmt: skip

    # --- calls -----------------------------------------------------------------------------

    @property
    def middleware(self) -> Any:
        """The middleware that counts calls (``serve``/``connect(metrics=...)`` add it
        outermost, so it sees what other middleware reject)."""
        return self._observe

    async def _observe(self, call: Call, call_next: CallNext) -> Any:
        labels = (call.side, call.protocol, op_name(call))
        self.requests.labels(*labels, call.kind).inc()
        in_flight = self.in_flight.labels(*labels)
        in_flight.inc()
        start = time.perf_counter()

        def finished(error: BaseException | None) -> None:
            in_flight.dec()
            self.duration.labels(*labels).observe(time.perf_counter() - start)
            kind = outcome(error, call.side)
            if kind == "retry":
                self.retries.labels(*labels).inc()
            elif kind != "ok":
                self.errors.labels(*labels, kind).inc()

        try:
            result = await call_next(call)
        except BaseException as exc:
            finished(exc)
            raise
        return on_finish(result, finished)

    # --- connections (servers) ---------------------------------------------------------------

    def admitted(self, peer: Peer, protocol: str) -> asyncio.BaseProtocol:
        """The protocol a server's transport drives for ``peer``: counts and passes on."""
        return _MeteredProtocol(peer, self, protocol)

    def refused(self, protocol: str) -> None:
        self.connections_refused.labels(protocol).inc()


def _violation_kind(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "handshake_timeout"
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()


class _MeteredTransport(asyncio.Transport):
    """A server connection's transport, counting what the peer writes."""

    def __init__(self, transport: Any, sent: Any) -> None:
        super().__init__()
        self._transport = transport
        self._sent = sent

    def write(self, data: Any) -> None:
        self._sent.inc(len(data))
        self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        pieces = list(list_of_data)
        self._sent.inc(sum(map(len, pieces)))
        self._transport.writelines(pieces)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return bool(self._transport.is_closing())

    def close(self) -> None:
        self._transport.close()

    def abort(self) -> None:
        self._transport.abort()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return bool(self._transport.is_reading())

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high=high, low=low)

    def get_write_buffer_size(self) -> int:
        return int(self._transport.get_write_buffer_size())

    def can_write_eof(self) -> bool:
        return bool(self._transport.can_write_eof())

    def write_eof(self) -> None:
        self._transport.write_eof()  # a graceful close's FIN behind its answers


class _MeteredProtocol(asyncio.BufferedProtocol):
    """Stands between a server's transport and its peer: counts the connection, its bytes
    and why it ended, and passes every event on."""

    def __init__(self, peer: Peer, metrics: Metrics, protocol: str) -> None:
        self._peer = peer
        self._metrics = metrics
        self._protocol = protocol
        self._received = metrics.received_bytes.labels(protocol)
        self._opened = False

    def connection_made(self, transport: Any) -> None:
        self._opened = True
        self._metrics.connections_accepted.labels(self._protocol).inc()
        self._metrics.connections_open.labels(self._protocol).inc()
        sent = self._metrics.sent_bytes.labels(self._protocol)
        self._peer.connection_made(_MeteredTransport(transport, sent))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._peer.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._received.inc(nbytes)
        self._peer.buffer_updated(nbytes)

    def data_received(self, data: bytes) -> None:
        self._received.inc(len(data))
        self._peer.data_received(data)

    def eof_received(self) -> bool | None:
        return self._peer.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._opened:
            self._opened = False
            self._metrics.connections_open.labels(self._protocol).dec()
        self._peer.connection_lost(exc)
        violation = self._peer.violation
        if violation is not None:
            self._metrics.violations.labels(self._protocol, _violation_kind(violation)).inc()

    def pause_writing(self) -> None:
        self._peer.pause_writing()

    def resume_writing(self) -> None:
        self._peer.resume_writing()

    @property
    def holding_input(self) -> bool:
        """The peer's (what a WebSocket keepalive asks the sink that paused its reading)."""
        return self._peer.holding_input


# --- exposition -------------------------------------------------------------------------------


def multiprocess_mode() -> bool:
    """True when prometheus_client writes every process's values to files."""
    return "PROMETHEUS_MULTIPROC_DIR" in os.environ or "prometheus_multiproc_dir" in os.environ


def start_http_server(
    host: str,
    port: int,
    registry: CollectorRegistry | None = None,
    *,
    timeout: float = workers_metrics.TIMEOUT,
    max_connections: int = workers_metrics.MAX_CONNECTIONS,
) -> tuple[Any, threading.Thread]:
    """Serve ``/metrics`` on host:port (0 picks a port: ``server.server_port``) from a
    daemon thread; ``server.shutdown()`` stops it, ``server.server_close()`` frees the
    port. Without ``registry``: the global one, or in multiprocess mode every process's
    values. At most ``max_connections`` (16) at once, each closed ``timeout`` (10 s) after
    its accept, so idle clients cannot use up threads (:mod:`rpc.workers_metrics`)."""
    if registry is None:
        if multiprocess_mode():
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        else:
            registry = REGISTRY
    sock = workers_metrics.bind(host, port)
    try:
        return workers_metrics.serve(sock, make_wsgi_app(registry), timeout, max_connections)
    except BaseException:
        sock.close()
        raise


def worker_exited(pid: int) -> None:
    """Multiprocess mode: drop the live gauges (open connections, calls in flight) of a
    worker process that ended; its counters stay in the totals."""
    multiprocess.mark_process_dead(pid)
