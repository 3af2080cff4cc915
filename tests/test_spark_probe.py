"""The first call on a new connection of the Spark executors' client (the probe) against a
peer that is alive but slow to answer it. In this process, without Spark, like
tests/test_spark_reconnect_unanswered.py."""

from __future__ import annotations

import asyncio

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
