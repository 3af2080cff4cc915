"""Level 3 of peerwire's extension: a default timeout per connection, so that calls with one
timeout go as one message each instead of metadata and request. Real servers and clients on
127.0.0.1; peers written by hand where the messages on the wire are the point."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest

import rpc
from rpc import gotalk_peer
from rpc.request_meta import MAX_PENDING, MetaState
from tests.gotalk_raw import RawGotalk
from tests.rpc_helpers import served, timing_registry, wait_until
from wire import gotalk, metadata, schemas
from wire.errors import MalformedMessage

pytestmark = pytest.mark.timeout(30)

REPO = schemas.repository()
SLACK = metadata.TIMEOUT_SLACK_MS / 1000
"""How much later than its caller's deadline the default may put a handler's."""


# --- our client and our server ------------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_every_call_gets_its_own_time_left(flavour: str) -> None:
    """Calls with one timeout, another, none, and (both ways: a server calls its client too)
    all in flight at once: each handler sees its own caller's time left, whichever default
    is announced, and a call without a timeout sees none."""
    async with served(flavour, timing_registry(), client_registry=timing_registry()) as (
        server,
        peer,
    ):
        await wait_until(lambda: peer.adapter.timeout_defaults)
        [server_peer] = server.peers
        await wait_until(lambda: server_peer.adapter.timeout_defaults)

        async def call(caller: rpc.Peer, timeout: float | None) -> None:
            left = await caller.request("left", timeout=timeout)
            if timeout is None:
                assert left is None
            else:
                assert timeout - 1.0 < left <= timeout + SLACK

        timeouts = [2.0, 2.0, 5.0, None, 2.0, 5.0, 5.0, None, 2.0] * 4
        for caller in (peer, server_peer):
            await asyncio.gather(*(call(caller, t) for t in timeouts))
            for timeout in timeouts[:9]:  # one after another
                await call(caller, timeout)
            [left] = [x async for x in caller.stream("left_parts", timeout=2.0)]
            assert 1.0 < left <= 2.0 + SLACK  # a stream request under the default too
        await call(peer, None)  # it announced none first
        assert peer.adapter.meta.sent_default is None and server_peer.adapter.meta.default is None


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_retried_request_has_the_time_it_has_left(flavour: str) -> None:
    """A retry result's wait (past the default's slack) makes the retried request announce
    the shorter time it has left, not ride on the first attempt's default."""
    reg = timing_registry()
    tries: list[float | None] = []

    @reg.handle("busy_once")
    async def busy_once(_: Any = None) -> float | None:
        tries.append(rpc.current_call.get().time_left())
        if len(tries) == 1:
            raise rpc.RetryLater("busy", 0.2)
        return tries[-1]

    async with served(flavour, reg) as (_server, peer):
        await wait_until(lambda: peer.adapter.timeout_defaults)
        left = await peer.request("busy_once", timeout=2.0)
        assert len(tries) == 2 and 1.0 < left <= 2.0 - 0.2 + SLACK


# --- what our client writes: a peer written by hand serves it ------------------------------------


@contextlib.asynccontextmanager
async def raw_gotalk_server(
    level: bytes,
) -> AsyncIterator[tuple[str, asyncio.Queue[RawGotalk], list[Any]]]:
    """A Gotalk server written by hand that answers the announcement with ``level``."""
    accepted: asyncio.Queue[RawGotalk] = asyncio.Queue()
    hellos: list[Any] = []
    ends: list[RawGotalk] = []  # closed here: closing the server leaves its connections open

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = RawGotalk.accept(reader, writer)
        ends.append(raw)
        hellos.append(await raw.next())  # checked by the test, not here (it would hang)
        raw.write(gotalk.Notification(gotalk_peer.HELLO, level))
        await accepted.put(raw)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    async with server:
        try:
            yield f"tcp+gotalk://127.0.0.1:{server.sockets[0].getsockname()[1]}", accepted, hellos
        finally:
            for raw in ends:
                with contextlib.suppress(ConnectionError):
                    await raw.close()


async def answered(raw: RawGotalk, call: Awaitable[Any], count: int) -> list[Any]:
    """What the client writes for ``call`` (which makes ``count`` requests), each request
    answered with a result; the call must then return."""
    task = asyncio.ensure_future(call)
    seen: list[Any] = []
    for _ in range(count):
        while True:
            message = await raw.next()
            seen.append(message)
            if isinstance(message, gotalk.Request):
                raw.write(gotalk.Result(message.id, b"1"))
                break
    await task
    return seen


def described(messages: list[Any]) -> list[Any]:
    """Requests as ``"request"``, defaults as their ms, metadata as ``("meta", ms)``."""
    out: list[Any] = []
    for message in messages:
        if isinstance(message, gotalk.Request):
            out.append("request")
        elif message.name == gotalk_peer.TIMEOUT:
            out.append(metadata.decode_timeout_gotalk(message.payload))
        else:
            assert message.name == gotalk_peer.META
            out.append(("meta", metadata.decode_gotalk(message.payload)[1].timeout_ms))
    return out


async def test_our_gotalk_client_announces_each_timeout_once() -> None:
    async with raw_gotalk_server(b"3") as (url, accepted, hellos):
        async with rpc.connect(url, reconnect=False) as peer:
            raw = await accepted.get()
            assert hellos == [gotalk.Notification(gotalk_peer.HELLO, b"3")]  # what we speak
            await wait_until(lambda: peer.adapter.timeout_defaults)

            async def three() -> None:
                for _ in range(3):
                    await peer.request("op", timeout=2.0)

            first, *rest = described(await answered(raw, three(), 3))
            assert 1995 <= first <= 2001 and rest == ["request"] * 3
            seen = described(await answered(raw, three(), 3))
            assert seen == ["request"] * 3  # the default still holds
            assert described(await answered(raw, peer.request("op"), 1)) == [None, "request"]
            five = described(await answered(raw, peer.request("op", timeout=5.0), 1))
            assert 4995 <= five[0] <= 5001 and five[1:] == ["request"]


async def test_our_gotalk_client_sends_metadata_to_a_level_2_server() -> None:
    async with raw_gotalk_server(b"2") as (url, accepted, _):
        async with rpc.connect(url, reconnect=False) as peer:
            raw = await accepted.get()
            await wait_until(lambda: peer.adapter.metadata)
            assert not peer.adapter.timeout_defaults
            for _ in range(2):  # metadata before each request, no default
                [meta, request] = described(await answered(raw, peer.request("op", timeout=2.0), 1))
                assert meta[0] == "meta" and 1990 <= meta[1] <= 2000 and request == "request"
            assert described(await answered(raw, peer.request("op"), 1)) == ["request"]


# --- what our server takes: clients written by hand -----------------------------------------------


async def test_our_gotalk_server_bounds_requests_by_the_default() -> None:
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=timing_registry()) as server:
        raw = await RawGotalk.connect(server.url.port, level=b"3")
        try:
            assert await raw.next() == gotalk.Notification(gotalk_peer.HELLO, b"3")
            raw.default(300)
            loop = asyncio.get_running_loop()
            started = loop.time()
            raw.request_alone(b"0001", "hang", b"null")
            reply = await raw.next()
            assert reply == gotalk.ErrorResult(b"0001", b"hang: the caller's deadline passed")
            assert 0.25 < loop.time() - started < 5
            raw.request_alone(b"0002", "left", b"null")
            left = await raw.next()
            assert isinstance(left, gotalk.Result) and 0 < float(left.payload) <= 0.3 + 1e-6
            raw.request(b"0003", "left", b"null", 5000)  # its own metadata wins
            left = await raw.next()
            assert isinstance(left, gotalk.Result) and 4 < float(left.payload) <= 5
            raw.default(0)
            raw.request_alone(b"0004", "echo", b'"late"')
            reply = await raw.next()
            assert isinstance(reply, gotalk.ErrorResult) and b"before it ran" in reply.payload
            raw.default(300)
            raw.write(gotalk.Notification(gotalk_peer.TIMEOUT, b"\x00\x01"))  # malformed: ignored
            raw.request_alone(b"0005", "left", b"null")
            left = await raw.next()  # the 300 ms still hold
            assert isinstance(left, gotalk.Result) and 0 < float(left.payload) <= 0.3 + 1e-6
            raw.default(None)
            raw.request_alone(b"0006", "left", b"null")
            assert await raw.next() == gotalk.Result(b"0006", b"null")
        finally:
            await raw.close()


async def test_a_level_2_gotalk_client_gets_no_defaults() -> None:
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=timing_registry()) as server:
        raw = await RawGotalk.connect(server.url.port, level=b"2")
        try:
            assert await raw.next() == gotalk.Notification(gotalk_peer.HELLO, b"2")
            raw.default(0)  # not part of level 2: dropped
            raw.request_alone(b"0001", "echo", b'"served"')
            assert await raw.next() == gotalk.Result(b"0001", b'"served"')
            raw.write(gotalk.Notification(gotalk_peer.HELLO, b"3"))  # taken once: no change
            raw.default(0)
            raw.request_alone(b"0002", "echo", b'"still"')
            assert await raw.next() == gotalk.Result(b"0002", b'"still"')
            [server_peer] = server.peers
            assert server_peer.adapter.metadata and not server_peer.adapter.timeout_defaults
        finally:
            await raw.close()


@pytest.mark.parametrize(
    ("announced", "answer"),
    [(b"4", b"3"), (b"10", b"3"), (b"1", b"1"), (b"0", b"1"), (b"x", b"1"), (b"9" * 5000, b"1")],
)
async def test_a_gotalk_client_gets_the_level_both_speak(announced: bytes, answer: bytes) -> None:
    """Later levels get ours; junk, and digits too long to read as a level, get level 1."""
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=timing_registry()) as server:
        raw = await RawGotalk.connect(server.url.port, level=announced)
        try:
            assert await raw.next() == gotalk.Notification(gotalk_peer.HELLO, answer)
            raw.request_alone(b"0001", "echo", b'"served"')
            assert await raw.next() == gotalk.Result(b"0001", b'"served"')
        finally:
            await raw.close()


# --- the parts ------------------------------------------------------------------------------------


def test_covers_grants_no_less_than_the_caller_has() -> None:
    assert metadata.covers(None, None)
    assert not metadata.covers(None, 5) and not metadata.covers(5, None)
    assert metadata.covers(2000, 2000) and metadata.covers(2000, 1995)
    assert not metadata.covers(2000, 2001)  # the server would cancel before the caller gives up
    assert not metadata.covers(2000, 1994)  # more than TIMEOUT_SLACK_MS too generous
    assert metadata.default_for(None) is None and metadata.default_for(1999) == 2000
    assert metadata.default_for(metadata.MAX_TIMEOUT_MS) == metadata.MAX_TIMEOUT_MS
    for left in (1995, 1996, 1999, 2000):  # a fixed timeout's calls share one default
        assert metadata.covers(metadata.default_for(1999), left)


def test_meta_state_takes_metadata_for_its_request_else_the_default() -> None:
    state: MetaState[bytes] = MetaState()
    assert state.take(b"0001", 1.0) is None
    meta = metadata.RequestMeta(500, {"k": "v"})
    state.received(b"0002", meta, 2.0)
    assert state.take(b"0002", 3.0) == (meta, 2.0)
    state.received(b"0003", meta, 2.0)
    assert state.take(b"0004", 3.0) is None  # for another request: not taken by this one
    assert state.take(b"0003", 2.5) == (meta, 2.0)  # its own request, run later, takes it
    assert not state.pending
    state.received_default(250)
    assert state.take(b"0005", 3.0) == (metadata.RequestMeta(250), 3.0)
    state.received(b"0006", meta, 2.0)
    assert state.take(b"0007", 4.0) == (metadata.RequestMeta(250), 4.0)  # not 0006's


def test_meta_state_keeps_at_most_max_pending_records_the_oldest_going_first() -> None:
    state: MetaState[int] = MetaState()
    meta = metadata.RequestMeta(500)
    for key in range(MAX_PENDING + 3):
        state.received(key, meta, float(key))
    assert list(state.pending) == list(range(3, MAX_PENDING + 3))
    assert state.take(2, 99.0) is None  # pushed out
    state.received(5, metadata.RequestMeta(700), 50.0)  # sent again: the latest, the newest
    assert list(state.pending)[-1] == 5
    assert state.take(5, 99.0) == (metadata.RequestMeta(700), 50.0)
    state.received_default(None)
    assert state.default is None
    assert not state.cover(None)  # nothing announced yet: none holds
    assert state.cover(1999) and state.sent_default == 2000
    assert not state.cover(1998)
    assert state.cover(None) and state.sent_default is None


def test_timeout_codecs_round_trip_and_refuse_the_malformed() -> None:
    for ms in (None, 0, 1, 2000, metadata.MAX_TIMEOUT_MS):
        assert metadata.decode_timeout_gotalk(metadata.encode_timeout_gotalk(ms)) == ms
        sbs = metadata.encode_timeout_sbs(ms)
        assert sbs == REPO.encode(
            "PeerwireRpc.Timeout", ("none", None) if ms is None else ("value", ms)
        )
        assert metadata.decode_timeout_sbs(sbs) == ms
    for bad in (b"", b"\x00\x00\x01", b"\x00\x00\x00\x01\x00"):
        with pytest.raises(MalformedMessage):
            metadata.decode_timeout_gotalk(bad)
    for bad_sbs in (
        b"",
        b"\x81",
        b"\x82",
        b"\x80\x80",
        b"\x81\xff",
        REPO.encode("PeerwireRpc.Timeout", ("value", -1)),
    ):
        with pytest.raises(MalformedMessage):
            metadata.decode_timeout_sbs(bad_sbs)
    for out_of_range in (-1, metadata.MAX_TIMEOUT_MS + 1):
        with pytest.raises(ValueError):
            metadata.encode_timeout_gotalk(out_of_range)
        with pytest.raises(ValueError):
            metadata.encode_timeout_sbs(out_of_range)


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_metadata_of_its_own_overrides_the_default(flavour: str) -> None:
    """Calls with entries (trace context, here a middleware's) among calls under a default:
    each handler sees its own entries and its own caller's time left."""
    reg = rpc.Registry()

    @reg.handle("seen")
    async def seen(_: Any = None) -> list[Any]:
        call = rpc.current_call.get()
        return [call.time_left(), call.metadata.get("n")]

    async def tag_odd(call: rpc.Call, call_next: rpc.CallNext) -> Any:
        if call.payload % 2:
            call.metadata["n"] = str(call.payload)
        return await call_next(call)

    options = rpc.Options(middleware=(tag_odd,))
    async with served(flavour, reg, client_options=options) as (_server, peer):
        await wait_until(lambda: peer.adapter.timeout_defaults)

        async def call(n: int) -> None:
            timeout = 2.0 if n % 3 else 4.0
            left, tag = await peer.request("seen", n, timeout=timeout)
            assert timeout - 1.0 < left <= timeout + SLACK
            assert tag == (str(n) if n % 2 else None)

        for _ in range(2):  # in flight together, then one after another
            await asyncio.gather(*(call(n) for n in range(12)))
        for n in range(12):
            await call(n)


async def test_a_request_too_large_to_send_leaves_no_metadata_behind() -> None:
    """Chatter: a request with metadata whose message comes out past ``max_size`` (its
    payload alone fits) is refused, and its ``PeerwireRpc.Meta``, naming the id the next
    request gets, is not sent either: the next request, under the default, is not taken
    for it."""
    reg = timing_registry()

    @reg.handle("seen")
    async def seen(_: Any = None) -> list[Any]:
        call = rpc.current_call.get()
        return [call.time_left(), call.metadata.get("tag")]

    async def tag_big(call: rpc.Call, call_next: rpc.CallNext) -> Any:
        if isinstance(call.payload, str):
            call.metadata["tag"] = "big"
        return await call_next(call)

    options = rpc.Options(max_size=4096, middleware=(tag_big,))
    async with served("chatter-current", reg, client_options=options) as (_server, peer):
        await wait_until(lambda: peer.adapter.timeout_defaults)
        left, tag = await peer.request("seen", 1, timeout=2.0)  # announces 2 s
        assert 1.0 < left <= 2.0 + SLACK and tag is None
        with pytest.raises(rpc.PayloadError, match="exceeds max_size"):
            await peer.request("seen", "x" * 4094, timeout=9.0)  # its JSON: 4096 bytes
        left, tag = await peer.request("seen", 2, timeout=2.0)  # alone, under the default
        assert 1.0 < left <= 2.0 + SLACK and tag is None


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_traced_call_without_a_timeout_sends_none(flavour: str) -> None:
    """Entries from middleware, no timeout chosen: the metadata carries no time left (it
    carried the protocol's default the caller waits for), before and after timed calls."""
    reg = rpc.Registry()

    @reg.handle("seen")
    async def seen(_: Any = None) -> list[Any]:
        call = rpc.current_call.get(None)
        return [None, None] if call is None else [call.time_left(), call.metadata.get("tag")]

    async def tag(call: rpc.Call, call_next: rpc.CallNext) -> Any:
        call.metadata["tag"] = "t"
        return await call_next(call)

    options = rpc.Options(middleware=(tag,))
    async with served(flavour, reg, client_options=options) as (_server, peer):
        await wait_until(lambda: peer.adapter.timeout_defaults)
        # no time left: served on the plain path (entries alone are for middleware)
        assert await peer.request("seen") == [None, None]
        left, tagged = await peer.request("seen", timeout=2.0)
        assert 1.0 < left <= 2.0 and tagged == "t"
        assert await peer.request("seen") == [None, None]


async def test_over_websocket_too() -> None:
    """Gotalk over WebSocket: the announcement and its payload go in frames of their own,
    as every message's header and payload do."""
    async with rpc.serve("ws+gotalk://127.0.0.1:0/gotalk/", registry=timing_registry()) as server:
        async with rpc.connect(str(server.url), reconnect=False) as peer:
            await wait_until(lambda: peer.adapter.timeout_defaults)
            for timeout in (2.0, 2.0, None, 5.0):
                left = await peer.request("left", timeout=timeout)
                if timeout is None:
                    assert left is None
                else:
                    assert timeout - 1.0 < left <= timeout + SLACK
            [server_peer] = server.peers
            default = server_peer.adapter.meta.default
            assert default is not None and 4995 <= default.timeout_ms <= 5001
