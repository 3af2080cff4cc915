"""The reconnecting client hands calls straight to a connection that has answered: a
request or a stream is then the connection's own coroutine or generator, with the same
results and errors, while the first call, idempotent requests and calls after a drop take
the client's path (probe, resend, waiting for the new connection)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from tests.certs import Pki
from tests.reconnect_helpers import FAST, OPEN, named, serve
from tests.rpc_helpers import wait_until


@pytest.mark.parametrize("scheme", ["tcp+gotalk", "tcp+sbs"])
async def test_requests_on_an_answering_connection_go_straight_to_it(scheme: str, pki: Pki) -> None:
    """Once the connection has answered, a request that is not idempotent is the
    connection's own coroutine (no frame of the client's), with the same results and
    errors; the first request, idempotent ones and requests after a drop take the
    client's path (probe, resend, waiting for the new connection)."""
    reg = named("a")

    @reg.handle("fail")
    def fail(_value: Any) -> None:
        raise ValueError("no")

    release = asyncio.Event()

    @reg.handle("slow")
    async def slow(_value: Any) -> None:
        await release.wait()  # legacy Chatter has no cancellation: freed below

    server = await serve(scheme, reg, pki)
    port = server.url.port
    try:
        async with rpc.connect(f"{scheme}://127.0.0.1:{port}", reconnect=FAST) as client:
            first = client.request("who")
            assert first.cr_code.co_qualname == "ReconnectingPeer._request"  # the probe
            assert await first == "a"
            direct = client.request("who")
            assert direct.cr_code.co_qualname == "Caller.request"
            assert await direct == "a"
            with pytest.raises(rpc.RemoteError, match="no"):
                await client.request("fail")
            with pytest.raises(rpc.RequestTimeout, match=r"slow: no result within 0\.2 s"):
                await client.request("slow", timeout=0.2)
            release.set()
            idempotent = client.request("who", idempotent=True)
            assert idempotent.cr_code.co_qualname == "ReconnectingPeer._request"
            assert await idempotent == "a"

            await server.close()
            await wait_until(lambda: client.connection_state is not OPEN)
            after_drop = client.request("who", timeout=10)
            assert after_drop.cr_code.co_qualname == "ReconnectingPeer._request"
            server = await serve(scheme, named("b"), pki, port)
            assert await after_drop == "b"  # waited for the new connection
    finally:
        await server.close()


@pytest.mark.parametrize("scheme", ["tcp+gotalk", "tcp+sbs"])
async def test_streams_on_an_answering_connection_go_straight_to_it(scheme: str, pki: Pki) -> None:
    """As requests do: once the connection has answered, a stream is the connection's own
    generator (no generator of the client's for every result to pass through), with the
    same results and errors (one created before a drop and read after it raises
    ConnectionClosed); the first stream, and streams after a drop, take the client's path,
    which waits for the new connection."""

    def counting(name: str) -> rpc.Registry:
        reg = named(name)

        @reg.handle("count")
        async def count(n: int) -> AsyncIterator[str]:
            for i in range(n):
                yield f"{name}{i}"

        @reg.handle("broken")
        async def broken(_value: Any) -> AsyncIterator[str]:
            yield "first"
            raise ValueError("stream broke")

        return reg

    server = await serve(scheme, counting("a"), pki)
    port = server.url.port
    try:
        async with rpc.connect(f"{scheme}://127.0.0.1:{port}", reconnect=FAST) as client:
            first = client.stream("count", value=2)
            assert first.ag_code.co_qualname == "ReconnectingPeer._stream"
            assert [x async for x in first] == ["a0", "a1"]
            direct = client.stream("count", value=2)
            assert direct.ag_code.co_qualname == "Caller.stream"
            assert [x async for x in direct] == ["a0", "a1"]
            seen = []
            with pytest.raises(rpc.RemoteError, match="stream broke"):
                async for x in client.stream("broken"):
                    seen.append(x)
            assert seen == ["first"]

            created = client.stream("count", value=1)  # the connection's own, not yet read
            await server.close()
            await wait_until(lambda: client.connection_state is not OPEN)
            with pytest.raises(rpc.ConnectionClosed):  # as a request made then would
                async for _ in created:
                    pass
            after_drop = client.stream("count", value=1, timeout=10)
            assert after_drop.ag_code.co_qualname == "ReconnectingPeer._stream"
            server = await serve(scheme, counting("b"), pki, port)
            assert [x async for x in after_drop] == ["b0"]  # waited for the new connection
    finally:
        await server.close()
