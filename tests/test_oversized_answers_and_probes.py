"""An answer over the WebSocket layer's size limit is not asked for again on every reconnect,
and a Spark probe that failed before it was sent proves nothing (found by helper-116's
review). Real sockets on 127.0.0.1, port 0."""

from __future__ import annotations

import asyncio
import socket

import pytest

import rpc
from rpc.errors import ConnectionClosed
from rpc.spark.reconnect import LoopErrors
from rpc.spark.worker import CallPolicy, ConnectionPool, Endpoint, make_caller

pytestmark = pytest.mark.timeout(60)


# --- reconnect: a message over max_size cut by websockets, not by the peer -----------------


@pytest.mark.parametrize("scheme", ["ws+gotalk", "ws+sbs"])
async def test_an_answer_over_the_websocket_limit_is_not_asked_for_again(scheme: str) -> None:
    """fcc0d0b: an idempotent request whose answer is over the client's ``max_size`` is not
    sent again (docs/reconnect.md). Over WebSocket, websockets enforces ``max_size + 4096``
    itself: an answer past that closes the connection with 1009, which 36bd5bb reports as
    ``ClosedHere`` (kept as ``gave_up``), not ``MessageTooLarge``, so the request is sent
    again on every reconnect until its timeout, each time run by the server."""
    registry = rpc.Registry()
    runs = 0

    @registry.handle("big")
    def big(_: object = None) -> str:
        nonlocal runs
        runs += 1
        return "x" * 200_000

    server = await rpc.serve(f"{scheme}://127.0.0.1:0", registry=registry)
    try:
        policy = rpc.Reconnect(backoff=rpc.Backoff(base=0.02, cap=0.1))
        async with rpc.connect(
            str(server.url), reconnect=policy, options=rpc.Options(max_size=64 * 1024)
        ) as peer:
            with pytest.raises(rpc.RpcError) as info:
                await peer.request("big", None, timeout=2.0, idempotent=True)
        assert isinstance(info.value, ConnectionClosed), f"{info.value!r}; run {runs} times"
        assert runs == 1, f"sent {runs} times: {info.value}"
    finally:
        await server.close()


# --- Spark: a probe failing here, before anything is sent ----------------------------------


async def test_a_probe_that_fails_to_encode_does_not_prove_a_silent_connection() -> None:
    """55a7a7e: only an answer (a result, an error, a retry result) ends an outage. A
    PayloadError raised here, by encoding the probe's row (nothing sent), is counted as an
    answer: a connection that never answered is proven, and every row after it is sent
    into it, each waiting out its timeout (the defect 55a7a7e fixed for a timed-out probe)."""
    loop = asyncio.get_running_loop()
    pool = ConnectionPool(loop, LoopErrors())
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # never accepts: the kernel completes the TCP handshakes
        url = f"tcp+sbs://127.0.0.1:{listener.getsockname()[1]}?dialect=HatChatter"
        call = make_caller(
            pool,
            Endpoint(url, connect_timeout=1.0),
            CallPolicy("greet", timeout=0.5, retry_for=1.5),
        )
        try:
            first = asyncio.ensure_future(call(object()))  # cannot be encoded: the probe
            outcomes = await asyncio.wait_for(
                asyncio.gather(first, *(call(n) for n in range(40))), 30
            )
        finally:
            await pool.close()
    assert outcomes[0][1] is not None and outcomes[0][1].startswith("PayloadError"), outcomes[0]
    timed_out = [error for _, error in outcomes[1:] if error.startswith("RequestTimeout")]
    # one probe per connection attempt within retry_for, not every row
    assert len(timed_out) <= 5, f"{len(timed_out)} of 40 rows sent to a peer that never answered"
