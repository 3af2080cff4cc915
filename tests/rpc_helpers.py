"""Helpers for RPC tests: real servers and clients on 127.0.0.1, port 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

import rpc
from rpc import loops

# (server scheme, client query) for every protocol flavour the core speaks
FLAVOURS = {
    "gotalk": ("tcp+gotalk", ""),
    "chatter-current": ("tcp+sbs", "?dialect=HatChatter"),
    "chatter-legacy": ("tcp+sbs", "?dialect=Hat"),
}


@contextlib.contextmanager
def served_on_thread(
    registry: rpc.Registry, url: str = "tcp+gotalk://127.0.0.1:0"
) -> Iterator[tuple[str, asyncio.AbstractEventLoop, rpc.Server]]:
    """A server on a loop thread of its own (the blocking client and the CLI run theirs):
    its URL, loop and server; stopped, and its thread joined, at the block's end."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        state["loop"] = asyncio.get_running_loop()
        state["stop"] = stop = asyncio.Event()
        async with rpc.serve(url, registry=registry) as server:
            state["url"], state["server"] = str(server.url), server
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loops.run, args=(main(),))
    thread.start()
    assert ready.wait(10)
    try:
        yield state["url"], state["loop"], state["server"]
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(10)
    assert not thread.is_alive()


@contextlib.asynccontextmanager
async def in_background(coro: Coroutine[Any, Any, Any]) -> AsyncIterator[None]:
    """Run ``coro`` as a task while the block runs; cancelled, and awaited, at its end."""
    task = asyncio.ensure_future(coro)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def served(
    flavour: str,
    registry: rpc.Registry,
    *,
    client_registry: rpc.Registry | None = None,
    options: rpc.Options | None = None,
    client_options: rpc.Options | None = None,
    **protocol_options: Any,
) -> AsyncIterator[tuple[rpc.Server, rpc.Peer]]:
    scheme, query = FLAVOURS[flavour]
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0", registry=registry, options=options, **protocol_options
    ) as server:
        url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
        async with rpc.connect(
            url,
            registry=client_registry or rpc.Registry(),
            options=client_options,
            reconnect=False,  # one connection's Peer: these tests look at its state
            **protocol_options,
        ) as peer:
            yield server, peer


async def wait_until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    """Poll ``predicate`` every 5 ms until it holds; TimeoutError after ``timeout`` s.
    The one poll-until helper of the tests (for state no event announces)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def gotalk_connection(
    port: int,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A raw TCP connection to a Gotalk server on 127.0.0.1 that has sent its version and
    read the server's (``01`` both); closed when the block ends."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"01")
        assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
        yield reader, writer
    finally:
        writer.close()


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports of 127.0.0.1 free now: all bound at once, then released
    (ports taken one at a time may repeat: a Spark worker's UI then took the master's, and
    a gossip frame naming one twice is refused)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


TCP_URLS = {
    "gotalk": "tcp+gotalk://127.0.0.1:0",
    "chatter": "tcp+sbs://127.0.0.1:0?dialect=HatChatter",
}
"""A server URL of each wire format over plain TCP on a free port."""


def echo_registry() -> rpc.Registry:
    """``echo`` (any value back) and ``big`` (``size`` bytes of ``x``)."""
    reg = rpc.Registry()

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    @reg.handle("big")
    def big(size: int) -> bytes:
        return b"x" * size

    return reg


def gotalk_peer_registry() -> rpc.Registry:
    """The ops of the reference gotalk-peer the transcripts were captured from.

    ``echo`` (raw), ``greet``, ``fail``, ``notifyme`` (a notification, then "ok"), ``sleep``
    and ``stream`` (parts echoed); tests add or replace ops on the registry they get.
    """
    reg = rpc.Registry()

    @reg.handle("echo")
    def echo(data: bytes) -> bytes:
        return data

    @reg.handle("greet")
    def greet(params: dict) -> dict:
        return {"greeting": f"Hello {params['name']}"}

    @reg.handle("fail")
    def fail(_data: bytes) -> None:
        raise RuntimeError("something went wrong")

    @reg.handle("notifyme")
    def notifyme(data: bytes) -> str:
        rpc.current_peer.get().notify("note", data)
        return "ok"

    @reg.handle("sleep")
    async def sleep(params: dict) -> dict:
        await asyncio.sleep(params["ms"] / 1000)
        return {"slept": params["ms"]}

    @reg.handle_stream("stream")
    async def stream(parts: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for part in parts:
            yield part

    return reg


def timing_registry() -> rpc.Registry:
    """Handlers that tell what deadline they got: ``left`` (the caller's time left, None
    without one), ``left_parts`` (the same as a streamed result), ``hang`` (until its bound
    cancels it) and the plain function ``echo``."""
    reg = rpc.Registry()

    @reg.handle("left")
    async def left(_: Any = None) -> float | None:
        call = rpc.current_call.get(None)  # set for async handlers given a deadline
        return None if call is None else call.time_left()

    @reg.handle("left_parts")
    async def left_parts(_: Any = None) -> Any:
        call = rpc.current_call.get(None)
        yield None if call is None else call.time_left()

    @reg.handle("hang")
    async def hang(_: Any = None) -> None:
        await asyncio.Event().wait()  # until its bound cancels it

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    return reg


def child_report(script: str, loop: str, *args: str) -> dict[str, Any]:
    """Run ``script`` (Python source) in a child process on ``loop`` (``$PEERWIRE_LOOP``)
    with ``args``; the last line of its stdout that is a JSON object (its report). A child
    keeps what the script does to its loops and threads out of the test process."""
    if loop == "uvloop" and not loops.uvloop_installed():
        pytest.fail("uvloop is not installed (the test extra installs it)")
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, **{loops.ENV_VAR: loop, "PYTHONPATH": str(root)})
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    report: dict[str, Any] = json.loads(lines[-1])
    return report
