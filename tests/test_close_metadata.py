"""Request metadata read during a graceful close goes to the request it was sent for.

During the close, a peer without retry results has what it sends turned away while no call
of ours is in flight; a metadata message so read is taken at once (it precedes its
request), while a request read before it may still wait in the backlog for a slot. That
request, run later, must neither take the metadata nor drop it: the metadata's own request,
read later (while a call of ours was in flight, so it runs), then runs with its deadline.
A raw Gotalk v1 client (:class:`tests.gotalk_raw.RawGotalk`) at extension level 3 over real
sockets on 127.0.0.1, both loops; the waits are bounded, none is a fixed sleep."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import rpc
from rpc import gotalk_peer
from tests.gotalk_raw import RawGotalk
from tests.rpc_helpers import wait_until
from wire import gotalk
from wire.metadata import RequestMeta

pytestmark = pytest.mark.both_loops

DRAIN = 3.0
TIMEOUT_MS = 60_000
"""The time left the metadata gives its request: far above anything the test waits."""


def _rid(number: int) -> bytes:
    return number.to_bytes(4, "little")


def _with_left() -> rpc.Registry:
    """A registry whose ``left`` answers the time left of its call's deadline (None: none)."""
    reg = rpc.Registry()

    @reg.handle("left")
    async def left(value: Any) -> Any:
        call = rpc.current_call.get(None)
        return None if call is None else call.time_left()

    return reg


async def _at_level_3(port: int) -> RawGotalk:
    """A raw Gotalk client that agreed on extension level 3 (request metadata)."""
    raw = await RawGotalk.connect(port, level=b"3")
    hello = await raw.next()
    assert isinstance(hello, gotalk.Notification)
    assert (hello.name, hello.payload) == (gotalk_peer.HELLO, b"3")  # metadata spoken
    return raw


async def _called_back(raw: RawGotalk) -> bytes:
    """The id of the server's call ``answer`` with 1 (its timeout's notification before)."""
    call = await raw.answer()
    assert isinstance(call, gotalk.Request) and (call.op, call.payload) == ("answer", b"1")
    return call.id


async def _results(raw: RawGotalk, count: int) -> dict[int, Any]:
    """The next ``count`` results, decoded, by request number."""
    results: dict[int, Any] = {}
    while len(results) < count:
        result = await asyncio.wait_for(raw.answer(), DRAIN + 2)
        assert isinstance(result, gotalk.Result), result
        results[int.from_bytes(result.id, "little")] = json.loads(result.payload)
    return results


async def test_metadata_read_in_the_close_is_not_dropped_by_a_request_read_before_it() -> None:
    """The one handler slot is held by ``hold``. Request 2 is read before the close and
    kept. In the close, with no call of ours in flight, the metadata of request 3 comes
    alone and is taken. Then ``hold`` calls the client back; while that call is in
    flight, request 3 comes and is kept too. Once ``hold`` ends, request 2 runs first: it
    took the metadata for itself, its key not 3, and dropped it, and request 3 ran without
    its deadline."""
    go, started = asyncio.Event(), asyncio.Event()
    reg = _with_left()

    @reg.handle("hold")
    async def hold(value: Any) -> Any:
        started.set()
        await go.wait()
        return await rpc.current_peer.get().request("answer", value, timeout=DRAIN)

    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, options=options, retry_results=False
    ) as server:
        raw = await _at_level_3(server.url.port)
        try:
            raw.request_alone(_rid(1), "hold", b"1")
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            raw.request_alone(_rid(2), "left", b"null")
            await wait_until(lambda: len(served._backlog) == 1, 5)  # kept: the slot's taken
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: served.gave_up is not None, 2)  # the close began
            raw.metadata(_rid(3), RequestMeta(TIMEOUT_MS))
            await wait_until(lambda: bool(served.gotalk.meta.pending), 5)  # taken
            go.set()
            call_id = await asyncio.wait_for(_called_back(raw), 5)  # our call is in flight
            raw.request_alone(_rid(3), "left", b"null")
            await wait_until(lambda: len(served._backlog) == 2, 5)  # kept behind request 2
            raw.write(gotalk.Result(call_id, b"2"))
            results = await _results(raw, 3)
            await asyncio.wait_for(closing, DRAIN + 2)
        finally:
            await raw.close()
    assert results[1] == 2
    assert results[2] is None  # read before the metadata: not its request
    assert results[3] is not None and TIMEOUT_MS / 1000 - 5 < results[3] <= TIMEOUT_MS / 1000


async def test_kept_request_keeps_its_metadata_past_a_later_turned_away_pair() -> None:
    """``hold`` takes the one slot. In the close, with no call in flight, the metadata of
    request 3 is taken at once; while ``hold``'s call back is in flight, request 3 comes
    and is kept. The call answered (``hold`` still holds the slot), the client sends the
    metadata of request 4 and request 4: both turned away, run at once. Once ``hold``
    ends, request 3 runs: it must have its 60-s deadline. (With one pending record, request
    4's metadata replaced request 3's: review 181 of ef1ec4b.)"""
    go, started, answered, release = (asyncio.Event() for _ in range(4))
    reg = _with_left()

    @reg.handle("hold")
    async def hold(value: Any) -> Any:
        started.set()
        await go.wait()
        result = await rpc.current_peer.get().request("answer", value, timeout=DRAIN)
        answered.set()
        await release.wait()
        return result

    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, options=options, retry_results=False
    ) as server:
        raw = await _at_level_3(server.url.port)
        try:
            raw.request_alone(_rid(1), "hold", b"1")
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: served.gave_up is not None, 2)  # the close began
            raw.metadata(_rid(3), RequestMeta(TIMEOUT_MS))
            pending = served.gotalk.meta.pending
            await wait_until(lambda: bool(pending), 5)  # taken
            go.set()
            call_id = await asyncio.wait_for(_called_back(raw), 5)  # our call is in flight
            raw.request_alone(_rid(3), "left", b"null")
            await wait_until(lambda: len(served._backlog) == 1, 5)  # kept behind the slot
            raw.write(gotalk.Result(call_id, b"2"))
            await asyncio.wait_for(answered.wait(), 5)  # no call of ours in flight now
            key4 = _rid(4)
            raw.metadata(key4, RequestMeta(TIMEOUT_MS))
            await wait_until(lambda: key4 in pending, 5)  # taken at once too
            raw.request_alone(key4, "left", b"null")
            await wait_until(lambda: key4 not in pending, 5)  # turned away, its metadata used
            release.set()
            results = await _results(raw, 2)  # 1 and 3; 4 was turned away unanswered
            await asyncio.wait_for(closing, DRAIN + 2)
        finally:
            await raw.close()
    assert results[1] == 2
    assert results[3] is not None and TIMEOUT_MS / 1000 - 5 < results[3] <= TIMEOUT_MS / 1000
