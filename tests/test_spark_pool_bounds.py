"""The Spark executors' connection pool is bounded: a Python worker (reused by Spark for task
after task) that calls many URLs keeps at most ``max_connections`` links, closing the least
recently used one with no call on it, and never one under a call. In this process, without
Spark, with real servers on 127.0.0.1 port 0 (like tests/test_spark_probe.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import rpc
from rpc.spark.pool import MAX_CONNECTIONS, PoolFull
from rpc.spark.reconnect import LoopErrors
from rpc.spark.worker import CallPolicy, ConnectionPool, Endpoint, Outcome, make_caller
from tests.rpc_helpers import wait_until

pytestmark = pytest.mark.timeout(30)


def gated_echo(gate: asyncio.Event) -> rpc.Registry:
    """``echo``, whose ``"wait"`` calls stay in flight until ``gate`` is set."""
    registry = rpc.Registry()

    @registry.handle("echo")
    async def echo(value: object) -> object:
        if value == "wait":
            await gate.wait()
        return value

    return registry


def reconnect_tasks() -> int:
    """Links' reconnect tasks on this loop (each ends once connected, cancelled on close)."""
    return sum(
        getattr(t.get_coro(), "__qualname__", "") == "Link._reconnect" for t in asyncio.all_tasks()
    )


async def test_calls_to_more_urls_than_the_bound_keep_max_connections_open() -> None:
    """A UDF per URL over a long-lived executor: each endpoint got a link, kept for the life
    of the process, connection and all (69 URLs: 69 connections). With the default bound,
    only the 64 most recently used stay open; the 5 least recently used are closed."""
    registry = gated_echo(asyncio.Event())
    pool = ConnectionPool(asyncio.get_running_loop(), LoopErrors())
    n = MAX_CONNECTIONS
    servers = [await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry) for _ in range(n + 5)]
    try:
        for i, server in enumerate(servers):
            call = make_caller(pool, Endpoint(str(server.url)), CallPolicy("echo", timeout=2.0))
            assert await call(i) == (i, None)
        with contextlib.suppress(TimeoutError):  # closing takes a loop turn or two
            await wait_until(lambda: sum(len(s.peers) for s in servers) <= n, timeout=1.0)
        open_at = [len(s.peers) for s in servers]
        assert open_at == [0] * 5 + [1] * n, open_at
        assert pool.connects == n + 5  # closed links' connections still counted
    finally:
        await pool.close()
        for server in servers:
            await server.close()
    assert reconnect_tasks() == 0


async def test_closing_a_link_ends_its_reconnect_task() -> None:
    """A link to a peer that is down goes on reconnecting (for up to 2 s after the last row
    asked); closed to make room, its reconnect task ends with it."""
    registry = gated_echo(asyncio.Event())
    pool = ConnectionPool(asyncio.get_running_loop(), LoopErrors())
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        down = Endpoint(f"tcp+gotalk://127.0.0.1:{unused.getsockname()[1]}", connect_timeout=1.0)
        servers = [await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry) for _ in range(2)]
        try:
            policy = CallPolicy("echo", timeout=1.0, retry_for=0.0, max_connections=2)
            result, error = await make_caller(pool, down, policy)(1)
            assert result is None and error is not None and "cannot connect" in error, error
            assert reconnect_tasks() == 1  # it keeps trying, as rows may come back to it
            for server in servers:
                assert await make_caller(pool, Endpoint(str(server.url)), policy)(2) == (2, None)
            with contextlib.suppress(TimeoutError):
                await wait_until(lambda: reconnect_tasks() == 0, timeout=1.0)
            assert reconnect_tasks() == 0
            assert len(pool) == 2
        finally:
            await pool.close()
            for server in servers:
                await server.close()


async def test_a_link_with_a_call_in_flight_is_not_closed_under_it() -> None:
    """With the pool full, a new URL closes the least recently used idle link, passing over
    an older one whose call is still in flight; that call is answered on its connection."""
    gate = asyncio.Event()
    registry = gated_echo(gate)
    pool = ConnectionPool(asyncio.get_running_loop(), LoopErrors())
    servers = [await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry) for _ in range(3)]
    busy, idle, new = servers
    policy = CallPolicy("echo", timeout=5.0, max_connections=2)

    def caller(server: rpc.Server) -> Callable[[Any], Awaitable[Outcome]]:
        return make_caller(pool, Endpoint(str(server.url)), policy)

    try:
        in_flight = asyncio.ensure_future(caller(busy)("wait"))
        await wait_until(lambda: len(busy.peers) == 1)  # its connection is up, its call out
        assert await caller(idle)(1) == (1, None)  # now the most recently used
        assert await caller(new)(2) == (2, None)  # room made: the idle one is closed
        with contextlib.suppress(TimeoutError):
            await wait_until(lambda: not idle.peers, timeout=1.0)
        assert (len(busy.peers), len(idle.peers), len(new.peers)) == (1, 0, 1)
        assert not in_flight.done()
        gate.set()
        assert await asyncio.wait_for(in_flight, 2.0) == ("wait", None)
    finally:
        gate.set()
        await pool.close()
        for server in servers:
            await server.close()


async def test_a_full_pool_of_busy_links_waits_for_room_then_fails_with_the_limit() -> None:
    """Every link has a call in flight: a row for a new URL waits for one to be given back
    within its retry_for (then it goes through), and fails with PoolFull, naming the limit,
    when none is (nothing sent); the busy link is never closed."""
    gate = asyncio.Event()
    registry = gated_echo(gate)
    pool = ConnectionPool(asyncio.get_running_loop(), LoopErrors())
    accepted: list[rpc.Peer] = []
    busy = await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry)
    other = await rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=registry, on_connect=accepted.append
    )
    policy = CallPolicy("echo", timeout=5.0, retry_for=0.2, max_connections=1)
    on_busy = make_caller(pool, Endpoint(str(busy.url)), policy)
    try:
        in_flight = asyncio.ensure_future(on_busy("wait"))
        await wait_until(lambda: len(busy.peers) == 1)
        started = asyncio.get_running_loop().time()
        result, error = await make_caller(pool, Endpoint(str(other.url)), policy)(1)
        waited = asyncio.get_running_loop().time() - started
        assert result is None and error is not None and error.startswith(PoolFull.__name__)
        assert "max_connections=1" in error, error
        assert 0.199 <= waited < 1.0, waited  # its retry_for (floating point aside)
        assert (len(busy.peers), len(accepted), in_flight.done()) == (1, 0, False)
        # a link given back while a row waits: the row goes through, after the busy call
        patient = dataclasses.replace(policy, retry_for=5.0)
        waiting = asyncio.ensure_future(make_caller(pool, Endpoint(str(other.url)), patient)(2))
        ended: list[str] = []
        in_flight.add_done_callback(lambda _: ended.append("in flight"))
        waiting.add_done_callback(lambda _: ended.append("waiting"))
        gate.set()
        assert await asyncio.wait_for(in_flight, 2.0) == ("wait", None)
        assert await asyncio.wait_for(waiting, 2.0) == (2, None)
        assert ended == ["in flight", "waiting"] and len(accepted) == 1
        with contextlib.suppress(TimeoutError):  # the busy one, idle now, made room
            await wait_until(lambda: not busy.peers, timeout=1.0)
        assert len(pool) == 1 and not busy.peers
    finally:
        gate.set()
        await pool.close()
        await busy.close()
        await other.close()


def test_max_connections_is_an_option_of_call_checked_when_built() -> None:
    """``CallOptions(max_connections=N)`` reaches the executors' calls; below 1 it fails on
    the driver, as the other bounds do."""
    from rpc import spark as pws
    from rpc.spark import udf

    with pytest.raises(ValueError, match="max_connections"):
        pws.CallOptions(max_connections=0)
    calls, _ = udf._setup("tcp+gotalk://127.0.0.1:1", "echo", pws.CallOptions(max_connections=3))
    assert calls.policy.max_connections == 3
    calls, _ = udf._setup("tcp+gotalk://127.0.0.1:1", "echo", pws.CallOptions())
    assert calls.policy.max_connections == MAX_CONNECTIONS == 64


async def test_pool_bound_is_the_largest_max_connections_of_the_udfs() -> None:
    """The bound is the largest max_connections of the UDFs that share the pool: a UDF
    with max_connections=1 makes a third link next to 2 busy ones made under a limit of 4
    (before, its own limit applied: PoolFull, though 2 < 4)."""
    gate = asyncio.Event()
    registry = gated_echo(gate)
    pool = ConnectionPool(asyncio.get_running_loop(), LoopErrors())
    servers = [await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry) for _ in range(3)]
    wide = CallPolicy("echo", timeout=5.0, max_connections=4)
    narrow = CallPolicy("echo", timeout=5.0, retry_for=0.2, max_connections=1)
    try:
        busy = [
            asyncio.ensure_future(make_caller(pool, Endpoint(str(s.url)), wide)("wait"))
            for s in servers[:2]
        ]
        await wait_until(lambda: all(len(s.peers) == 1 for s in servers[:2]))
        result = await make_caller(pool, Endpoint(str(servers[2].url)), narrow)(1)
        assert result == (1, None), result
        gate.set()
        await asyncio.gather(*busy)
    finally:
        gate.set()
        await pool.close()
        for server in servers:
            await server.close()
