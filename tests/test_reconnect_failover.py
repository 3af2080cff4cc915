"""The reconnecting client (rpc.reconnect) over several URLs and against dead peers:
failover (in order and shuffled, and what it logs), a black-holed connection replaced, a
stalled server given up for the next URL. Split from test_reconnect.py, whose docstring
says how these tests are set up.
"""

from __future__ import annotations

import logging
import re

import pytest

import rpc
from rpc.reconnect import ConnectionState
from tests.certs import Pki
from tests.peers.eventer_helpers import free_port
from tests.reconnect_helpers import (
    FAST,
    OPEN,
    RECONNECTING,
    Recorder,
    contexts,
    named,
    serve,
)
from tests.tcp_proxy import Proxy

SCHEMES = ["tcp+gotalk", "ssl+gotalk", "ws+gotalk", "tcp+sbs", "ssl+sbs", "ws+sbs"]


# --- failover -------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_failover_between_urls(scheme: str, pki: Pki) -> None:
    _, client_ctx = contexts(pki, scheme)
    a = await serve(scheme, named("a"), pki)
    b = await serve(scheme, named("b"), pki)
    port_a = a.url.port
    record = Recorder()
    try:
        client = await rpc.connect(
            [str(a.url), str(b.url)], ssl=client_ctx, reconnect=FAST, on_state=record
        )
        assert await client.request("who") == "a"
        await a.close(drain_timeout=0)
        assert await client.request("who", timeout=5) == "b"  # waits for the failover
        assert client.url == str(b.url)
        a = await serve(scheme, named("a"), pki, port_a)
        await b.close(drain_timeout=0)
        assert await client.request("who", timeout=5) == "a"  # round-robin: back to a
        assert [t.url for _, t in record.seen if t.state is OPEN] == [
            str(a.url),
            str(b.url),
            str(a.url),
        ]
        await client.close()
    finally:
        await a.close(drain_timeout=0)
        await b.close(drain_timeout=0)


async def test_a_failover_logs_the_url_lost_and_the_url_tried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The line of a drop names the URL that was lost, then the next one tried. Before, it
    said the next one was lost (the transition's ``url``), sending operators to the healthy
    server."""
    caplog.set_level(logging.INFO, "peerwire.rpc")
    a = await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("a"))
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("b")) as b:
        try:
            async with rpc.connect([str(a.url), str(b.url)], reconnect=FAST) as client:
                assert await client.request("who") == "a"
                await a.close(drain_timeout=0)
                assert await client.request("who", timeout=5) == "b"
        finally:
            await a.close(drain_timeout=0)
    lines = [r.getMessage() for r in caplog.records if r.name == "peerwire.rpc"]
    lost = [line for line in lines if line.startswith("connection lost: ")]
    assert lost and lost[0].startswith(f"connection lost: {a.url}: ")
    assert f"; reconnecting to {b.url} in " in lost[0]


async def test_shuffled_failover_tries_the_urls_in_random_orders(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = [f"tcp+gotalk://127.0.0.1:{free_port()}" for _ in range(2)]
    caplog.set_level(logging.INFO, "peerwire.rpc")
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("live")) as server:
        live = str(server.url)
        firsts = set()
        for _ in range(12):
            caplog.clear()
            policy = rpc.Reconnect(shuffle=True)
            async with rpc.connect([*dead, live], reconnect=policy) as client:
                assert await client.request("who") == "live"
            tried = [
                u
                for r in caplog.records
                for u in dead
                if r.getMessage().startswith(f"cannot connect to {u}")
            ]
            firsts.add(tried[0] if tried else live)
        assert len(firsts) >= 2  # in order, the first would always be dead[0]


async def test_no_url_answers_at_first_connect() -> None:
    dead = [f"tcp+sbs://127.0.0.1:{free_port()}" for _ in range(2)]
    with pytest.raises(rpc.ConnectionClosed, match=re.escape(f"cannot connect to {dead[1]}")):
        await rpc.connect(dead)
    with pytest.raises(ValueError, match="one protocol"):
        await rpc.connect(["tcp+sbs://127.0.0.1:1", "tcp+gotalk://127.0.0.1:1"])


# --- dead peers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scheme", "liveness"),
    [
        ("tcp+gotalk", {"heartbeat_interval": 0.05, "read_timeout": 0.3}),
        ("tcp+sbs", {"ping_interval": 0.1, "ping_timeout": 0.2}),
    ],
)
async def test_a_black_holed_connection_is_detected_and_replaced(
    scheme: str, liveness: dict[str, float]
) -> None:
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=named("s"), **liveness) as server:
        async with Proxy(server.url.port) as proxy:
            record = Recorder()
            url = f"{scheme}://127.0.0.1:{proxy.port}"
            async with rpc.connect(url, reconnect=FAST, on_state=record, **liveness) as client:
                assert await client.request("who") == "s"
                proxy.black_hole()  # open, but nothing gets through any more
                assert await client.request("who", timeout=10, idempotent=True) == "s"
                assert client.connects == 2
                assert len(proxy.accepted) == 2
                assert record.states() == [ConnectionState.CONNECTING, OPEN, RECONNECTING, OPEN]


@pytest.mark.parametrize("scheme", ["tcp+gotalk", "ssl+gotalk", "ws+gotalk", "tcp+sbs"])
async def test_a_stalled_server_is_given_up_for_the_next_url(scheme: str, pki: Pki) -> None:
    """The first URL accepts connections and never answers: a Gotalk TCP connection is
    closed by the handshake limit (no version from the server), a Chatter one by its
    unanswered ping, a TLS or WebSocket one never completes (connect_timeout); either way
    the client moves on to the second URL."""
    liveness = {"ping_interval": 0.1, "ping_timeout": 0.2} if "sbs" in scheme else {}
    _, client_ctx = contexts(pki, scheme)
    live = await serve(scheme, named("live"), pki)
    try:
        async with Proxy(live.url.port) as proxy:
            proxy.stall()
            stalled = str(live.url.with_port(proxy.port))
            async with rpc.connect(
                [stalled, str(live.url)],
                ssl=client_ctx,
                reconnect=FAST,
                connect_timeout=0.3,
                options=rpc.Options(handshake_timeout=0.3),
                **liveness,
            ) as client:
                assert await client.request("who", timeout=10, idempotent=True) == "live"
                assert client.url == str(live.url)
                assert proxy.accepted
    finally:
        await live.close(drain_timeout=0)
