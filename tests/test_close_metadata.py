"""Request metadata read during a graceful close goes to the request it was sent for.

During the close, a peer without retry results has what it sends turned away while no call
of ours is in flight; a metadata message so read is taken at once (it precedes its
request), while a request read before it may still wait in the backlog for a slot. That
request, run later, must neither take the metadata nor drop it: the metadata's own request,
read later (while a call of ours was in flight, so it runs), then runs with its deadline.
A raw Gotalk v1 client at extension level 3 over real sockets on 127.0.0.1, both loops;
the waits are bounded, none is a fixed sleep."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import wait_until
from wire.metadata import RequestMeta, encode_gotalk

pytestmark = pytest.mark.both_loops

DRAIN = 3.0
TIMEOUT_MS = 60_000
"""The time left the metadata gives its request: far above anything the test waits."""


def _request(rid: int, op: bytes, payload: bytes) -> bytes:
    return b"r%s%03x%s%08x%s" % (rid.to_bytes(4, "little"), len(op), op, len(payload), payload)


def _notification(name: bytes, payload: bytes) -> bytes:
    return b"n%03x%s%08x%s" % (len(name), name, len(payload), payload)


async def _frame(reader: asyncio.StreamReader) -> tuple[bytes, bytes, bytes, bytes]:
    """The next Gotalk v1 message but heartbeats: (kind, id, name, payload); b"" for the
    fields a kind does not have. Only what this test's server sends."""
    while True:
        kind = await reader.readexactly(1)
        if kind == b"h":
            await reader.readexactly(12)
            continue
        rid = await reader.readexactly(4) if kind in b"rRE" else b""
        name = b""
        if kind in b"rn":
            name = await reader.readexactly(int(await reader.readexactly(3), 16))
        if kind not in b"rnRE":
            raise AssertionError(f"unexpected Gotalk message {kind!r}")
        payload = await reader.readexactly(int(await reader.readexactly(8), 16))
        return kind, rid, name, payload


def _with_left() -> rpc.Registry:
    """A registry whose ``left`` answers the time left of its call's deadline (None: none)."""
    reg = rpc.Registry()

    @reg.handle("left")
    async def left(value: Any) -> Any:
        call = rpc.current_call.get(None)
        return None if call is None else call.time_left()

    return reg


async def _at_level_3(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw Gotalk connection that agreed on extension level 3 (request metadata)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"01" + _notification(b"peerwire/hello", b"3"))
    assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
    hello = await asyncio.wait_for(_frame(reader), 5)
    assert hello == (b"n", b"", b"peerwire/hello", b"3")  # metadata spoken
    return reader, writer


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
        reader, writer = await _at_level_3(server.url.port)
        try:
            writer.write(_request(1, b"hold", b"1"))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            writer.write(_request(2, b"left", b"null"))
            await wait_until(lambda: len(served._backlog) == 1, 5)  # kept: the slot's taken
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: served.gave_up is not None, 2)  # the close began
            meta = encode_gotalk((3).to_bytes(4, "little"), RequestMeta(TIMEOUT_MS))
            writer.write(_notification(b"peerwire/meta", meta))
            await wait_until(lambda: bool(served.gotalk.meta.pending), 5)  # taken
            go.set()
            kind, call_id, op, value = await asyncio.wait_for(_frame(reader), 5)
            while kind == b"n":  # our call's timeout (its metadata, or a default) first
                kind, call_id, op, value = await asyncio.wait_for(_frame(reader), 5)
            assert (kind, op, value) == (b"r", b"answer", b"1")  # our call is in flight
            writer.write(_request(3, b"left", b"null"))
            await wait_until(lambda: len(served._backlog) == 2, 5)  # kept behind request 2
            writer.write(b"R%s%08x%s" % (call_id, 1, b"2"))
            results: dict[int, Any] = {}
            while len(results) < 3:
                kind, rid, _, payload = await asyncio.wait_for(_frame(reader), DRAIN + 2)
                assert kind == b"R", (kind, payload)
                results[int.from_bytes(rid, "little")] = json.loads(payload)
            await asyncio.wait_for(closing, DRAIN + 2)
        finally:
            writer.close()
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
        reader, writer = await _at_level_3(server.url.port)
        try:
            writer.write(_request(1, b"hold", b"1"))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: served.gave_up is not None, 2)  # the close began
            meta3 = encode_gotalk((3).to_bytes(4, "little"), RequestMeta(TIMEOUT_MS))
            writer.write(_notification(b"peerwire/meta", meta3))
            pending = served.gotalk.meta.pending
            await wait_until(lambda: bool(pending), 5)  # taken
            go.set()
            kind, call_id, op, value = await asyncio.wait_for(_frame(reader), 5)
            while kind == b"n":  # our call's timeout first
                kind, call_id, op, value = await asyncio.wait_for(_frame(reader), 5)
            assert (kind, op, value) == (b"r", b"answer", b"1")  # our call is in flight
            writer.write(_request(3, b"left", b"null"))
            await wait_until(lambda: len(served._backlog) == 1, 5)  # kept behind the slot
            writer.write(b"R%s%08x%s" % (call_id, 1, b"2"))
            await asyncio.wait_for(answered.wait(), 5)  # no call of ours in flight now
            key4 = (4).to_bytes(4, "little")
            writer.write(
                _notification(b"peerwire/meta", encode_gotalk(key4, RequestMeta(TIMEOUT_MS)))
            )
            await wait_until(lambda: key4 in pending, 5)  # taken at once too
            writer.write(_request(4, b"left", b"null"))
            await wait_until(lambda: key4 not in pending, 5)  # turned away, its metadata used
            release.set()
            results: dict[int, Any] = {}
            while len(results) < 2:  # 1 and 3; 4 was turned away unanswered
                kind, rid, _, payload = await asyncio.wait_for(_frame(reader), DRAIN + 2)
                assert kind == b"R", (kind, payload)
                results[int.from_bytes(rid, "little")] = json.loads(payload)
            await asyncio.wait_for(closing, DRAIN + 2)
        finally:
            writer.close()
    assert results[1] == 2
    assert results[3] is not None and TIMEOUT_MS / 1000 - 5 < results[3] <= TIMEOUT_MS / 1000
