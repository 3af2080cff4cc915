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
  a worker still running ``drain_timeout`` + 5 s later is killed, and a second signal kills
  every worker left at once. The parent's handlers stay until :func:`serve_workers`
  returns, so no signal cuts its clean-up short (the metrics directory's removal). A worker
  whose parent died stops the same way (it watches a pipe only the parent holds open), and
  ends itself ``drain_timeout`` + 5 s after (:data:`KILL_GRACE`, read when serving starts).
- SIGHUP to the parent (not once stopping: ignored then) restarts every worker, one at a
  time: a replacement is started at once (no back-off, no count of failures), and once it
  serves (its ready line) the old one gets SIGTERM and drains as on a stop (killed if still
  running ``drain_timeout`` + 5 s later), so N workers or more accept throughout. The new
  ones are forks of the parent as well: code the parent imported (the served module) is
  not loaded again. The metrics exporter is kept. A worker ignores SIGHUP (and SIGINT).
- A worker that exits while the parent is not stopping (a crash, a kill) is started again:
  at once if it had been up for 10 s, else after a back-off that doubles per quick exit
  (0.1 s, 0.2 s, ... up to 30 s), so a worker that fails at start does not spin.
- A worker that exits before it ever served (its loop, its listeners or a start-up hook
  failed) :data:`BOOT_ATTEMPTS` (5) times in a row would fail the same way forever: the
  parent then stops every other worker as on SIGTERM and :func:`serve_workers` raises
  :class:`WorkerBootFailed` (which worker, how many times, its last exit status), so a
  service manager sees the service fail instead of a live parent retrying every 30 s
  (gunicorn's arbiter halts on a worker's boot failure too). A worker that served once
  resets its count; a fork that fails is not counted (it is tried again after the back-off).
- With ``PROMETHEUS_MULTIPROC_DIR`` set (``metrics=``, or the user's own), every worker that
  exits, a crash or at the stop, is marked dead there (prometheus-client's
  ``mark_process_dead``): its live gauges leave the scrape.

- ``metrics=(host, port)``: one ``/metrics`` there shows every worker (prometheus-client's
  multiprocess mode, in a temporary directory the parent owns and removes at exit; an
  exporter process serves it; see :mod:`rpc.workers_metrics`).

Workers are forked (POSIX only), so the registry, handlers and TLS context need not be
picklable; call :func:`serve_workers` from the main thread of a process that runs no event
loop (and, ideally, no other threads).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import ssl as ssl_module
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

from rpc import loops, metrics_dir, workers_metrics
from rpc.api import check_serve_keywords
from rpc.registry import Registry
from rpc.url import parse_url
from rpc.workers_child import (
    PARENT_SIGNALS,
    WorkerConfig,
    WorkerPipes,
    child_main,
    freeze_startup_objects,
    worker_main,
)
from rpc.workers_signals import ParentSignals
from rpc.workers_sockets import (
    REUSE_PORT,
    Listener,
    bind_listeners,
    close_listeners,
)

log = logging.getLogger("peerwire.workers")

STABLE_AFTER = 10.0
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 30.0
KILL_GRACE = 5.0
"""Seconds past the drain after which a worker still running is killed (by the parent on a
stop; by itself when its parent died); read when :func:`serve_workers` starts."""
BOOT_ATTEMPTS = 5
"""Exits in a row before serving (before its ready line) after which a worker is given up
and :func:`serve_workers` raises :class:`WorkerBootFailed`; read at each exit."""


class WorkerBootFailed(RuntimeError):
    """Worker ``worker`` exited before it served ``attempts`` times in a row, the last with
    ``exitcode`` (negative: killed by that signal): every other worker was stopped. The
    worker's own error (a traceback) is on stderr, above this."""

    def __init__(self, worker: int, attempts: int, exitcode: int | None) -> None:
        super().__init__(
            f"worker {worker} exited before it served, {attempts} times in a row "
            f"(the last with {_describe_exit(exitcode)}): given up"
        )
        self.worker = worker
        self.attempts = attempts
        self.exitcode = exitcode


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
    boot_failures: int = 0
    """Exits in a row before the ready line (:data:`BOOT_ATTEMPTS`)."""
    restart_at: float | None = None
    ready: bool = False
    retiring: BaseProcess | None = None
    """The process ``process`` replaces on a SIGHUP: it serves until ``process`` is ready."""

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
    float's ``2 ** 1024`` overflows, after about 8.5 hours of a worker that serves, then
    dies within :data:`STABLE_AFTER`, each time; one that never serves is given up after
    :data:`BOOT_ATTEMPTS`)."""
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
        signals: ParentSignals | None = None,
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
        self.signals = signals
        self.hangups = 0  # the signals' hangups seen
        self.rolling: list[_Slot] = []  # to restart on SIGHUP, in order, one at a time
        self.draining: list[tuple[_Slot, float]] = []  # replaced ones, with their kill time
        self.stopping = False
        self.announced = False
        self.failure: WorkerBootFailed | None = None  # run() raises it, the others stopped

    def _start(self, slot: _Slot, pipes: WorkerPipes) -> None:
        if slot.exporter:
            others = [sock for listener in self.listeners for sock in listener.sockets]
            main: Callable[..., None] = workers_metrics.exporter_main
            args: tuple[Any, ...] = (
                self.metrics_socket,
                pipes.lifeline_r,
                pipes.parent_only,
                others,
            )
            name = "peerwire-metrics"
        else:
            main = worker_main
            args = (self.listeners, self.config, pipes, self.metrics_socket)
            name = f"peerwire-worker-{slot.index}"
        slot.process = self._mp.Process(target=child_main, args=(main, *args), name=name)
        # the child is born with the parent's handlers, which only count a signal: blocked
        # until the child has set its own, a SIGTERM sent meanwhile (a stop while it
        # starts) waits for them instead of being lost (the stop then waited for the kill)
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, PARENT_SIGNALS)
        try:
            slot.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        slot.started = time.monotonic()
        slot.restart_at = None
        slot.ready = slot.exporter  # it serves at once: the parent listens for it
        log.info("%s started: pid %d", slot.name, slot.process.pid)

    def _exited(self, slot: _Slot, process: BaseProcess) -> None:
        process.join()
        slot.process = None
        if not slot.exporter and process.pid is not None:
            workers_metrics.worker_exited(process.pid)
        uptime = time.monotonic() - slot.started
        slot.quick_exits = 0 if uptime >= STABLE_AFTER else slot.quick_exits + 1
        slot.boot_failures = 0 if slot.ready else slot.boot_failures + 1
        what = f"{slot.name} (pid {process.pid}) exited with {_describe_exit(process.exitcode)}"
        if slot.boot_failures >= BOOT_ATTEMPTS and self.failure is None:
            self.failure = WorkerBootFailed(slot.index, slot.boot_failures, process.exitcode)
            self.stopping = True  # _supervise ends; run() stops the others, then raises
            log.error("%s before it served, %d times in a row: stopping", what, slot.boot_failures)
        elif self.stopping:  # another's boot failure, seen at the same wake-up: no restart
            log.warning("%s", what)
        else:
            delay = _backoff(slot.quick_exits)
            slot.restart_at = time.monotonic() + delay
            log.warning("%s after %.1f s; restarting in %.1f s", what, uptime, delay)
        process.close()

    def _on_ready_line(self, pid: int) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.pid == pid:
                slot.ready = True
                if slot.retiring is not None:
                    self._retire(slot)
        if not self.announced and all(slot.ready for slot in self.slots):
            self.announced = True
            if self.on_ready is not None:
                self.on_ready([str(listener.url) for listener in self.listeners])

    def run(self) -> None:
        """Start every process and supervise them until a signal (``self.signals``) or a
        worker that never serves (:class:`WorkerBootFailed`, raised once the others have
        stopped), then stop them; a signal that came before this starts none."""
        if self.signals is None:
            raise RuntimeError("run() needs the parent's signals")
        ready_r, ready_w = os.pipe()
        lifeline_r, lifeline_w = os.pipe()
        wake_r = self.signals.wake_r
        pipes = WorkerPipes(ready_w, lifeline_r, (ready_r, lifeline_w, wake_r, self.signals.wake_w))
        self.hangups = self.signals.hangups  # before any worker started: none to restart
        try:
            if not self._signalled():
                for slot in self.slots:
                    self._start(slot, pipes)
                self._supervise(ready_r, wake_r, pipes)
        finally:
            self._stop_all(wake_r)
            for fd in (ready_r, ready_w, lifeline_r, lifeline_w):
                os.close(fd)
        if self.failure is not None:
            raise self.failure

    def _signalled(self) -> bool:
        if self.signals is not None and self.signals.count:
            self.stopping = True
        return self.stopping

    def _supervise(self, ready_r: int, wake_r: int, pipes: WorkerPipes) -> None:
        pending = b""
        while not self._signalled():
            now = time.monotonic()
            times = [s.restart_at for s in self.slots if s.restart_at is not None]
            times += [deadline for _, deadline in self.draining]
            timeout = max(0.0, min(times) - now) if times else None
            live = {s.process.sentinel: (s, s.process) for s in self.slots if s.process is not None}
            retiring = {s.retiring.sentinel: s for s in self.slots if s.retiring is not None}
            draining = {old.process.sentinel: old for old, _ in self.draining if old.process}
            waits = [*live, *retiring, *draining, ready_r, wake_r]
            readable = multiprocessing.connection.wait(waits, timeout)
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
                elif sentinel in retiring:  # it died before its replacement served
                    self._reap(_Slot(retiring[sentinel].index, process=retiring[sentinel].retiring))
                    retiring[sentinel].retiring = None
                elif sentinel in draining:
                    self._reap(draining[sentinel])
            if self._signalled():
                break
            now = time.monotonic()
            for old, deadline in self.draining:
                if deadline <= now:
                    self._reap(old, killed="did not stop in time once replaced: killed")
            self.draining = [(old, d) for old, d in self.draining if old.process is not None]
            for slot in self.slots:
                if slot.restart_at is not None and slot.restart_at <= now:
                    self._restart(slot, pipes)
            self._roll(pipes)

    def _roll(self, pipes: WorkerPipes) -> None:
        """On a SIGHUP, queue every worker; then start the next queued one's replacement,
        once no other replacement is starting. The old process serves on until its
        replacement is ready (:meth:`_retire`). A worker down (waiting for its back-off)
        is skipped: it starts anew anyway. The metrics exporter serves no handlers: kept."""
        if self.signals is not None and self.signals.hangups > self.hangups:
            self.hangups = self.signals.hangups
            self.rolling = [slot for slot in self.slots if not slot.exporter]
            log.info("SIGHUP: restarting %d worker(s), one at a time", len(self.rolling))
        while self.rolling and not any(slot.retiring is not None for slot in self.slots):
            slot = self.rolling.pop(0)
            if slot.process is None:
                continue
            # neither a quick exit nor a boot failure: the old one lives until replaced
            if time.monotonic() - slot.started >= STABLE_AFTER:
                slot.quick_exits = 0
            if slot.ready:
                slot.boot_failures = 0
            slot.retiring, slot.process = slot.process, None
            self._restart(slot, pipes)  # at once; a fork that fails: after the back-off

    def _retire(self, slot: _Slot) -> None:
        """``slot``'s replacement serves: SIGTERM to the old process, which drains as on a
        stop; it is killed if still running ``drain_timeout`` + ``kill_grace`` later."""
        old = slot.retiring
        if old is None or slot.process is None:
            return
        slot.retiring = None
        log.info("%s: pid %d replaces pid %d, stopping it", slot.name, slot.process.pid, old.pid)
        old.terminate()
        grace = self.config.drain_timeout + self.config.kill_grace
        self.draining.append((_Slot(slot.index, process=old), time.monotonic() + grace))

    def _restart(self, slot: _Slot, pipes: WorkerPipes) -> None:
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

    def _stop_all(self, wake_r: int) -> None:
        """SIGTERM to every process, then wait for them: up to the drain plus
        :data:`KILL_GRACE`, or until one more signal comes (``wake_r`` wakes the wait), past
        which those left are killed. Each worker that ended is marked dead for the metrics."""
        old = [_Slot(s.index, process=s.retiring) for s in self.slots if s.retiring is not None]
        live = {s.process.sentinel: s for s in [*self.slots, *old] if s.process is not None}
        log.info("stopping %d worker(s)", len(live))
        for slot in live.values():
            if slot.process is not None:
                slot.process.terminate()  # SIGTERM: the worker closes its servers gracefully
        for slot, _ in self.draining:  # SIGTERMed once replaced: a second one is no use
            if slot.process is not None:
                live[slot.process.sentinel] = slot
        seen = self.signals.count if self.signals is not None else 0
        deadline = time.monotonic() + self.config.drain_timeout + self.config.kill_grace
        why = "did not stop in time: killed"
        while live:
            count = self.signals.count if self.signals is not None else 0
            if count > seen or count >= 2:  # one more than the stop's own: no more waiting
                why = "killed at once: SIGTERM or SIGINT again while stopping"
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ended = multiprocessing.connection.wait([*live, wake_r], left)
            if wake_r in ended:
                os.read(wake_r, 512)
            for sentinel in ended:
                if sentinel in live:
                    self._reap(live.pop(sentinel))
        for slot in live.values():
            self._reap(slot, killed=why)

    def _reap(self, slot: _Slot, killed: str | None = None) -> None:
        """Wait for ``slot``'s process, killed (SIGKILL) first when ``killed`` says why."""
        process = slot.process
        if process is None:
            return
        if killed is not None:
            log.warning("%s (pid %d) %s", slot.name, process.pid, killed)
            process.kill()
        process.join()
        if killed is None and process.exitcode != 0:
            log.warning(
                "%s (pid %d) exited with %s",
                slot.name,
                process.pid,
                _describe_exit(process.exitcode),
            )
        if not slot.exporter and process.pid is not None:
            workers_metrics.worker_exited(process.pid)
        process.close()
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
    """Serve ``registry`` on ``urls`` in ``workers`` processes until SIGTERM or SIGINT;
    SIGHUP restarts the workers one at a time (see the module's docstring).

    Blocks; returns once every worker has stopped (a second signal kills those left at
    once; SIGTERM, SIGINT and SIGHUP are only counted until it returns). ``ssl`` is given
    to the TLS URLs; ``loop`` picks each worker's event loop (:mod:`rpc.loops`); ``serve_options``
    go to :func:`rpc.serve` in each worker (``options``, ``max_connections``, ``web``, ...).
    ``on_ready(bound_urls)`` runs once in the parent when every worker serves (port 0
    replaced by the bound port). ``reuse_port=False`` shares the parent's listening socket
    even where ``SO_REUSEPORT`` would be used. ``metrics=(host, port)`` (the ``metrics``
    extra) serves every worker's metrics at ``http://host:port/metrics``;
    ``on_metrics(url)`` learns that URL (port 0 resolved) before the workers start.
    Raises ``OSError`` if a URL or the metrics address cannot be bound, ``ValueError``
    for bad arguments, ``TypeError`` for a keyword :func:`rpc.serve` does not take,
    ``RuntimeError`` if prometheus-client was imported before without
    ``PROMETHEUS_MULTIPROC_DIR`` set (import it after, or set it), and
    :class:`WorkerBootFailed` (a ``RuntimeError``), once every other worker has stopped,
    when a worker exits before it served :data:`BOOT_ATTEMPTS` times in a row.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    loops.resolve(loop)  # an unknown or missing loop fails here, not in every worker
    urls = [urls] if isinstance(urls, str) else list(urls)
    for url in map(parse_url, urls):
        if url.tls and ssl is None:
            raise ValueError(f"{url} needs an ssl= server context (certificate and key)")
    for name in ("url", "sock"):  # each worker's serve() gets its own
        if name in serve_options:
            raise TypeError(f"serve_workers sets rpc.serve's {name!r} in each worker itself")
    for text in urls:  # a keyword rpc.serve refuses fails here, not in every worker
        check_serve_keywords(text, serve_options)
    if metrics is not None and "metrics" in serve_options:
        raise ValueError("metrics=(host, port) counts every worker: give no rpc.serve metrics")
    with contextlib.ExitStack() as stack:
        signals = stack.enter_context(ParentSignals())  # first in: its handlers leave last
        metrics_socket = None
        if metrics is not None:
            stack.enter_context(metrics_dir.owned())  # before prometheus_client is imported
            metrics_socket = stack.enter_context(workers_metrics.bind(*metrics))
            if on_metrics is not None:
                on_metrics(workers_metrics.url_of(metrics_socket))
        listeners = bind_listeners(urls, reuse_port=reuse_port)
        stack.callback(close_listeners, listeners)
        config = WorkerConfig(
            registry,
            ssl,
            loop,
            drain_timeout,
            reuse_port,
            serve_options,
            metrics is not None,
            KILL_GRACE,
        )
        _Supervisor(listeners, workers, config, on_ready, metrics_socket, signals).run()


__all__ = [
    "BOOT_ATTEMPTS",
    "REUSE_PORT",
    "Listener",
    "WorkerBootFailed",
    "WorkerConfig",
    "bind_listeners",
    "close_listeners",
    "freeze_startup_objects",
    "serve_workers",
]
