"""Defects found in the blocking client (rpc.blocking) with a reconnecting peer: each test
fails on the code it was written against, and is bounded in time.

The server runs on a loop of its own thread (as in test_rpc_blocking.py); the blocking
client on rpc.blocking's background loop (uvloop with ``--loop uvloop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import rpc
from rpc.reconnect import ReconnectingPeer
from tests.reconnect_helpers import FAST, named


class Interrupted(BaseException):
    """What the test's signal handler raises in the main thread (as SIGINT's does)."""


@contextlib.contextmanager
def server_thread() -> Iterator[tuple[asyncio.AbstractEventLoop, rpc.Server]]:
    """A Gotalk server on 127.0.0.1, port 0, served by a loop in a thread of its own."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    def run() -> None:
        async def main() -> None:
            state["loop"] = asyncio.get_running_loop()
            state["stop"] = stop = asyncio.Event()
            async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("s")) as server:
                state["server"] = server
                ready.set()
                await stop.wait()

        asyncio.run(main())

    thread = threading.Thread(target=run)
    thread.start()
    assert ready.wait(10)
    try:
        yield state["loop"], state["server"]
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(10)
    assert not thread.is_alive()


def server_peers(loop: asyncio.AbstractEventLoop, server: rpc.Server) -> int:
    async def count() -> int:
        return len(server.peers)

    return asyncio.run_coroutine_threadsafe(count(), loop).result(5)


def close_stray_clients() -> None:
    """Close any reconnecting client left on the background loop (what the defect leaks),
    so that it does not reconnect through the following tests."""
    for obj in gc.get_objects():
        if isinstance(obj, ReconnectingPeer) and obj.loop.is_running() and not obj.closed.done():
            asyncio.run_coroutine_threadsafe(obj.close(), obj.loop).result(10)


def test_a_connect_interrupted_as_it_completes_leaves_no_client_behind() -> None:
    """A caller interrupted while it waits "cancels its call on the loop: nothing it
    started goes on in the background" (rpc.blocking). For ``connect`` the cancel is
    handed to the loop, and a connect that completes before it gets there (here: the
    interrupt lands while ``on_connect`` runs) returns its client into a future nobody
    reads. Before, that client stayed connected, and would reconnect for good, with no
    one able to close it."""
    main = threading.get_ident()
    interrupted = threading.Event()

    def on_connect(_peer: rpc.Peer) -> None:  # on the background loop's thread
        signal.pthread_kill(main, signal.SIGUSR1)
        assert interrupted.wait(5)  # the caller has given up (and cancelled) by now

    def raise_interrupted(_signum: int, _frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, raise_interrupted)
    try:
        with server_thread() as (loop, server):
            try:
                with pytest.raises(Interrupted):
                    try:
                        rpc.blocking.connect(str(server.url), reconnect=FAST, on_connect=on_connect)
                    finally:
                        interrupted.set()
                deadline = time.monotonic() + 3
                while server_peers(loop, server) and time.monotonic() < deadline:
                    time.sleep(0.005)  # a poll, as wait_until's: no event says it is gone
                assert server_peers(loop, server) == 0, "the interrupted connect's client lives"
            finally:
                close_stray_clients()
    finally:
        signal.signal(signal.SIGUSR1, previous)
