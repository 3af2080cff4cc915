"""``peerwire serve``: import a module, serve its registry on every ``--listen`` URL in this
process or in ``--workers`` processes, with ``--metrics``, until SIGINT/SIGTERM.

rpc.cli (the entry point: arguments, dispatch, exit codes, the client commands) imports
this module. ``CliError`` and the exit codes live here, not there, because both modules
raise them and this one must not import rpc.cli: under ``python -m rpc.cli`` that is
``__main__``, and importing it again would make a second ``CliError`` its handler misses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import logging
import os
import signal
import ssl
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import rpc
from rpc import loops, metrics_dir, workers_metrics
from rpc.workers import WorkerBootFailed, freeze_startup_objects, serve_workers
from transports.stream import server_ssl_context

log = logging.getLogger("peerwire.cli")  # the entry point's: -v output reads as before

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CONNECTION = 3
EXIT_TIMEOUT = 4
EXIT_REMOTE_ERROR = 5
EXIT_RETRY = 6

STOP_GRACE = 5.0
"""Seconds a single-process ``peerwire serve`` gives what its handlers left running once its
servers have closed (their drain, ``--drain-timeout``, 5 s, then the linger: about 10 s): a
task that ignores cancellation, a thread it waits on, past which the process exits anyway
(``--workers`` kills such a worker after as long, :data:`rpc.workers.KILL_GRACE`)."""


class CliError(Exception):
    """A failure to report in one line on stderr, with its exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def url_arg(url: str) -> rpc.PeerUrl:
    """A URL argument (``--listen``, a client's URL), or a usage error."""
    try:
        return rpc.parse_url(url)
    except rpc.UrlError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


# --- serve ---------------------------------------------------------------------------------


def load_module(spec: str) -> ModuleType:
    """A file path (anything ending in .py or naming an existing file) or a dotted name."""
    try:
        if spec.endswith(".py") or Path(spec).is_file():
            return _load_file(Path(spec))
        return importlib.import_module(spec)
    except Exception as exc:
        log.debug("importing %s failed", spec, exc_info=True)
        raise CliError(f"cannot import {spec}: {type(exc).__name__}: {exc}", EXIT_USAGE) from None


def _load_file(path: Path) -> ModuleType:
    name = path.stem if path.stem not in sys.modules else f"_peerwire_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python module: {path}")
    module = importlib.util.module_from_spec(spec)
    # as `python file.py` would: sibling imports work, and dataclasses find their module
    sys.path.insert(0, str(path.resolve().parent))
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def find_registry(module: ModuleType) -> rpc.Registry:
    registry = getattr(module, "registry", None)
    if registry is None:
        return rpc.default_registry
    if not isinstance(registry, rpc.Registry):
        raise CliError(
            f"{module.__name__}.registry is a {type(registry).__name__}, not an rpc.Registry",
            EXIT_USAGE,
        )
    return registry


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise CliError(f"expected HOST:PORT, got {text!r}", EXIT_USAGE)
    return host.strip("[]") or "0.0.0.0", int(port)


def _start_metrics(address: str, out: StatusLines) -> tuple[Any, Any]:
    """(Metrics, HTTP server) for ``--metrics HOST:PORT``."""
    host, port = _host_port(address)
    try:
        from prometheus_client import CollectorRegistry

        from rpc import metrics
    except ImportError:
        raise CliError("--metrics needs: pip install 'peerwire[metrics]'", EXIT_USAGE) from None
    registry = CollectorRegistry()
    collected = metrics.Metrics(registry)
    try:
        http, _ = metrics.start_http_server(host, port, registry=registry)
    except OSError as exc:
        raise CliError(f"cannot serve metrics on {address}: {exc}", EXIT_CONNECTION) from None
    out.say(f"metrics on {workers_metrics.url_of(http.socket)}")
    return collected, http


def serve(args: argparse.Namespace) -> int:
    """Serve in this process, or with ``--workers N`` in N forked worker processes. A
    SIGTERM while it starts (a slow import of the served module) ends it as SIGINT would,
    what it set up undone (the metrics directory), until serving takes the signal over;
    once serving ended, no signal cuts that clean-up short. Fds 0-2 closed at the start
    are opened on /dev/null (:func:`std_fds_open`). Once it is done, what is left is the
    interpreter's exit (``atexit`` handlers, threads joined): a signal then ends the process
    at once, exit 0, not by the signal's default (killed). With ``--workers N`` SIGHUP is
    ignored but while serving (a rolling restart of the workers, :mod:`rpc.workers`): before,
    there is no worker to restart, after, none left; its default would kill the parent,
    its metrics directory left behind."""
    std_fds_open()
    if args.workers > 1:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with _stop_while_starting() as serving_over:
        code = _serve_and_clean_up(args, serving_over)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_on_signal)
    return code


def _serve_and_clean_up(args: argparse.Namespace, serving_over: Callable[[], None]) -> int:
    if not (args.metrics and args.workers > 1):
        return _serve(args)
    if importlib.util.find_spec("prometheus_client") is None:
        raise CliError("--metrics needs: pip install 'peerwire[metrics]'", EXIT_USAGE)
    # the multiprocess directory must be set before the served module might import
    # prometheus_client; it is removed when serving ends
    with ExitStack() as stack:
        try:
            stack.enter_context(metrics_dir.owned())
        except OSError as exc:  # a PROMETHEUS_MULTIPROC_DIR of the user's it cannot make
            raise CliError(f"cannot use {metrics_dir.ENV}: {exc}", EXIT_USAGE) from None
        stack.callback(serving_over)  # first out: before the directory is removed
        return _serve(args)


def _exit_on_signal(signum: int, frame: object) -> None:
    _exit_now(f"{signal.Signals(signum).name} during the exit")


@contextmanager
def _stop_while_starting() -> Iterator[Callable[[], None]]:
    """For the block's life, the first SIGTERM raises SystemExit (exit 0) in the main
    thread, the first SIGINT KeyboardInterrupt (exit 130): SIGTERM's default would end the
    process with nothing cleaned up. Only the first: a second raise could cut that
    clean-up short (the metrics directory's removal, left behind), so later ones, and any
    once the function it gives was called (serving ended), are ignored. Serving installs
    handlers of its own (the loop's, the supervisor's) over these; the previous ones are
    back at the block's end."""
    raised = False

    def stop(signum: int, frame: object) -> None:
        nonlocal raised
        if raised:
            return
        raised = True
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(EXIT_OK)

    def over() -> None:
        nonlocal raised
        raised = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield over
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stdout_to_devnull() -> None:
    """stdout can take no more (a full disk, a reader gone): its fd becomes /dev/null, so
    that what is left in its buffer, and the interpreter's flush at exit, go nowhere
    instead of failing again (exit 120)."""
    if sys.stdout is None:
        return
    with contextlib.suppress(Exception):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    with contextlib.suppress(Exception):
        sys.stdout.flush()  # what the failed write left: to /dev/null now


def std_fds_open() -> None:
    """Open /dev/null on each of fds 0, 1, 2 that is closed (``peerwire serve ... >&-``):
    else the first fds opened (the loop's epoll, a listening socket) take their numbers, a
    write to stdout (a handler's child process) goes into a socket, and uvloop aborts when
    it closes them (it asserts fd > 2). ``sys.stdout`` stays None then (Python saw it
    closed): :class:`StatusLines` tells so on stderr. ``sys.stderr``, None when fd 2 was
    closed, writes to fd 2 (/dev/null): ``print(..., file=None)`` writes to stdout, and a
    failure's line would go where a script reads results."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free fd: this one
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 (the process's, for good)


class StatusLines:
    """``serve``'s lines on stdout (``listening on URL``, ``metrics on URL``). Printing is
    not a server's job: when stdout cannot take a line (closed, a pipe whose reader went
    away, a full disk), serving goes on; that line and the later ones go to stderr (where a
    service manager's log has them) after one warning, and stdout becomes /dev/null, so
    the interpreter's exit does not fail on it either (exit 120)."""

    def __init__(self) -> None:
        self.to_stderr = False

    def listening(self, urls: list[str]) -> None:
        for url in urls:
            self.say(f"listening on {url}")

    def say(self, line: str) -> None:
        if not self.to_stderr:
            try:
                if sys.stdout is None:
                    raise OSError("stdout is closed")
                print(line, flush=True)
                return
            except (OSError, ValueError) as exc:  # ValueError: sys.stdout closed
                self.to_stderr = True
                stdout_to_devnull()
                log.warning("cannot write to stdout (%s): its lines go to stderr", exc)
        with contextlib.suppress(Exception):
            print(line, file=sys.stderr, flush=True)


def _exit_now(why: str) -> None:
    """End the process at once (what is still running would hold it): say why first. A
    stream that cannot be flushed (a pipe whose reader is gone) must not stop the exit."""
    with contextlib.suppress(Exception):
        log.warning("%s; exiting now", why)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_OK)


def _serve(args: argparse.Namespace) -> int:
    urls = [url_arg(url) for url in args.listen]
    out = StatusLines()
    registry = find_registry(load_module(args.module))
    if not registry.names():
        log.warning("%s registers no request handlers", args.module)
    server_ctx: ssl.SSLContext | None = None
    if any(url.tls for url in urls):
        if not args.cert:
            raise CliError("TLS URLs (ssl+, wss+) need --cert (and --key)", EXIT_USAGE)
        try:
            server_ctx = server_ssl_context(args.cert, args.key, client_cafile=args.client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise CliError(f"cannot load certificate: {exc}", EXIT_USAGE) from None
    try:
        loops.resolve(args.loop)
    except loops.LoopUnavailable as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    if args.workers == 1:
        # the loop's end cancels the tasks left and waits for them, and for its executor's
        # threads, and the interpreter's exit waits for every other pool's threads and
        # non-daemon thread, all without bound: a handler that ignores cancellation, or
        # waits on a thread, would hold the process. Past STOP_GRACE after the servers
        # closed, it ends: the timer stays armed through the exit (a daemon thread, gone
        # with the process), so this is for the CLI's process only
        watchdog = threading.Timer(
            STOP_GRACE,
            _exit_now,
            (f"work left by handlers still running {STOP_GRACE} s after closing",),
        )
        watchdog.daemon = True
        try:
            serving = _serve_here(
                urls, registry, server_ctx, args.metrics, args.drain_timeout, watchdog, out
            )
            return loops.run(serving, args.loop)
        except BaseException:
            watchdog.cancel()  # not stopped by a signal: an error, said as usual
            raise
    metrics = _host_port(args.metrics) if args.metrics else None
    try:
        serve_workers(
            args.listen,
            workers=args.workers,
            registry=registry,
            ssl=server_ctx,
            loop=args.loop,
            drain_timeout=args.drain_timeout,
            on_ready=out.listening,
            metrics=metrics,
            on_metrics=lambda url: out.say(f"metrics on {url}"),
        )
    except OSError as exc:
        where = " ".join(args.listen) + (f" (metrics: {args.metrics})" if metrics else "")
        raise CliError(f"cannot serve {where}: {exc}", EXIT_CONNECTION) from None
    except WorkerBootFailed as exc:  # the worker's own error is on stderr above
        raise CliError(f"cannot serve {' '.join(args.listen)}: {exc}", EXIT_FAILED) from None
    return EXIT_OK


async def _serve_here(
    urls: list[rpc.PeerUrl],
    registry: rpc.Registry,
    server_ctx: ssl.SSLContext | None,
    metrics_address: str | None,
    drain_timeout: float,
    watchdog: threading.Timer,
    out: StatusLines,
) -> int:
    servers: list[rpc.Server] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # first: a stop once it says it listens is
        loop.add_signal_handler(sig, stop.set)  # graceful (asked for as it starts: too)
    metrics, http = _start_metrics(metrics_address, out) if metrics_address else (None, None)
    try:
        for url in urls:
            # the core refuses a TLS context for a plain URL: only TLS URLs get one
            server = rpc.serve(
                str(url), registry=registry, ssl=server_ctx if url.tls else None, metrics=metrics
            )
            try:
                await server.start()
            except OSError as exc:
                raise CliError(f"cannot listen on {url}: {exc}", EXIT_CONNECTION) from None
            servers.append(server)
            out.say(f"listening on {server.url}")
        freeze_startup_objects()
        await stop.wait()
        log.info("stopping: closing %d server(s)", len(servers))
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal: no more waiting
            loop.add_signal_handler(sig, _exit_now, f"{signal.Signals(sig).name} again")
    finally:
        await asyncio.gather(
            *(s.close(drain_timeout=drain_timeout) for s in servers), return_exceptions=True
        )
        if http is not None:
            http.shutdown()
            http.server_close()  # the listening socket too, not at the process's exit
        watchdog.start()
    return EXIT_OK
