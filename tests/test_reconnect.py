"""The reconnecting client (rpc.reconnect): back-off, transitions, restarts (failover and
dead peers: test_reconnect_failover.py).

Real servers on 127.0.0.1; :mod:`tests.tcp_proxy` stands between client and server where a
connection must be dropped, stalled or black-holed. Back-off bases of 10-20 ms keep every
wait short; waits are checked against the bounds the client announced, never slept on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import rpc
from rpc import eventer
from rpc.reconnect import ConnectionState, Transition
from tests.certs import Pki
from tests.peers.eventer_helpers import free_port, json_event, running_server, url_of
from tests.reconnect_helpers import (
    CLOSED,
    FAST,
    OPEN,
    RECONNECTING,
    Recorder,
    contexts,
    named,
    open_peers,
    serve,
)
from tests.rpc_helpers import wait_until
from tests.tcp_proxy import Proxy

SCHEMES = ["tcp+gotalk", "ssl+gotalk", "ws+gotalk", "tcp+sbs", "ssl+sbs", "ws+sbs"]


# --- back-off -------------------------------------------------------------------------------


def test_backoff_bounds_and_full_jitter() -> None:
    backoff = rpc.Backoff(base=0.1, cap=5.0)
    assert [backoff.ceiling(n) for n in range(8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert backoff.ceiling(100_000) == 5.0  # no overflow for a long outage
    rng = random.Random(7)
    for attempt in range(10):
        ceiling = backoff.ceiling(attempt)
        waits = [backoff.delay(attempt, rng) for _ in range(500)]
        assert all(0.0 <= w <= ceiling for w in waits)
        # full jitter: spread over the whole range, not bunched at the ceiling
        assert min(waits) < 0.05 * ceiling and max(waits) > 0.95 * ceiling
        assert 0.4 * ceiling < sum(waits) / len(waits) < 0.6 * ceiling
    with pytest.raises(ValueError):
        rpc.Backoff(base=-1.0)
    for zero in ({"base": 0.0}, {"cap": 0.0}):  # a retry at once for good: refused
        with pytest.raises(ValueError, match="positive"):
            rpc.Reconnect(backoff=rpc.Backoff(**zero))
    with pytest.raises(ValueError):
        rpc.Reconnect(attempts=-1)


async def test_waits_between_attempts_keep_to_the_backoff_and_the_attempt_limit() -> None:
    """A server that accepts and closes at once (a restarting peer behind a proxy): every
    such connection counts as a failed attempt, the waits grow within their bounds, and
    the client closes after ``attempts``."""
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("a")) as server:
        async with Proxy(server.url.port) as proxy:
            record = Recorder()
            policy = rpc.Reconnect(backoff=rpc.Backoff(base=0.02, cap=0.16), attempts=6)
            client = await rpc.connect(
                f"tcp+gotalk://127.0.0.1:{proxy.port}", reconnect=policy, on_state=record
            )
            assert await client.request("who") == "a"
            proxy.refuse()
            proxy.drop()
            async with asyncio.timeout(10):
                result = await client.closed
            assert isinstance(result, rpc.ConnectionClosed)
            assert "gave up after 6 attempts" in str(result)
            rounds = [(at, t) for at, t in record.seen if t.state is RECONNECTING]
            assert len(rounds) == 6
            attempts = proxy.accepted[1:]  # after the first, proven connection
            assert len(attempts) == 6
            for n, ((emitted, transition), attempted) in enumerate(
                zip(rounds, attempts, strict=True)
            ):
                assert transition.wait is not None
                assert 0.0 <= transition.wait <= min(0.16, 0.02 * 2**n)
                assert transition.failures == n
                assert attempted - emitted >= transition.wait - 0.002  # it did wait
            assert record.states()[-1] is CLOSED
            assert client.connection_state is CLOSED
            with pytest.raises(rpc.ConnectionClosed, match="closed"):
                await client.request("who", timeout=1)


async def test_requests_made_while_disconnected_wait_within_their_timeout() -> None:
    calls: Counter[int] = Counter()
    reg = rpc.Registry()

    @reg.handle("count")
    def count(i: int) -> int:
        calls[i] += 1
        return i

    server = await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg)
    url = str(server.url)
    record = Recorder()
    async with rpc.connect(url, reconnect=FAST, on_state=record) as client:
        assert await client.request("count", 0) == 0
        await server.close()  # the port refuses connections until the server is back
        await wait_until(lambda: client.connection_state is RECONNECTING)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(rpc.RequestTimeout, match=r"not connected within 0\.2 s"):
            await client.request("count", 1, timeout=0.2)
        assert loop.time() - started >= 0.199  # uvloop's timers may fire up to 1 ms early
        with pytest.raises(rpc.ConnectionClosed, match="not connected"):
            client.notify("note")
        waiting = asyncio.create_task(client.request("count", 2, timeout=10))
        rounds = len(record.seen)
        await wait_until(lambda: len(record.seen) >= rounds + 2)  # refused meanwhile
        assert not waiting.done()
        server = await rpc.serve(url, registry=reg)
        try:
            assert await waiting == 2
            assert client.connection_state is OPEN
        finally:
            await server.close()
    assert calls == {0: 1, 2: 1}  # the timed-out request never went out


async def test_in_flight_requests_fail_unless_idempotent() -> None:
    calls: Counter[str] = Counter()
    held = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(name: str) -> str:
        calls[name] += 1
        if calls[name] == 1:
            await held.wait()  # the first run of each is in flight when the connection drops
        return name

    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=reg) as server:
        async with Proxy(server.url.port) as proxy:
            async with rpc.connect(f"tcp+sbs://127.0.0.1:{proxy.port}", reconnect=FAST) as client:
                once = asyncio.create_task(client.request("hold", "once"))
                again = asyncio.create_task(client.request("hold", "again", idempotent=True))
                await wait_until(lambda: calls == {"once": 1, "again": 1})
                proxy.drop()
                with pytest.raises(rpc.ConnectionClosed):
                    await once
                assert await asyncio.wait_for(again, 5) == "again"
                assert client.connects == 2
    assert calls == {"once": 1, "again": 2}


async def test_handlers_of_the_client_are_served_again_after_a_reconnect() -> None:
    client_reg = rpc.Registry()

    @client_reg.handle("client_name")
    def client_name(_value: Any) -> str:
        return "the client"

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("s")) as server:
        async with Proxy(server.url.port) as proxy:
            url = f"tcp+gotalk://127.0.0.1:{proxy.port}"
            async with rpc.connect(url, registry=client_reg, reconnect=FAST) as client:
                await wait_until(lambda: open_peers(server) == 1)  # the proxy connects too
                [first] = server.peers
                assert await first.request("client_name") == "the client"
                proxy.drop()
                await wait_until(lambda: client.connects == 2 and open_peers(server) == 1)
                [second] = server.peers
                assert second is not first
                assert await second.request("client_name") == "the client"
                assert client.registry is client_reg


async def test_transitions_iterator_and_state_names() -> None:
    assert [s.value for s in ConnectionState] == ["connecting", "open", "reconnecting", "closed"]
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("s")) as server:
        async with Proxy(server.url.port) as proxy:
            client = await rpc.connect(f"tcp+gotalk://127.0.0.1:{proxy.port}", reconnect=FAST)
            changes = client.transitions()

            async def collect() -> list[Transition]:
                return [t async for t in changes]

            collected = asyncio.create_task(collect())
            assert await client.request("who") == "s"
            proxy.drop()
            await wait_until(lambda: client.connects == 2)
            await client.close()
            seen = await asyncio.wait_for(collected, 5)  # ends with closed
            states = [t.state for t in seen]
            assert states[0] is RECONNECTING
            assert states[-2:] == [OPEN, CLOSED]
            assert seen[0].error and seen[0].wait is not None
            assert all(t.url == f"tcp+gotalk://127.0.0.1:{proxy.port}" for t in seen)
            assert [t async for t in client.transitions()][-1].state is CLOSED  # at once


async def test_a_client_closed_by_its_on_connect_while_reconnecting_stays_closed() -> None:
    """``close()`` from ``on_connect`` on a reconnect: that connection is closed, the client
    stays closed and stops reconnecting. Before, the connection opened anyway after the
    close (state ``closed`` then ``open``) and was never freed, nor was the client's task."""
    connections = 0
    clients: list[rpc.ReconnectingPeer] = []

    async def on_connect(peer: rpc.Peer) -> None:
        nonlocal connections
        connections += 1
        if connections == 2:
            await clients[0].close()

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("s")) as server:
        async with Proxy(server.url.port) as proxy:
            url = f"tcp+gotalk://127.0.0.1:{proxy.port}"
            client = await rpc.connect(url, reconnect=FAST, on_connect=on_connect)
            clients.append(client)
            assert await client.request("who") == "s"
            proxy.drop()
            task = client._task
            assert task is not None
            await asyncio.wait_for(asyncio.wait([task]), 5)  # reconnecting stopped
            assert connections == 2
            assert client.connection_state is CLOSED
            assert client.connection is None
            with pytest.raises(rpc.ConnectionClosed):
                await client.request("who", timeout=1)
            await wait_until(lambda: not server.peers)


async def test_transitions_are_logged_with_address_and_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "peerwire.rpc")
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("s")) as server:
        async with Proxy(server.url.port) as proxy:
            url = f"tcp+gotalk://127.0.0.1:{proxy.port}"
            async with rpc.connect(url, reconnect=FAST) as client:
                assert await client.request("who") == "s"  # a connection that worked
                proxy.drop()
                await wait_until(lambda: client.connects == 2)
    lines = [r.getMessage() for r in caplog.records if r.name == "peerwire.rpc"]
    assert f"connecting to {url}" in lines
    assert any(line.startswith(f"connection lost: {url}: ") for line in lines)
    assert any(f"; reconnecting to {url} in 0.0" in line and line.endswith(" s") for line in lines)
    assert lines.count(f"connected to {url}") == 2
    assert lines[-1] == f"connection to {url} closed"


# --- a server restarted under a steady stream of requests ------------------------------------


class Work:
    """The server side of the steady stream: how often each request ran; a gate that
    holds every handler while closed."""

    def __init__(self) -> None:
        self.runs: Counter[int] = Counter()
        self.inside = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.registry = rpc.Registry()
        self.registry.handle("work")(self.work)

    async def work(self, i: int) -> int:
        self.runs[i] += 1
        self.inside += 1
        try:
            await self.gate.wait()
        finally:
            self.inside -= 1
        return i


WORKERS = 4  # even ones send idempotent requests, odd ones not


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_client_recovers_from_a_server_restart(scheme: str, pki: Pki) -> None:
    _, client_ctx = contexts(pki, scheme)
    work = Work()
    server = await serve(scheme, work.registry, pki)
    port = server.url.port
    ids = itertools.count()
    idempotent: dict[int, bool] = {}
    outcomes: dict[int, Any] = {}
    stop = asyncio.Event()
    client = await rpc.connect(str(server.url), ssl=client_ctx, reconnect=FAST)

    async def worker(k: int) -> None:
        while not stop.is_set():
            i = next(ids)
            idempotent[i] = k % 2 == 0
            try:
                outcomes[i] = await client.request("work", i, timeout=10, idempotent=k % 2 == 0)
            except rpc.ConnectionClosed:
                outcomes[i] = "closed"  # reported to the caller: not lost silently

    def answered() -> int:
        return sum(1 for v in outcomes.values() if v != "closed")

    workers = [asyncio.create_task(worker(k)) for k in range(WORKERS)]
    try:
        await wait_until(lambda: answered() >= 20)
        work.gate.clear()
        await wait_until(lambda: work.inside == WORKERS)  # every worker has one in flight
        in_flight = [i for i in idempotent if i not in outcomes]
        await server.close(drain_timeout=0)  # killed: the handlers in flight are cancelled
        await wait_until(lambda: client.connection_state is RECONNECTING)
        work.gate.set()
        server = await serve(scheme, work.registry, pki, port)  # the same port
        before = answered()
        await wait_until(lambda: answered() >= before + 20, timeout=15)
        stop.set()
        async with asyncio.timeout(15):
            await asyncio.gather(*workers)
    finally:
        stop.set()
        for task in workers:
            task.cancel()
        await client.close()
        await server.close(drain_timeout=0)

    assert client.connects == 2
    assert sorted(outcomes) == sorted(idempotent)  # every request ended, one way or the other
    for i, outcome in outcomes.items():
        if outcome != "closed":
            assert outcome == i and work.runs[i] >= 1
        if not idempotent[i]:
            assert work.runs[i] <= 1, f"request {i} (not idempotent) ran {work.runs[i]} times"
        else:
            assert outcome == i  # idempotent ones are sent again, never failed
    assert len(in_flight) == WORKERS
    for i in in_flight:
        # in flight at the kill: the idempotent ones ran again, the others failed
        assert (work.runs[i], outcomes[i]) == ((2, i) if idempotent[i] else (1, "closed"))
    assert sum(1 for i, n in work.runs.items() if n > 1) == WORKERS // 2


async def test_blocking_client_recovers_from_a_server_restart(pki: Pki) -> None:
    server = await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("first"))
    port = server.url.port
    peer = await asyncio.to_thread(rpc.blocking.connect, str(server.url), reconnect=FAST)
    try:
        assert await asyncio.to_thread(peer.request, "who") == "first"
        await server.close(drain_timeout=0)
        await wait_until(lambda: peer.connection_state is RECONNECTING)
        server = await rpc.serve(f"tcp+gotalk://127.0.0.1:{port}", registry=named("second"))
        assert await asyncio.to_thread(peer.request, "who", timeout=5) == "second"
        assert peer.connection_state is OPEN
    finally:
        await asyncio.to_thread(peer.close)
        await server.close()
    assert peer.connection_state is CLOSED


# --- the Eventer client -------------------------------------------------------------------


async def test_eventer_client_resubscribes_after_a_server_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "peerwire.eventer.client")
    listen = [f"tcp+sbs://127.0.0.1:{free_port()}"]

    async def publish(server: Any, value: int) -> None:
        async with await eventer.connect(url_of(server), "pub") as pub:
            await pub.register([json_event(("a", "b"), value)], with_response=True)

    async def next_values(events: AsyncIterator[list[Any]]) -> list[Any]:
        return [e.payload.data for e in await asyncio.wait_for(anext(events), 5)]

    async with running_server(tmp_path, listen=listen) as server:
        client = await eventer.connect(
            url_of(server),
            "sub",
            subscriptions=[("a", "*")],
            reconnect=True,
            reconnect_delay=0.01,
            reconnect_max_delay=0.1,
        )
        events = client.events()
        await publish(server, 1)
        assert await next_values(events) == [1]
    assert client.connection is not None
    await wait_until(lambda: not client.is_connected)
    try:
        async with running_server(tmp_path, listen=listen) as server:
            await client.wait_connected(5)
            await publish(server, 2)  # reaches us only if we subscribed again
            assert await next_values(events) == [2]
            assert any("resubscribed to 1 event types" in r.getMessage() for r in caplog.records)
    finally:
        await client.close()
    assert client.closed.done()
