"""The first call on a new connection of the Spark executors' client (the probe) against a
peer that is alive but slow to answer it. In this process, without Spark, like
tests/test_spark_reconnect_unanswered.py."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter

import rpc
from rpc.spark.worker import CallPolicy, Endpoint, Pipeline, make_caller, runtime
from tests.spark_session import LoopThread, loop_thread_fixture  # noqa: F401


def test_a_probe_that_times_out_on_a_live_peer_does_not_fail_the_rest(
    loop_thread: LoopThread,
) -> None:
    """A Chatter server whose first call on each connection takes longer than the call's
    timeout (a warm-up) but that answers our Ping on connecting is alive: its probe fails
    with RequestTimeout alone and the rows after it are answered. Closing such a connection
    as silent (as one that never sent a byte is) would fail every row, each connection's
    probe timing out in turn until retry_for."""
    reg = rpc.Registry()

    @reg.handle("echo")
    async def echo(value: object) -> object:
        state = rpc.current_peer.get().state
        if not state.get("warm"):
            state["warm"] = True
            await asyncio.sleep(1.0)  # the first call of this connection: past the timeout
        return value

    server = loop_thread.serve("tcp+sbs", reg)
    caller = make_caller(
        runtime().pool,
        Endpoint(f"tcp+sbs://127.0.0.1:{server.url.port}?dialect=HatChatter"),
        CallPolicy("echo", timeout=0.3, retry_for=5.0),
    )
    pipe = Pipeline(runtime(), caller, 8)
    try:
        results, errors = pipe.submit(list(range(40))).result(30)
    finally:
        pipe.close()
        loop_thread.run(server.close())
    failed = [e for e in errors if e is not None]
    assert len(failed) == 1 and failed[0].startswith("RequestTimeout"), failed
    answered = [i for i, e in enumerate(errors) if e is None]
    assert [results[i] for i in answered] == answered and len(answered) == 39


def test_a_probe_that_times_out_on_a_silent_connection_does_not_end_the_outage(
    loop_thread: LoopThread,
) -> None:
    """docs/spark.md: "A new connection carries one call until it answers, then the whole
    window; only that answer ends the outage." A Chatter peer that accepts and never sends a
    byte (a frozen process, a proxy with nothing behind it: the kernel accepts, and Chatter
    has no handshake to fail) had its probe time out, and that was taken as the answer: every
    row was then sent into it, the window at a time, each waiting out its timeout (2,000
    rows under Spark: 24 s), instead of one probe per connection and the rest failing within
    retry_for (found by helper-114)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # never accepts: the kernel completes the TCP handshakes
        url = f"tcp+sbs://127.0.0.1:{listener.getsockname()[1]}?dialect=HatChatter"
        caller = make_caller(
            runtime().pool,
            Endpoint(url, connect_timeout=1.0),
            CallPolicy("greet", timeout=0.5, retry_for=2.0),
        )
        pipe = Pipeline(runtime(), caller, 16)
        try:
            results, errors = pipe.submit(list(range(200))).result(60)
        finally:
            pipe.close()
    kinds = Counter((e or "").split(":")[0] for e in errors)
    sent = kinds["RequestTimeout"]
    assert results == [None] * 200 and sent + kinds["ConnectionClosed"] == 200, kinds
    assert sent <= 6, f"{sent} rows sent to a peer that never answered"  # probes: 1 a try
