"""``peerwire serve`` as a service manager runs it: signals at awkward moments, handlers that
do not stop, crash loops. Real processes and sockets on 127.0.0.1; each test is bounded by
its own waits (a line, an exit), never by a fixed sleep.

Every test here failed on the code it was written against (see each docstring).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import rpc
from rpc import workers
from rpc.cli_serve import STOP_GRACE
from tests.test_workers import Running

ROOT = Path(__file__).resolve().parent.parent
PEERWIRE = [sys.executable, "-m", "rpc.cli"]
DRAIN = 0.5  # `peerwire serve --drain-timeout` (default 5 s): the calls in flight are cut then
EXIT_BOUND = DRAIN + STOP_GRACE + 3.0  # the drain, then what handlers left gets STOP_GRACE
# (past the bound if the drain were the default's: 5 + 5 s)

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and fork"),
]


def serve_two_workers_with_metrics(module: Path, env: dict[str, str]) -> Running:
    """``peerwire serve MODULE --workers=2 --metrics=...`` in the environment ``env``."""
    return Running(
        [
            *PEERWIRE,
            "serve",
            str(module),
            "--workers=2",
            "--metrics=127.0.0.1:0",
            "--listen=tcp+gotalk://127.0.0.1:0",
        ],
        env=env,
    )


def write_module(directory: Path, body: str) -> Path:
    """A module to serve: ``registry`` and ``body`` (asyncio, os, sys and time imported)."""
    path = directory / "service_app.py"
    path.write_text(
        "import asyncio\nimport os\nimport sys\nimport time\n\nimport rpc\n\n"
        "registry = rpc.Registry()\n\n" + body
    )
    return path


def stubborn(*started: str) -> str:
    """The source of ``stubborn``, a handler that swallows its cancellation for 60 s; its
    first statements are ``started`` (saying it began)."""
    return (
        "@registry.handle('stubborn')\n"
        "async def stubborn(_):\n"
        + "".join(f"    {line}\n" for line in started)
        + "    end = time.monotonic() + 60\n"
        "    while time.monotonic() < end:\n"
        "        try:\n"
        "            await asyncio.sleep(end - time.monotonic())\n"
        "        except asyncio.CancelledError:\n"
        "            pass\n"
    )


async def sigterm_with_a_call_in_flight(module: Path, op: str) -> tuple[int | None, float]:
    """Serve ``module``, start ``op`` (which prints ``started``), SIGTERM the server: its
    exit code (None: still running after EXIT_BOUND) and the seconds it took; it must say
    why it exits without waiting for what is left."""
    server = Running(
        [
            *PEERWIRE,
            "serve",
            str(module),
            f"--drain-timeout={DRAIN}",
            "--listen",
            "tcp+gotalk://127.0.0.1:0",
        ]
    )
    try:
        [line] = await asyncio.to_thread(server.wait_lines, "stdout", "listening on ")
        url = line.split()[-1]
        peer = await rpc.connect(url, reconnect=False)
        call = asyncio.ensure_future(peer.request(op, None, timeout=60))
        await asyncio.to_thread(server.wait_lines, "stdout", "started")
        began = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(server.exit_code, EXIT_BOUND)
        took = time.monotonic() - began
        async with asyncio.timeout(5):
            await peer.closed  # the drain ended with our connection closed
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        if code is not None:
            server.kill()  # its stderr read to the end
            assert any("exiting now" in line for line in server.lines["stderr"]), server.lines
        return code, took
    finally:
        server.kill()


async def test_sigterm_ends_serve_when_a_handler_ignores_cancellation(tmp_path: Path) -> None:
    """The drain (5 s) closes the connection and cancels the handler, but a single-process
    ``peerwire serve`` then waits for every task to end (asyncio.Runner's cancel-all) with
    no bound: a handler that swallows CancelledError held the process for its whole run (60
    s here; forever for a loop), and a second SIGTERM does nothing. ``--workers 2`` kills
    such a worker at drain + 5 s."""
    module = write_module(tmp_path, stubborn("print('started', flush=True)"))
    code, took = await sigterm_with_a_call_in_flight(module, "stubborn")
    assert code is not None, f"still running {took:.1f} s after SIGTERM"


async def test_sigterm_ends_serve_when_a_handler_waits_on_a_thread(tmp_path: Path) -> None:
    """A handler awaiting ``asyncio.to_thread`` (blocking work off the loop) is cancelled at
    the drain's end, but the loop's shutdown then joins the default executor's threads with
    no bound: the process lived until the thread's work ended (60 s here) after its
    connections were long closed."""
    module = write_module(
        tmp_path,
        "@registry.handle('threaded')\n"
        "async def threaded(_):\n"
        "    print('started', flush=True)\n"
        "    await asyncio.to_thread(time.sleep, 60)\n",
    )
    code, took = await sigterm_with_a_call_in_flight(module, "threaded")
    assert code is not None, f"still running {took:.1f} s after SIGTERM"


def test_sigterm_right_after_listening_is_graceful(tmp_path: Path) -> None:
    """``listening on URL`` is printed before ``_serve_here`` installs its SIGTERM handler
    (gc.collect/freeze and add_signal_handler come after): a service manager or script
    that stops the server once it reports ready killed it by the default action (exit
    -15 in every run here), its connections reset without a drain. ``--workers`` is not
    affected (the parent's handlers are installed before any worker starts)."""
    module = write_module(tmp_path, "registry.handle('pid')(lambda _: os.getpid())\n")
    for _ in range(2):
        server = Running([*PEERWIRE, "serve", str(module), "--listen", "tcp+gotalk://127.0.0.1:0"])
        try:
            server.wait_lines("stdout", "listening on ")[0]
            server.process.send_signal(signal.SIGTERM)
            assert server.exit_code(10) == 0, server.lines["stderr"]
        finally:
            server.kill()


def test_sigterm_during_start_up_leaves_no_metrics_directory(tmp_path: Path) -> None:
    """``--workers N --metrics``: the parent makes its multiprocess directory before it
    imports the served module (documented: "removed, with the variable, when it stops"),
    but SIGTERM keeps its default action until the supervisor starts: a SIGTERM during a
    slow import (a service manager's stop or restart while the service starts) killed the
    parent and left the directory behind, one per such stop."""
    module = write_module(
        tmp_path,
        "registry.handle('pid')(lambda _: os.getpid())\n"
        "print('importing', os.environ['PROMETHEUS_MULTIPROC_DIR'], flush=True)\n"
        "time.sleep(30)  # a slow import: loading models, warming caches\n",
    )
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    server = serve_two_workers_with_metrics(module, env)
    try:
        directory = Path(server.wait_lines("stdout", "importing")[0].split()[-1])
        assert directory.parent == temp
        server.process.send_signal(signal.SIGTERM)
        assert server.exit_code(10) is not None
        assert not directory.exists(), f"left behind: {sorted(os.listdir(temp))}"
    finally:
        server.kill()


def _exit_at_once() -> None:
    os._exit(1)


def test_restart_back_off_stays_bounded_after_many_quick_exits() -> None:
    """Documented: a worker that dies quickly is started again after "0.1 s doubling to 30
    s". The delay is computed as ``0.1 * 2 ** (quick_exits - 1)`` before the cap, which
    overflows a float after 1,024 quick exits in a row (about 8.5 hours of a worker that
    fails at start, e.g. while its database is down): ``_exited`` raised OverflowError and
    the supervisor, every worker and ``peerwire serve`` ended with it (exit 1)."""
    [listener] = workers.bind_listeners(["tcp+gotalk://127.0.0.1:0"])
    try:
        supervisor = workers._Supervisor([listener], 1, workers.WorkerConfig(), None)
        slot = supervisor.slots[0]
        process = multiprocessing.get_context("fork").Process(target=_exit_at_once)
        process.start()
        slot.process = process
        slot.started = time.monotonic()
        slot.quick_exits = 1100  # the exits before this one, each within STABLE_AFTER
        supervisor._exited(slot, process)
        assert slot.restart_at is not None
        assert slot.restart_at - time.monotonic() <= workers.BACKOFF_MAX
    finally:
        workers.close_listeners([listener])


def test_metrics_url_printed_for_an_ipv6_address_is_a_url(tmp_path: Path) -> None:
    """``peerwire serve --metrics [::1]:0`` printed ``metrics on http://::1:PORT/metrics``
    (``_start_metrics`` formats the host as is): not a URL (curl: "URL malformed", exit 3;
    urllib.parse finds no host and no port), where ``--workers 2`` prints
    ``http://[::1]:PORT/metrics`` (``workers_metrics.url_of``)."""
    module = write_module(tmp_path, "registry.handle('pid')(lambda _: os.getpid())\n")
    server = Running(
        [*PEERWIRE, "serve", str(module), "--metrics=[::1]:0", "--listen=tcp+gotalk://127.0.0.1:0"]
    )
    try:
        url = server.wait_lines("stdout", "metrics on ")[0].split()[-1]
        server.wait_lines("stdout", "listening on ")[0]
        parts = urllib.parse.urlsplit(url)
        assert parts.hostname == "::1", url
        assert parts.port is not None and parts.port > 0
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert answer.status == 200
        server.process.send_signal(signal.SIGTERM)
        assert server.exit_code(10) == 0
    finally:
        server.kill()


async def test_a_missing_multiproc_directory_of_the_users_is_refused_or_made(
    tmp_path: Path,
) -> None:
    """``--workers N --metrics`` with ``PROMETHEUS_MULTIPROC_DIR`` set by the user ("used
    and left alone") to a directory that does not exist (a typo, a tmpfs not mounted yet):
    the parent printed ``listening on``, yet no connection was served (the worker's metrics
    raised FileNotFoundError from the accept, "Unhandled exception in event loop"; the
    client's connect was reset, or timed out) and the exporter crashed at start forever,
    a traceback each time. Either outcome would do: refuse at once (exit 2, one line), or
    make the directory (as ``metrics_dir.prepare`` does for its own) and serve."""
    module = write_module(tmp_path, "registry.handle('pid')(lambda _: os.getpid())\n")
    missing = tmp_path / "not-there"
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(missing)}
    server = serve_two_workers_with_metrics(module, env)
    try:
        try:
            [line] = await asyncio.to_thread(server.wait_lines, "stdout", "listening on ")
        except AssertionError:  # exited without serving: it must say why, as a usage error
            assert server.exit_code(10) == 2, server.lines["stderr"]
            return
        async with rpc.connect(line.split()[-1], reconnect=False, connect_timeout=5) as peer:
            assert isinstance(await peer.request("pid", None, timeout=5), int)
        server.process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(server.exit_code, 15) == 0
    finally:
        server.kill()
