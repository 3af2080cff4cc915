"""Why a connection ended, as the reconnecting client tells it (our own abort, a limit of
the WebSocket transport's), and how ``peerwire serve`` ends when its handlers leave work
behind (a pool of their own, a stdout nobody reads). Found by helper-112's review.

Real servers and processes on 127.0.0.1, port 0; each test is bounded by its own waits (an
event, a line, an exit), never by a fixed sleep.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rpc
from rpc.cli_serve import STOP_GRACE
from tests.reconnect_helpers import FAST, RECONNECTING, Recorder, named
from tests.rpc_helpers import wait_until
from tests.test_service_hunt import stubborn, write_module

ROOT = Path(__file__).resolve().parent.parent
DRAIN = 0.5  # `peerwire serve --drain-timeout`: the calls in flight are cut then
EXIT_BOUND = DRAIN + STOP_GRACE + 3.0
PEERWIRE = [sys.executable, "-m", "rpc.cli"]
LISTEN = "tcp+gotalk://127.0.0.1:0"

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and pipes"),
]


# --- 32ec3ed: who cut the connection --------------------------------------------------------


async def test_our_own_abort_is_not_reported_as_closed_by_the_peer() -> None:
    """docs/reconnect.md (32ec3ed): "closed by the peer" "is said only when the server
    closed the connection". ``ReconnectingPeer.abort()`` (documented: "the client then
    reconnects like after any drop") cuts the connection from our side with no reason, so
    ``gave_up`` stays None and the transition says the server closed it."""
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("s")) as server:
        record = Recorder()
        async with rpc.connect(str(server.url), reconnect=FAST, on_state=record) as client:
            assert await client.request("who") == "s"
            client.abort()
            await wait_until(lambda: RECONNECTING in record.states())
            drop = next(t for _, t in record.seen if t.state is RECONNECTING)
            assert drop.error is not None
            assert "closed by the peer" not in drop.error, drop.error


async def _partial_frame_server(
    cut: asyncio.Event,
) -> tuple[asyncio.Server, list[asyncio.StreamWriter]]:
    """Accepts a WebSocket upgrade and, once the client sends a frame, 1 byte of a 100-byte
    frame and nothing more; closes the socket at the client's close frame and sets ``cut``."""
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        begun = False
        head = await reader.readuntil(b"\r\n\r\n")
        key = next(
            line.split(b":", 1)[1].strip()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        accept = base64.b64encode(
            hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()
        )
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:  # the client's frames (its Gotalk version...) until its close
                first, second = await reader.readexactly(2)
                size = second & 0x7F
                if size >= 126:
                    size = int.from_bytes(await reader.readexactly(2 if size == 126 else 8))
                await reader.readexactly(4 + size)  # mask and payload
                if first & 0x0F == 0x8:
                    break
                if not begun:  # once the client speaks: a frame begun, never ended
                    begun = True
                    writer.write(bytes([0x82, 100]) + b"x")  # binary, 100 bytes: 1 sent
        cut.set()
        writer.transport.abort()

    return await asyncio.start_server(handle, "127.0.0.1", 0), writers


async def test_a_websocket_cut_by_our_input_rate_limit_names_it() -> None:
    """32ec3ed says the reason names "the input-rate limit", and docs/reconnect.md that the
    transition names the limit that cut it. Over WebSocket that limit is the transport's
    (transports/ws_input_rate.py fails the connection with 1008 "input too slow") and never
    reaches ``Peer.abort``: ``gave_up`` stays None and the transition says only
    "WebSocket closed: no close frame", as if the server had vanished. (The WebSocket
    keepalive's 1011 "keepalive ping timeout" takes the same path.)"""
    cut = asyncio.Event()
    listener, writers = await _partial_frame_server(cut)
    port = listener.sockets[0].getsockname()[1]
    record = Recorder()
    options = rpc.Options(min_receive_rate=1000.0, receive_grace=0.2, handshake_timeout=30)
    try:
        client = await rpc.connect(
            f"ws+gotalk://127.0.0.1:{port}/", reconnect=FAST, on_state=record, options=options
        )
        first = client.connection
        assert first is not None
        try:
            await asyncio.wait_for(cut.wait(), 10)
            await wait_until(lambda: RECONNECTING in record.states(), 10)
            drop = next(t for _, t in record.seen if t.state is RECONNECTING)
            assert drop.error is not None
            assert "too slow" in drop.error or "min_receive_rate" in drop.error, drop.error
            assert first.gave_up is not None  # "why this side cut the connection"
        finally:
            await client.close(drain_timeout=0.1)
    finally:
        for writer in writers:
            writer.transport.abort()
        listener.close()


# --- 8fc8782: `peerwire serve` stops ---------------------------------------------------------


class Served:
    """``peerwire serve MODULE`` with unbuffered pipes read through select (no pump thread,
    so its stdout can be closed under it)."""

    def __init__(self, module: Path, loop: str) -> None:
        self.process = subprocess.Popen(
            [
                *PEERWIRE,
                "serve",
                str(module),
                "--loop",
                loop,
                f"--drain-timeout={DRAIN}",
                "--listen",
                LISTEN,
            ],
            cwd=ROOT,
            # stdout block-buffered into a pipe, as a service manager runs it by default
            env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
        )
        self.text = {"stdout": b"", "stderr": b""}

    def wait_for(self, name: str, needle: bytes, timeout: float = 20) -> bytes:
        """The first line of ``name`` containing ``needle``."""
        stream = getattr(self.process, name)
        deadline = time.monotonic() + timeout
        while True:
            for line in self.text[name].split(b"\n")[:-1]:  # whole lines only
                if needle in line:
                    return line
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {needle!r} on {name}: {self.text}")
            ready, _, _ = select.select([stream], [], [], left)
            if ready:
                chunk = os.read(stream.fileno(), 65536)
                if not chunk:
                    raise AssertionError(f"{name} ended without {needle!r}: {self.text}")
                self.text[name] += chunk

    def exit_code(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for name in ("stdout", "stderr"):
            stream = getattr(self.process, name)
            if stream is not None and not stream.closed:
                self.text[name] += stream.read()  # what is left (it has ended)
                stream.close()


async def _sigterm_with_a_call_in_flight(
    module: Path, op: str, loop: str, *, close_stdout: bool = False
) -> tuple[int | None, float, Served]:
    server = Served(module, loop)
    try:
        url = server.wait_for("stdout", b"listening on ").split()[-1].decode()
        if close_stdout:  # whoever read its output went away (a log pipe restarted)
            server.process.stdout.close()  # type: ignore[union-attr]
        peer = await rpc.connect(url, reconnect=False)
        call = asyncio.ensure_future(peer.request(op, None, timeout=60))
        await asyncio.to_thread(server.wait_for, "stderr", b"started")
        began = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(server.exit_code, EXIT_BOUND)
        took = time.monotonic() - began
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        peer.abort()
        return code, took, server
    except BaseException:
        server.kill()
        raise


SERVE_LOOPS = pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
"""The served process's loop (the tests' own is ``--loop``'s; uvloop comes with the test
extra: its absence fails, not skips)."""


def _module(directory: Path, body: str) -> Path:
    """test_service_hunt's module, with concurrent.futures and threading imported."""
    return write_module(directory, "import concurrent.futures\nimport threading\n\n" + body)


@SERVE_LOOPS
async def test_serve_exits_when_a_handler_waits_on_a_pool_of_its_own(
    tmp_path: Path, loop: str
) -> None:
    """docs/cli.md (8fc8782): what handlers leave running once the servers closed, "a
    thread it waits on", gets STOP_GRACE, "then the process exits anyway". The watchdog is
    cancelled as soon as the loop closes, but the interpreter's exit then joins every
    ThreadPoolExecutor's threads (concurrent.futures' exit hook) and every non-daemon
    thread, without bound: a handler awaiting ``run_in_executor`` on a pool of its own
    held the process for the thread's whole run (60 s here; for good for a loop)."""
    module = _module(
        tmp_path,
        "POOL = concurrent.futures.ThreadPoolExecutor(1)\n\n"
        "@registry.handle('pooled')\n"
        "async def pooled(_):\n"
        "    print('started', file=sys.stderr, flush=True)\n"
        "    await asyncio.get_running_loop().run_in_executor(POOL, time.sleep, 60)\n",
    )
    code, took, server = await _sigterm_with_a_call_in_flight(module, "pooled", loop)
    server.kill()
    assert code is not None, f"still running {took:.1f} s after SIGTERM: {server.text}"


@SERVE_LOOPS
async def test_serve_watchdog_exits_when_stdout_is_gone(tmp_path: Path, loop: str) -> None:
    """The watchdog's ``_exit_now`` flushes stdout before ``os._exit``; a flush that fails
    (the reader of stdout gone: BrokenPipeError on what a handler printed unflushed) ends
    the watchdog's thread with a traceback instead of the process, which then runs on with
    the stuck handler (60 s here; for good for a loop). The second-signal path calls the
    same function on the loop."""
    module = _module(
        tmp_path,
        stubborn(
            "print('some output')  # buffered: stdout is a pipe",
            "print('started', file=sys.stderr, flush=True)",
        ),
    )
    code, took, server = await _sigterm_with_a_call_in_flight(
        module, "stubborn", loop, close_stdout=True
    )
    server.kill()
    assert code is not None, f"still running {took:.1f} s after SIGTERM: {server.text}"
