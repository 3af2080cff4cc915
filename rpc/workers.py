"""Serve on N worker processes that share the listening sockets: :func:`serve_workers`.

The parent binds every URL once (port 0 is resolved there, so every worker serves the same
port), forks the workers and supervises them; it serves nothing itself.

- Linux: each worker listens on its own socket bound to that port with ``SO_REUSEPORT``, and
  the kernel spreads new connections over the workers (by a hash of the addresses). The
  parent keeps a bound, not listening, socket per address so the port stays reserved while
  workers restart. Elsewhere (other POSIX systems) the parent listens and the workers
  inherit its socket and accept from it.
- A connection lives in one worker: per-connection state stays in one process; anything
  shared between workers (counters, caches, sessions) needs a store of its own.
- SIGTERM or SIGINT to the parent: every worker gets SIGTERM and closes its servers
  gracefully (stops accepting, lets requests in flight finish within ``drain_timeout``);
  a worker still running ``drain_timeout`` + 5 s later is killed. A worker whose parent died
  stops the same way (it watches a pipe only the parent holds open).
- A worker that exits while the parent is not stopping (a crash, a kill) is started again:
  at once if it had been up for 10 s, else after a back-off that doubles per quick exit
  (0.1 s, 0.2 s, ... up to 30 s), so a worker that fails at start does not spin.

- ``metrics=(host, port)``: one ``/metrics`` there shows every worker (prometheus-client's
  multiprocess mode, in a temporary directory the parent owns and removes at exit; an
  exporter process serves it; see :mod:`rpc.workers_metrics`).

Workers are forked (POSIX only), so the registry, handlers and TLS context need not be
picklable; call :func:`serve_workers` from the main thread of a process that runs no event
loop (and, ideally, no other threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import ssl as ssl_module
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from rpc import loops, metrics_dir, workers_metrics
from rpc.api import Server, serve
from rpc.registry import Registry
from rpc.url import parse_url
from rpc.workers_sockets import (
    REUSE_PORT,
    Listener,
    bind_listeners,
    close_listeners,
    worker_sockets,
)

log = logging.getLogger("peerwire.workers")

STABLE_AFTER = 10.0
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 30.0
KILL_GRACE = 5.0


def freeze_startup_objects() -> None:
    """Move every object made so far (modules, schemas, the registry, the listeners) out of
    the collector's reach: they live as long as the process, and each full collection would
    walk them again (about 41,000 objects and 7 ms per full collection for a server with
    three listeners here). Called once the servers of a serving process are started."""
    gc.collect()
    gc.freeze()


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker serves, and how."""

    registry: Registry | None = None
    ssl: ssl_module.SSLContext | None = None  # given to the TLS URLs only
    loop: str | None = None  # rpc.loops choice; None: $PEERWIRE_LOOP or auto
    drain_timeout: float = 5.0
    reuse_port: bool = REUSE_PORT
    serve_options: dict[str, Any] = field(default_factory=dict)  # more rpc.serve keywords
    metrics: bool = False  # each worker counts into the multiprocess directory


# --- in a worker ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pipes:
    """Fds a worker is born with: ``ready_w`` to report, ``lifeline_r`` to watch the parent;
    the others are the parent's and are closed in the worker at once."""

    ready_w: int
    lifeline_r: int
    parent_only: tuple[int, ...]


def _worker_main(
    listeners: list[Listener],
    config: WorkerConfig,
    pipes: _Pipes,
    metrics_socket: socket.socket | None = None,
) -> None:
    """A worker's process. The parent's pipes and the metrics listening socket (the
    exporter's) are closed first: held here, the metrics port stayed bound as long as any
    worker lived, a worker whose parent died included, until its drain ended."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # dies at once until it serves
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C reaches the parent too
    for fd in pipes.parent_only:
        os.close(fd)
    if metrics_socket is not None:
        metrics_socket.close()
    loops.run(_serve_worker(listeners, config, pipes), config.loop)


async def _serve_worker(listeners: list[Listener], config: WorkerConfig, pipes: _Pipes) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def parent_gone() -> None:  # EOF on the lifeline: nobody holds its write end any more
        loop.remove_reader(pipes.lifeline_r)
        stop.set()

    loop.add_reader(pipes.lifeline_r, parent_gone)
    servers: list[Server] = []
    options = dict(config.serve_options)
    if config.metrics:
        options["metrics"] = workers_metrics.worker_metrics()
    try:
        for listener in listeners:
            for sock in worker_sockets(listener, config.reuse_port):
                server = serve(
                    str(listener.url),
                    registry=config.registry,
                    ssl=config.ssl if listener.url.tls else None,
                    sock=sock,
                    **options,
                )
                await server.start()
                servers.append(server)
        freeze_startup_objects()
        os.write(pipes.ready_w, b"%d\n" % os.getpid())
        await stop.wait()
        log.debug("worker %d stopping", os.getpid())
    finally:
        await asyncio.gather(
            *(s.close(drain_timeout=config.drain_timeout) for s in servers),
            return_exceptions=True,
        )


# --- in the parent --------------------------------------------------------------------------


@dataclass
class _Slot:
    """One worker position: its current process and its restart state."""

    index: int
    exporter: bool = False
    """The metrics exporter's slot (not a worker)."""
    process: BaseProcess | None = None
    started: float = 0.0
    quick_exits: int = 0
    restart_at: float | None = None
    ready: bool = False

    @property
    def name(self) -> str:
        return "metrics exporter" if self.exporter else f"worker {self.index}"


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


def _backoff(quick_exits: int) -> float:
    """Seconds before a process that failed ``quick_exits`` times in a row (each within
    :data:`STABLE_AFTER` of its start) is started again: none after a stable run, then
    :data:`BACKOFF_FIRST` doubling to :data:`BACKOFF_MAX` (the doubling stops there: a
    float's ``2 ** 1024`` overflows, after about 8.5 hours of a worker failing at start)."""
    if not quick_exits:
        return 0.0
    return min(BACKOFF_FIRST * 2.0 ** min(quick_exits - 1, 64), BACKOFF_MAX)


class _Supervisor:
    def __init__(
        self,
        listeners: list[Listener],
        workers: int,
        config: WorkerConfig,
        on_ready: Callable[[list[str]], object] | None,
        metrics_socket: socket.socket | None = None,
    ) -> None:
        try:
            self._mp = multiprocessing.get_context("fork")
        except ValueError:
            raise RuntimeError("worker processes need fork(): POSIX systems only") from None
        self.listeners = listeners
        self.config = config
        self.on_ready = on_ready
        self.slots = [_Slot(i) for i in range(workers)]
        self.metrics_socket = metrics_socket
        if metrics_socket is not None:
            self.slots.append(_Slot(workers, exporter=True))
        self.stopping = False
        self.announced = False

    def _start(self, slot: _Slot, pipes: _Pipes) -> None:
        if slot.exporter:
            others = [sock for listener in self.listeners for sock in listener.sockets]
            slot.process = self._mp.Process(
                target=workers_metrics.exporter_main,
                args=(self.metrics_socket, pipes.lifeline_r, pipes.parent_only, others),
                name="peerwire-metrics",
            )
        else:
            slot.process = self._mp.Process(
                target=_worker_main,
                args=(self.listeners, self.config, pipes, self.metrics_socket),
                name=f"peerwire-worker-{slot.index}",
            )
        slot.process.start()
        slot.started = time.monotonic()
        slot.restart_at = None
        slot.ready = slot.exporter  # it serves at once: the parent listens for it
        log.info("%s started: pid %d", slot.name, slot.process.pid)

    def _exited(self, slot: _Slot, process: BaseProcess) -> None:
        process.join()
        slot.process = None
        if self.config.metrics and not slot.exporter and process.pid is not None:
            workers_metrics.worker_exited(process.pid)
        uptime = time.monotonic() - slot.started
        slot.quick_exits = 0 if uptime >= STABLE_AFTER else slot.quick_exits + 1
        delay = _backoff(slot.quick_exits)
        slot.restart_at = time.monotonic() + delay
        log.warning(
            "%s (pid %d) exited with %s after %.1f s; restarting in %.1f s",
            slot.name,
            process.pid,
            _describe_exit(process.exitcode),
            uptime,
            delay,
        )
        process.close()

    def _on_ready_line(self, pid: int) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.pid == pid:
                slot.ready = True
        if not self.announced and all(slot.ready for slot in self.slots):
            self.announced = True
            if self.on_ready is not None:
                self.on_ready([str(listener.url) for listener in self.listeners])

    def run(self) -> None:
        ready_r, ready_w = os.pipe()
        lifeline_r, lifeline_w = os.pipe()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        pipes = _Pipes(ready_w, lifeline_r, (ready_r, lifeline_w, wake_r, wake_w))

        def on_signal(signum: int, frame: object) -> None:
            self.stopping = True

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        previous_wakeup = signal.set_wakeup_fd(wake_w)
        try:
            for slot in self.slots:
                self._start(slot, pipes)
            self._supervise(ready_r, wake_r, pipes)
        finally:
            self._stop_all()
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for fd in (ready_r, ready_w, lifeline_r, lifeline_w, wake_r, wake_w):
                os.close(fd)

    def _supervise(self, ready_r: int, wake_r: int, pipes: _Pipes) -> None:
        pending = b""
        while not self.stopping:
            now = time.monotonic()
            restarts = [s.restart_at for s in self.slots if s.restart_at is not None]
            timeout = max(0.0, min(restarts) - now) if restarts else None
            live = {s.process.sentinel: (s, s.process) for s in self.slots if s.process is not None}
            readable = multiprocessing.connection.wait([*live, ready_r, wake_r], timeout)
            if wake_r in readable:
                os.read(wake_r, 512)
            if ready_r in readable:
                pending += os.read(ready_r, 4096)
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._on_ready_line(int(line))
            for sentinel in readable:
                if sentinel in live:
                    self._exited(*live[sentinel])
            if self.stopping:
                break
            now = time.monotonic()
            for slot in self.slots:
                if slot.restart_at is not None and slot.restart_at <= now:
                    self._restart(slot, pipes)

    def _restart(self, slot: _Slot, pipes: _Pipes) -> None:
        """Start ``slot``'s process again; a fork that fails (EAGAIN, ENOMEM: the machine
        is short of processes or memory) is tried again after the back-off of a quick
        exit, instead of ending the supervisor and every worker with it."""
        try:
            self._start(slot, pipes)
        except OSError as exc:
            slot.process = None
            slot.quick_exits += 1
            delay = _backoff(slot.quick_exits)
            slot.restart_at = time.monotonic() + delay
            log.warning(
                "%s could not be started (%s); trying again in %.1f s", slot.name, exc, delay
            )

    def _stop_all(self) -> None:
        live = [s.process for s in self.slots if s.process is not None]
        log.info("stopping %d worker(s)", len(live))
        for process in live:
            process.terminate()  # SIGTERM: the worker closes its servers gracefully
        deadline = time.monotonic() + self.config.drain_timeout + KILL_GRACE
        for process in live:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                log.warning("worker pid %d did not stop in time: killed", process.pid)
                process.kill()
                process.join()
            elif process.exitcode != 0:
                log.warning("worker pid %d exited with %s", process.pid, process.exitcode)
            process.close()
        for slot in self.slots:
            slot.process = None


def serve_workers(
    urls: str | Sequence[str],
    *,
    workers: int,
    registry: Registry | None = None,
    ssl: ssl_module.SSLContext | None = None,
    loop: str | None = None,
    drain_timeout: float = 5.0,
    reuse_port: bool = REUSE_PORT,
    on_ready: Callable[[list[str]], object] | None = None,
    metrics: tuple[str, int] | None = None,
    on_metrics: Callable[[str], object] | None = None,
    **serve_options: Any,
) -> None:
    """Serve ``registry`` on ``urls`` in ``workers`` processes until SIGTERM or SIGINT.

    Blocks; returns once every worker has stopped. ``ssl`` is given to the TLS URLs;
    ``loop`` picks each worker's event loop (:mod:`rpc.loops`); ``serve_options`` go to
    :func:`rpc.serve` in each worker (``options``, ``max_connections``, ``web``, ...).
    ``on_ready(bound_urls)`` runs once in the parent when every worker serves (port 0
    replaced by the bound port). ``reuse_port=False`` shares the parent's listening socket
    even where ``SO_REUSEPORT`` would be used. ``metrics=(host, port)`` (the ``metrics``
    extra) serves every worker's metrics at ``http://host:port/metrics``;
    ``on_metrics(url)`` learns that URL (port 0 resolved) before the workers start.
    Raises ``OSError`` if a URL or the metrics address cannot be bound, ``ValueError``
    for bad arguments, ``RuntimeError`` if prometheus-client was imported before without
    ``PROMETHEUS_MULTIPROC_DIR`` set (import it after, or set it).
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    loops.resolve(loop)  # an unknown or missing loop fails here, not in every worker
    urls = [urls] if isinstance(urls, str) else list(urls)
    for url in map(parse_url, urls):
        if url.tls and ssl is None:
            raise ValueError(f"{url} needs an ssl= server context (certificate and key)")
    if metrics is not None and "metrics" in serve_options:
        raise ValueError("metrics=(host, port) counts every worker: give no rpc.serve metrics")
    with contextlib.ExitStack() as stack:
        metrics_socket = None
        if metrics is not None:
            stack.enter_context(metrics_dir.owned())  # before prometheus_client is imported
            metrics_socket = stack.enter_context(workers_metrics.bind(*metrics))
            if on_metrics is not None:
                on_metrics(workers_metrics.url_of(metrics_socket))
        listeners = bind_listeners(urls, reuse_port=reuse_port)
        stack.callback(close_listeners, listeners)
        config = WorkerConfig(
            registry, ssl, loop, drain_timeout, reuse_port, serve_options, metrics is not None
        )
        _Supervisor(listeners, workers, config, on_ready, metrics_socket).run()


__all__ = [
    "REUSE_PORT",
    "Listener",
    "WorkerConfig",
    "bind_listeners",
    "close_listeners",
    "serve_workers",
]
