"""The blocking facade, used from plain threads against a real server."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import rpc


def test_blocking_client_from_threads() -> None:
    reg = rpc.Registry()

    @reg.handle("square")
    def square(n: int) -> int:
        return n * n

    @reg.handle("count")
    async def count(n: int):
        for i in range(n):
            yield i

    ready = threading.Event()
    state: dict = {}

    def server_thread() -> None:
        async def main() -> None:
            state["loop"] = asyncio.get_running_loop()
            state["stop"] = stop = asyncio.Event()
            async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg) as server:
                state["port"] = server.url.port
                ready.set()
                await stop.wait()

        asyncio.run(main())

    thread = threading.Thread(target=server_thread)
    thread.start()
    assert ready.wait(10)
    try:
        with rpc.blocking.connect(f"tcp+gotalk://127.0.0.1:{state['port']}") as peer:
            assert peer.request("square", 7) == 49
            assert list(peer.stream("count", value=3)) == [0, 1, 2]
            with ThreadPoolExecutor(8) as pool:
                squares = list(pool.map(lambda n: peer.request("square", n), range(40)))
            assert squares == [n * n for n in range(40)]
            with pytest.raises(rpc.RemoteError, match="unknown operation"):
                peer.request("missing")
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(10)
    assert not thread.is_alive()
