"""The executor-side machinery (rpc.spark.worker, rpc.spark.reconnect) in this process,
without Spark: the in-flight window, one pooled connection, no "never retrieved" noise after
failures, timeouts and cancelled batches, calls that wait for a peer to come back, calls
lost in flight, and connection set-up failures remembered and logged once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import socket
import threading
from collections import Counter

import pytest

import rpc
from rpc.spark.worker import CallPolicy, Endpoint, Pipeline, make_caller, runtime
from tests.rpc_helpers import wait_until
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
        await asyncio.sleep(0.002)  # the handler's work: calls overlap meanwhile (not a wait)
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
        pipeline(down, "sleep", window=4, retry_for=0.2),
        pipeline(down, "sleep", window=4, idempotent=True, retry_for=0.2, backoff=0.01),
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

    # the cancelled workers finish on the loop; then their futures are garbage, and the
    # loop reports any unretrieved exception as they are collected
    runtime().run(wait_until(lambda: not any(pipe._workers for pipe in pipes)))
    gc.collect()
    runtime().run(asyncio.sleep(0))  # one more pass of the loop for anything it scheduled
    noise = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert noise == []


def free_url(scheme: str = "tcp+gotalk") -> tuple[str, int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"{scheme}://127.0.0.1:{port}", port


def counting_registry(processed: Counter[int]) -> rpc.Registry:
    registry = rpc.Registry()

    @registry.handle("work")
    async def work(n: int) -> int:
        processed[n] += 1
        await asyncio.sleep(0.001)  # the handler's work (not a wait)
        return n * 3

    return registry


def test_calls_wait_for_a_peer_that_comes_back(loop_thread, caplog) -> None:
    """The peer is down when the batch is submitted and starts listening later: every row
    waits for it (reconnect with back-off) and is called once."""
    caplog.set_level(logging.INFO, logger="peerwire.spark")
    processed: Counter[int] = Counter()
    url, port = free_url()
    pipe = pipeline(url, "work", window=16, retry_for=30.0)
    server = None
    try:
        pending = pipe.submit(list(range(200)))
        link = runtime().pool.link(Endpoint(url))
        # it has failed to connect a few times (state of the runtime's loop: polled there)
        runtime().run(wait_until(lambda: link.attempts >= 3, timeout=10))
        assert not pending.done()
        server = loop_thread.serve(url.split("://")[0], counting_registry(processed), port=port)
        results, errors = pending.result(20)
    finally:
        pipe.close()
        if server is not None:
            loop_thread.run(server.close(drain_timeout=1.0))
    assert errors == [None] * 200
    assert results == [n * 3 for n in range(200)]
    assert processed == Counter(range(200))
    messages = [r.getMessage() for r in caplog.records if r.name == "peerwire.spark"]
    assert len([m for m in messages if m.startswith(f"cannot connect to {url}")]) == 1
    assert any(m.startswith(f"connected to {url} after") for m in messages)


@pytest.mark.parametrize("idempotent", [False, True])
def test_calls_lost_in_flight(serve_peer, idempotent: bool) -> None:
    """The server drops every connection while calls are in flight: those calls fail with
    one wording unless the op is idempotent; calls not sent yet wait for the reconnect."""
    processed: Counter[int] = Counter()
    registry = rpc.Registry()
    started = threading.Event()

    @registry.handle("work")
    async def work(n: int) -> int:
        processed[n] += 1
        if n == 50:
            started.set()
        await asyncio.sleep(0.05 if n < 100 else 0.001)  # work: calls in flight at the drop
        return n * 3

    served = serve_peer("gotalk", registry)
    pipe = pipeline(served.url, "work", window=32, idempotent=idempotent, retry_for=10.0)
    try:
        pending = pipe.submit(list(range(300)))
        assert started.wait(10)
        served.drop_connections()
        results, errors = pending.result(30)
    finally:
        pipe.close()
    lost = f"ConnectionClosed: connection to {served.url} lost with the call in flight"
    failed = [n for n, e in enumerate(errors) if e is not None]
    assert all(errors[n] == lost for n in failed)
    assert all(results[n] == n * 3 for n in range(300) if n not in failed)
    assert served.connections == 2
    if idempotent:
        assert failed == []
        assert set(processed) == set(range(300))
    else:
        assert 0 < len(failed) <= 32  # at most a window's worth was in flight
        assert max(processed.values()) == 1  # nothing was sent twice
        assert all(processed[n] == 1 for n in range(300) if n not in failed)


def test_setup_failures_are_named_remembered_and_logged_once(serve_peer, caplog) -> None:
    """A failure inside the protocol's set-up (here: an option the protocol does not take)
    is a peer that cannot be reached: every row names the cause, the link retries at its own
    pace (not once per row), the log says it once."""
    caplog.set_level(logging.INFO, logger="peerwire.spark")
    served = serve_peer("gotalk", counting_registry(Counter()))
    rt = runtime()
    endpoint = Endpoint(served.url, protocol_options=(("no_such_option", 1),))
    policy = CallPolicy("work", retry_for=0.5)
    pipe = Pipeline(rt, make_caller(rt.pool, endpoint, policy), 64)
    try:
        first = pipe.submit(list(range(2000)))
        results, errors = first.result(20)
        again, errors_again = pipe.submit(list(range(2000))).result(20)  # fails fast now
    finally:
        pipe.close()
    assert results == again == [None] * 2000
    assert {*errors, *errors_again} == {
        f"ConnectionClosed: cannot connect to {served.url}: "
        "TypeError: GotalkPeer takes no keyword 'no_such_option'"
    }
    attempts = rt.pool.link(endpoint).attempts
    assert 2 <= attempts <= 40  # back-off up to 2 s over ~0.5 s and the second batch
    messages = [r.getMessage() for r in caplog.records if r.name == "peerwire.spark"]
    assert len([m for m in messages if m.startswith("cannot connect to")]) == 1
    assert len([m for m in messages if "still unreachable" in m]) == 1
    # no traceback per attempt or row (the core raises the protocol's error to the caller
    # itself; older cores left one asyncio traceback)
    assert len([r for r in caplog.records if r.exc_info is not None]) <= 1


def test_a_new_connection_carries_one_call_until_it_answers(serve_peer) -> None:
    """The first call on a new connection goes alone (a connection that a dying peer's
    kernel accepted then loses one call, not a window); the rest follow its reply."""
    events: list[tuple[str, int]] = []
    registry = rpc.Registry()

    @registry.handle("hold")
    async def hold(n: int) -> int:
        events.append(("start", n))
        # the handler's work; the first call's is long, so calls sent beside it would start
        await asyncio.sleep(0.2 if len(events) == 1 else 0.001)
        events.append(("end", n))
        return n

    served = serve_peer("gotalk", registry)
    pipe = pipeline(served.url, "hold", window=16, timeout=5.0)
    try:
        assert pipe.submit(list(range(50))).result(20) == (list(range(50)), [None] * 50)
    finally:
        pipe.close()
    first = events[0][1]
    assert events[:2] == [("start", first), ("end", first)]
    assert max(n for kind, n in events if kind == "start") == 49


async def test_a_full_tls_server_is_waited_for_and_an_untrusted_one_is_not(pki) -> None:
    """A TLS server at max_connections closes before any TLS (to the client, like a plain
    port): an outage, waited out. A certificate from an unknown CA cannot get better by
    trying again: the waiting call fails at once."""
    from rpc.spark.reconnect import Link
    from transports.stream import client_ssl_context, server_ssl_context

    reg = rpc.Registry()

    @reg.handle("ping")
    def ping(_value: object) -> str:
        return "pong"

    loop = asyncio.get_running_loop()
    server_ctx = server_ssl_context(pki.server_cert, pki.server_key)
    async with rpc.serve(
        "ssl+gotalk://127.0.0.1:0", registry=reg, ssl=server_ctx, max_connections=1
    ) as server:
        url = str(server.url)
        trusted = client_ssl_context(cafile=pki.ca)
        holder = await rpc.connect(url, ssl=trusted, reconnect=False)
        full = Link(loop, url, lambda: rpc.connect(url, ssl=trusted, reconnect=False))
        waiting = asyncio.create_task(full.get(loop.time(), 10.0))
        await wait_until(lambda: full.attempts >= 2)  # refused at least once meanwhile
        assert not waiting.done()
        await holder.close()
        peer, _probe = await asyncio.wait_for(waiting, 10)
        assert await peer.request("ping") == "pong"
        await full.close()

        other = client_ssl_context(cafile=pki.other_ca)
        untrusted = Link(loop, url, lambda: rpc.connect(url, ssl=other, reconnect=False))
        started = loop.time()
        with pytest.raises(rpc.ConnectionClosed, match="unknown CA"):
            await untrusted.get(started, 10.0)
        assert loop.time() - started < 5  # not the 10-s budget
        await untrusted.close()
