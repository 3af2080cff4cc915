"""Defects found in the reconnecting client (rpc.reconnect) by attacking it with real
servers in real processes (kill -9, restarts on the same port, flapping and silent
listeners); each test fails on the code it was written against, and is bounded in time.

Real servers on 127.0.0.1, port 0; see test_reconnect.py for how these tests are set up.
"""

from __future__ import annotations

import types
from collections.abc import Coroutine, Generator
from typing import Any

import pytest

import rpc
from tests.reconnect_helpers import RECONNECTING, Recorder, named
from tests.rpc_helpers import wait_until


@types.coroutine
def resumptions(coro: Coroutine[Any, Any, Any], count: list[int]) -> Generator[Any, Any, Any]:
    """Await ``coro``, counting in ``count[0]`` how often it is woken (resumed by its task)."""
    it = coro.__await__()
    try:
        future = it.send(None)
        while True:
            count[0] += 1
            try:
                value = yield future
            except BaseException as exc:  # handed on to the coroutine, as a task does
                future = it.throw(exc)
            else:
                future = it.send(value)
    except StopIteration as done:  # the coroutine returned
        return done.value


@pytest.mark.both_loops
async def test_a_request_waiting_for_a_connection_is_not_woken_by_every_round() -> None:
    """A request made while disconnected waits for the connection within its timeout. It
    was woken at every transition, one ``reconnecting`` per round: during an outage each
    waiting caller ran once per round, so 5,000 callers waiting through rounds 0.25 s apart
    (``Backoff(0.05, 0.5)``) took 2.2 s of CPU in 3.5 s, 64 % of a core, for nothing. It
    must be woken only when the connection opens or the client closes."""
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("s")) as server:
        url = str(server.url)
        record = Recorder()
        policy = rpc.Reconnect(backoff=rpc.Backoff(base=0.002, cap=0.004))
        async with rpc.connect(url, reconnect=policy, on_state=record) as client:
            assert await client.request("who") == "s"
            await server.close()  # the port refuses connections: a round every few ms
            await wait_until(lambda: client.connection_state is RECONNECTING)
            woken = [0]
            rounds = record.states().count(RECONNECTING)
            with pytest.raises(rpc.RequestTimeout, match="not connected within"):
                await resumptions(client.request("who", timeout=0.3), woken)
            rounds = record.states().count(RECONNECTING) - rounds
            assert rounds >= 10, rounds  # the rounds the request waited through
            assert woken[0] <= 3, f"woken {woken[0]} times in {rounds} rounds"
