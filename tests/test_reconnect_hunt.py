"""Defects found in the reconnecting client (rpc.reconnect) under the conditions of real
deployments: each test fails on the code it was written against, and is bounded in time.

Real servers on 127.0.0.1, port 0; see test_reconnect.py for how these tests are set up.
"""

from __future__ import annotations

import asyncio

import pytest

import rpc
from tests.reconnect_helpers import CLOSED, FAST, RECONNECTING, Recorder, named
from tests.rpc_helpers import wait_until
from tests.tcp_proxy import Proxy


async def test_a_close_cancelled_while_it_drains_still_closes_the_client() -> None:
    """``close()`` waits up to ``drain_timeout`` for calls in flight; a caller that stops
    waiting (``asyncio.timeout``, a cancelled task, an interrupted blocking ``close()``)
    cancels it there. The client must still end up closed: its ``closed`` resolved, its
    state ``closed``, a second ``close()`` returning, later requests failing with
    ConnectionClosed. Before, none of that happened: ``_finish`` was never reached, so the
    second ``close()`` waited on ``closed`` for good and requests timed out "not connected
    (open)" instead."""
    entered = asyncio.Event()
    release = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(_value: object) -> str:
        entered.set()
        await release.wait()
        return "done"

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg) as server:
        client = await rpc.connect(str(server.url), reconnect=FAST)
        call = asyncio.create_task(client.request("hold", timeout=20))
        await asyncio.wait_for(entered.wait(), 5)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):  # close() drains the call in flight meanwhile
                await client.close()
        release.set()
        with pytest.raises(rpc.ConnectionClosed):
            await asyncio.wait_for(call, 5)  # the connection was closed under it
        await asyncio.wait_for(client.close(), 3)  # TimeoutError before: it never returned
        assert client.closed.done()
        assert client.connection_state is CLOSED
        with pytest.raises(rpc.ConnectionClosed):
            await client.request("hold", timeout=1)


@pytest.mark.parametrize(
    ("scheme", "serving", "liveness"),
    [  # the server beats often but gives up late: only the client's limit can cut it
        (
            "tcp+gotalk",
            {"heartbeat_interval": 0.05, "read_timeout": 30},
            {"heartbeat_interval": 0.05, "read_timeout": 0.3},
        ),
        ("tcp+sbs", {}, {"ping_interval": 0.1, "ping_timeout": 0.2}),
    ],
)
async def test_a_drop_by_a_liveness_limit_is_not_reported_as_closed_by_the_peer(
    scheme: str, serving: dict[str, float], liveness: dict[str, float]
) -> None:
    """A transition's ``error`` says "why the connection dropped" (and goes to the INFO log:
    "connection lost: <url>: <why>"). A connection the client gave up on because the server
    went silent (a peer that vanished without a FIN: its liveness limit) was reported as
    "closed by the peer", the opposite of what happened: the peer closed nothing, it is
    gone, and an operator reading the log looks for a server that closes connections."""
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=named("s"), **serving) as server:
        async with Proxy(server.url.port) as proxy:
            record = Recorder()
            url = f"{scheme}://127.0.0.1:{proxy.port}"
            async with rpc.connect(url, reconnect=FAST, on_state=record, **liveness) as client:
                assert await client.request("who") == "s"
                proxy.black_hole()  # open, but nothing gets through any more
                await wait_until(lambda: RECONNECTING in record.states())
                [drop] = [t for _, t in record.seen if t.state is RECONNECTING][:1]
                assert drop.error is not None
                assert "closed by the peer" not in drop.error, drop.error


async def test_a_gotalk_server_that_never_sends_its_version_is_not_said_to_have_closed() -> None:
    """A server that accepts and never answers is left by ``handshake_timeout`` (no Gotalk
    version). ``connect`` then said "the server closed the connection before its first
    byte: it may expect TLS on this port ... or it refused the connection": the client
    closed it, the server closed nothing, and the hint sends the reader the wrong way."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # held open, nothing sent

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        async with asyncio.timeout(5):
            with pytest.raises(rpc.ConnectionClosed) as failure:
                await rpc.connect(
                    f"tcp+gotalk://127.0.0.1:{port}",
                    options=rpc.Options(handshake_timeout=0.3),
                    connect_timeout=4,
                )
        assert accepted
        message = str(failure.value)
        assert "server closed the connection" not in message, message
    finally:
        for writer in accepted:
            writer.transport.abort()
        listener.close()
