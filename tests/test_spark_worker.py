"""The executor-side machinery (rpc.spark.worker) in this process, without Spark: the
in-flight window, one pooled connection, and no "never retrieved" noise after failures,
timeouts and cancelled batches."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import socket

import pytest

import rpc
from rpc.spark.worker import CallPolicy, Endpoint, Pipeline, make_caller, runtime
from tests.spark_session import loop_thread_fixture, serve_peer_fixture  # noqa: F401


def pipeline(url: str, op: str, window: int, **policy: object) -> Pipeline:
    rt = runtime()
    return Pipeline(rt, make_caller(rt.pool, Endpoint(url), CallPolicy(op, **policy)), window)


@pytest.mark.parametrize("flavour", ["gotalk", "chatter"])
def test_window_bounds_calls_in_flight_on_one_connection(serve_peer, flavour: str) -> None:
    state = {"active": 0, "max": 0}
    registry = rpc.Registry()

    @registry.handle("hold")
    async def hold(n: int) -> int:
        state["active"] += 1
        state["max"] = max(state["max"], state["active"])
        await asyncio.sleep(0.002)
        state["active"] -= 1
        return n + 1

    served = serve_peer(flavour, registry)
    pipe = pipeline(served.url, "hold", window=8, timeout=5.0)
    try:
        first = pipe.submit(list(range(100)))
        second = pipe.submit(list(range(100, 150)))
        assert pipe.submit([]).result(1) == ([], [])
        assert first.result(20) == ([n + 1 for n in range(100)], [None] * 100)
        assert second.result(20) == ([n + 1 for n in range(100, 150)], [None] * 50)
    finally:
        pipe.close()
    assert state["max"] == 8  # the window was full and never exceeded
    assert served.connections == 1


def test_failures_leave_no_unretrieved_futures(serve_peer, caplog) -> None:
    caplog.set_level(logging.WARNING)
    registry = rpc.Registry()

    @registry.handle("sleep")
    async def sleep(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    url = serve_peer("gotalk", registry).url
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        down = f"tcp+gotalk://127.0.0.1:{sock.getsockname()[1]}"

    pipes = [
        pipeline(down, "sleep", window=4),
        pipeline(down, "sleep", window=4, idempotent=True, retries=2, backoff=0.01),
        pipeline(url, "sleep", window=4, timeout=0.05),
        pipeline(url, "sleep", window=4),
    ]
    try:
        for pipe in pipes[:2]:
            results, errors = pipe.submit([0.0] * 20).result(10)
            assert results == [None] * 20
            assert all(e.startswith(f"ConnectionClosed: cannot connect to {down}") for e in errors)
        results, errors = pipes[2].submit([0.0, 1.0]).result(10)
        assert results == [0.0, None]
        assert errors == [None, "RequestTimeout: sleep: no result within 0.05 s"]
        abandoned = pipes[3].submit([5.0] * 10)  # cancelled while its calls are in flight
        pipes[3].close()
        with pytest.raises(concurrent.futures.CancelledError):
            abandoned.result(5)
    finally:
        for pipe in pipes:
            pipe.close()

    runtime().run(asyncio.sleep(0.05))  # let the cancellations run
    gc.collect()
    runtime().run(asyncio.sleep(0.05))  # the loop reports unretrieved exceptions from here
    noise = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert noise == []
