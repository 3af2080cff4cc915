"""What runs in a forked process of :func:`rpc.workers.serve_workers`: the worker's serving,
its start (signals let in only once the parent's set-up is undone), and what parent and
worker share (:class:`WorkerConfig`, the pipes, :func:`freeze_startup_objects`)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import ssl as ssl_module
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rpc import loops, workers_metrics
from rpc.api import Server, serve
from rpc.registry import Registry
from rpc.workers_sockets import REUSE_PORT, Listener, worker_sockets

log = logging.getLogger("peerwire.workers")


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
    kill_grace: float = 5.0  # past its drain, a worker still running is killed (KILL_GRACE)


@dataclass(frozen=True)
class WorkerPipes:
    """Fds a worker is born with: ``ready_w`` to report, ``lifeline_r`` to watch the parent;
    the others are the parent's and are closed in the worker at once."""

    ready_w: int
    lifeline_r: int
    parent_only: tuple[int, ...]


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PARENT_SIGNALS = (*STOP_SIGNALS, signal.SIGHUP)
"""What the parent handles (:class:`rpc.workers_signals.ParentSignals`), blocked across a
fork: SIGHUP restarts the workers."""


def child_main(main: Callable[..., None], *args: Any) -> None:
    """A forked process's start: the parent's signal set-up undone (its wakeup fd, its
    handlers, which only count), then the signals blocked across the fork let in: a
    SIGTERM that came meanwhile ends the process now, as one does until it serves.

    SIGINT and SIGHUP are ignored (inherited so by the programs a handler runs, as with
    ``nohup``): a terminal's ^C or hang-up reaches the parent too, which stops the workers
    or restarts them one at a time; a SIGHUP to a worker alone used to kill it."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PARENT_SIGNALS)
    main(*args)


def worker_main(
    listeners: list[Listener],
    config: WorkerConfig,
    pipes: WorkerPipes,
    metrics_socket: socket.socket | None = None,
) -> None:
    """A worker's process. The parent's pipes and the metrics listening socket (the
    exporter's) are closed first: held here, the metrics port stayed bound as long as any
    worker lived, a worker whose parent died included, until its drain ended."""
    for fd in pipes.parent_only:  # SIGTERM ends it at once until it serves (child_main)
        os.close(fd)
    if metrics_socket is not None:
        metrics_socket.close()
    grace = config.drain_timeout + config.kill_grace
    threading.Thread(
        target=_exit_when_orphaned,
        args=(pipes.lifeline_r, grace),
        name="peerwire-orphan",
        daemon=True,
    ).start()
    loops.run(_serve_worker(listeners, config, pipes), config.loop)


def _exit_when_orphaned(lifeline_r: int, grace: float) -> None:
    """Ends the process ``grace`` seconds (drain plus kill grace) after its parent died, as
    the parent would have killed it: the loop's own stop drains, but what handlers leave
    running (a thread the loop's end waits on, a task that ignores cancellation) held an
    orphan for good, with nobody left to kill it. A daemon thread: it never holds an exit."""
    workers_metrics.wait_for_eof(lifeline_r)
    time.sleep(grace)
    log.warning("worker %d still running %.1f s after its parent died: exiting", os.getpid(), grace)
    os._exit(1)


async def _serve_worker(
    listeners: list[Listener], config: WorkerConfig, pipes: WorkerPipes
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in STOP_SIGNALS:
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
