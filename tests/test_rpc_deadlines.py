"""Request metadata between peerwire peers: the caller's time left reaches the server, which
drops a request already past it and bounds the handler by it; the metadata codecs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from rpc import chatter_extension, gotalk_peer
from tests.chatter_socket import ChatterSocket
from tests.gotalk_raw import RawGotalk
from tests.rpc_helpers import served, timing_registry, wait_until
from wire import gotalk, metadata, schemas
from wire.chatter import Dialect
from wire.errors import MalformedMessage

pytestmark = pytest.mark.timeout(30)

SLACK = metadata.TIMEOUT_SLACK_MS / 1000
"""How much later than its caller's deadline a connection's default timeout (level 3) may
put a handler's (uvloop's clock does not move between the read and the handler)."""


class Handlers:
    """A registry whose handlers record what they saw (and those of
    :func:`~tests.rpc_helpers.timing_registry`)."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()
        self.registry = reg = timing_registry()  # left, left_parts, hang, echo

        @reg.handle("wait")
        async def wait(name: str) -> str:
            self.ran.append(name)
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            return name

        @reg.handle("ticks")
        async def ticks(_: Any = None) -> Any:
            yield 1
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise

        @reg.handle("own_timeout")
        async def own_timeout(_: Any = None) -> None:
            raise TimeoutError("the handler's own")


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_handler_sees_the_callers_time_left(flavour: str) -> None:
    handlers = Handlers()
    async with served(flavour, handlers.registry) as (_server, peer):
        await wait_until(lambda: peer.adapter.metadata)
        left = await peer.request("left", timeout=2.0)
        assert 1.0 < left <= 2.0 + SLACK
        assert await peer.request("left") is None  # no timeout chosen: nothing sent
        [left] = [x async for x in peer.stream("left_parts", timeout=2.0)]
        assert 1.0 < left <= 2.0 + SLACK  # a stream's whole deadline travels too
        assert [x async for x in peer.stream("left_parts", item_timeout=2.0)] == [None]
    options = rpc.Options(timeout=3.0)
    async with served(flavour, handlers.registry, client_options=options) as (_server, peer):
        await wait_until(lambda: peer.adapter.metadata)
        assert 2.0 < await peer.request("left") <= 3.0 + SLACK


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_deadline_seen_by_one_handler_is_not_seen_by_the_next(flavour: str) -> None:
    """Requests read together, the first with a deadline: only its handler sees a
    ``current_call``; the next one's, served on the plain path, sees none."""
    handlers = Handlers()
    async with served(flavour, handlers.registry) as (_server, peer):
        await wait_until(lambda: peer.adapter.metadata)
        timed, untimed = await asyncio.gather(
            peer.request("left", timeout=2.0), peer.request("left")
        )
        assert 1.0 < timed <= 2.0 + SLACK
        assert untimed is None


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
@pytest.mark.parametrize("timeout", [None, 5.0], ids=["plain", "with-deadline"])
async def test_a_handler_raising_retry_later_gives_a_retry_result(
    flavour: str, timeout: float | None
) -> None:
    """RetryLater raised by a handler (a plain function or an ``async def``) is answered
    with a retry result, as one raised by middleware is, with or without a deadline."""
    reg = rpc.Registry()
    tries: list[str] = []

    @reg.handle("busy")
    async def busy(_: Any = None) -> str:
        tries.append("async")
        if len(tries) == 1:
            raise rpc.RetryLater("busy now", 0.01)
        return "done"

    @reg.handle("busy_sync")
    def busy_sync(_: Any = None) -> str:
        raise rpc.RetryLater("busy too", 0.01)

    async with served(flavour, reg) as (_server, peer):
        await wait_until(lambda: peer.adapter.metadata)
        assert await peer.request("busy", timeout=timeout) == "done"  # retried once
        assert tries == ["async", "async"]
        peer.options = rpc.Options(retries=0)
        with pytest.raises(rpc.RetryLater, match="busy too"):
            await peer.request("busy_sync", timeout=timeout)


@pytest.mark.parametrize("wait", [-0.5, float("inf"), float("nan"), 1e12])
async def test_a_retry_later_with_any_wait_is_answered(wait: float) -> None:
    """A wait the wire cannot carry (negative, endless, not a number) is taken within its
    range: the caller gets its retry result and the connection goes on."""
    reg = rpc.Registry()

    @reg.handle("busy")
    def busy(_: Any = None) -> str:
        raise rpc.RetryLater("later", wait)

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    options = rpc.Options(retries=0)
    for flavour in ("gotalk", "chatter-current"):
        async with served(flavour, reg, client_options=options) as (_server, peer):
            with pytest.raises(rpc.RetryLater, match="later") as caught:
                await peer.request("busy", timeout=5.0)
            assert 0 <= caught.value.wait <= 0xFFFFFFFF / 1000
            assert await peer.request("echo", "after") == "after"


async def test_a_retry_later_is_an_error_result_where_there_are_no_retry_results() -> None:
    reg = rpc.Registry()

    @reg.handle("busy")
    async def busy(_: Any = None) -> str:
        raise rpc.RetryLater("busy now", 0.01)

    async with served("gotalk", reg, retry_results=False) as (_server, peer):
        for timeout in (None, 5.0):
            with pytest.raises(rpc.RemoteError, match="busy now"):
                await peer.request("busy", timeout=timeout)


async def test_a_request_with_a_deadline_past_the_handler_limit_gets_a_retry_result() -> None:
    handlers = Handlers()
    options = rpc.Options(max_concurrent=1)
    async with served("gotalk", handlers.registry, options=options) as (_server, peer):
        await wait_until(lambda: peer.adapter.metadata)
        first = asyncio.create_task(peer.request("wait", "first", timeout=5.0))
        await wait_until(lambda: handlers.ran == ["first"])
        peer.options = rpc.Options(retries=0)
        with pytest.raises(rpc.RetryLater, match="request rate limit"):
            await peer.request("wait", "second", timeout=2.0)  # not a RequestTimeout
        handlers.release.set()
        assert await first == "first"
        assert handlers.ran == ["first"]


async def test_request_waiting_past_its_deadline_is_dropped() -> None:
    """A request that waited in the server's input (reading paused: every handler slot
    taken, a peer without retry results) past its caller's deadline is answered without
    running its handler."""
    handlers = Handlers()
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0",
        registry=handlers.registry,
        options=rpc.Options(max_concurrent=1),
        retry_results=False,
    ) as server:
        async with rpc.connect(str(server.url), registry=rpc.Registry(), reconnect=False) as peer:
            await wait_until(lambda: peer.adapter.metadata)
            first = asyncio.create_task(peer.request("wait", "first"))
            await wait_until(lambda: handlers.ran == ["first"])
            loop = asyncio.get_running_loop()
            sent = loop.time()
            with pytest.raises(rpc.RequestTimeout):
                await peer.request("wait", "late", timeout=0.3)
            # the server's deadline counts from its read of "late", a little after ours: let
            # it pass too (uvloop's clock moves in whole milliseconds) before freeing the slot
            await wait_until(lambda: loop.time() > sent + 0.35)
            handlers.release.set()
            assert await first == "first"
            assert await peer.request("echo", "after") == "after"  # sent after "late"
            assert handlers.ran == ["first"]


async def test_request_kept_while_our_output_waits_counts_from_its_arrival() -> None:
    """A request (with its caller's time left) read while our output waits is kept; the
    peer's later bytes are read meanwhile. Once the output drains and it runs, its time
    left counts from its own read, not from the latest one: past it, it is dropped. Failed
    before the backlog kept each message's read time (the handler ran: its deadline was
    counted from the read of the notification sent after it)."""
    handlers = Handlers()
    handlers.registry.handle("big")(lambda size: b"x" * size)
    options = rpc.Options(high_water=64 * 1024, low_water=16 * 1024)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=handlers.registry, options=options
    ) as server:
        raw = await RawGotalk.connect(server.url.port)
        try:
            await wait_until(lambda: len(server.peers) == 1)
            [peer] = server.peers
            for rid in range(1, 17):  # 16 MiB of results it does not read yet: output waits
                raw.request_alone(b"%04d" % rid, "big", b"1048576")
            await wait_until(lambda: peer.outbox.blocked)
            loop = asyncio.get_running_loop()
            sent = loop.time()
            raw.request(b"0100", "wait", b'"late"', 200)  # kept, with its metadata
            kept = peer._kept.messages
            await wait_until(lambda: kept and getattr(kept[-1], "op", None) == "wait")
            await wait_until(lambda: loop.time() > sent + 0.3)
            raw.writer.write(raw.notification("tick", b"1"))  # read (and kept) after that
            await wait_until(lambda: getattr(kept[-1], "name", None) == "tick")
            late = await raw.next()  # now it reads: the output drains
            while getattr(late, "id", None) != b"0100":  # the server's hello, 16 big results
                late = await raw.next()
            assert isinstance(late, gotalk.ErrorResult), late
            assert b"deadline passed before it ran" in late.payload
            assert handlers.ran == []
        finally:
            handlers.release.set()  # (had "late" run, the server's close would wait for it)
            await raw.close()


# --- raw peers speaking the extension --------------------------------------------------------


async def test_gotalk_deadline_on_the_wire() -> None:
    handlers = Handlers()
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=handlers.registry) as server:
        raw = await RawGotalk.connect(server.url.port)
        try:
            answer = await raw.next()
            assert answer == gotalk.Notification(gotalk_peer.HELLO, b"2")
            raw.request(b"0001", "wait", b'"past"', 0)  # no time left when it arrives
            reply = await raw.next()
            assert isinstance(reply, gotalk.ErrorResult) and reply.id == b"0001"
            assert b"deadline passed before it ran" in reply.payload
            assert handlers.ran == []
            raw.request(b"0005", "echo", b'"late"', 0)  # a plain function: dropped too
            reply = await raw.next()
            assert isinstance(reply, gotalk.ErrorResult) and b"before it ran" in reply.payload
            raw.request(b"0006", "echo", b'"in time"', 300)  # and otherwise served inline
            assert await raw.next() == gotalk.Result(b"0006", b'"in time"')

            loop = asyncio.get_running_loop()
            started = loop.time()
            raw.request(b"0002", "wait", b'"bounded"', 300)
            reply = await raw.next()
            assert isinstance(reply, gotalk.ErrorResult) and reply.id == b"0002"
            assert reply.payload == b"wait: the caller's deadline passed"
            assert 0.25 < loop.time() - started < 5
            assert handlers.ran == ["bounded"] and handlers.cancelled.is_set()

            handlers.cancelled.clear()
            raw.request(b"0003", "ticks", b"null", 300)  # a streamed result: bounded too
            assert await raw.next() == gotalk.StreamResult(b"0003", b"1")
            reply = await raw.next()
            assert isinstance(reply, gotalk.ErrorResult) and b"deadline" in reply.payload
            assert await raw.next() == gotalk.StreamResult(b"0003", b"")  # the stream's end
            assert handlers.cancelled.is_set()

            raw.request(b"0007", "own_timeout", b"null", 5000)  # not taken for the deadline
            reply = await raw.next()
            assert reply == gotalk.ErrorResult(b"0007", b"the handler's own")

            raw.request(b"0004", "echo", b'"ok"', None)  # entries only: served as usual
            assert await raw.next() == gotalk.Result(b"0004", b'"ok"')
        finally:
            await raw.close()


async def test_gotalk_level_1_peers_get_no_metadata() -> None:
    """A peer announcing level 1 (cancellation only) is answered with level 1, and its
    ``peerwire/meta`` notifications are not taken as metadata."""
    handlers = Handlers()
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=handlers.registry) as server:
        raw = await RawGotalk.connect(server.url.port, level=b"1")
        try:
            assert await raw.next() == gotalk.Notification(gotalk_peer.HELLO, b"1")
            raw.request(b"0001", "left", b"null", 0)
            assert await raw.next() == gotalk.Result(b"0001", b"null")
            [server_peer] = server.peers
            assert server_peer.adapter.cancels and not server_peer.adapter.metadata
        finally:
            await raw.close()


async def test_chatter_deadline_on_the_wire() -> None:
    handlers = Handlers()
    repo = schemas.repository()
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=handlers.registry) as server:
        sock = await ChatterSocket.connect("127.0.0.1", server.url.port, Dialect.CURRENT)
        conn = sock.conn

        def request(op: str, payload: bytes, timeout_ms: int | None) -> int:
            meta = metadata.RequestMeta(timeout_ms, {"k": "v"})
            value = {  # the record as hat-sbs writes it (our encoder is checked against it)
                "first": conn.next_id + 1,
                "timeoutMs": ("none", None) if timeout_ms is None else ("value", timeout_ms),
                "entries": [{"key": k, "value": v} for k, v in meta.entries.items()],
            }
            conn.send("PeerwireRpc.Meta", repo.encode("PeerwireRpc.Meta", value))
            msg = conn.send(op, payload, last=False)
            sock.flush()
            return msg.id

        try:
            conn.send_ping(chatter_extension.HELLO)
            first = request("wait", b'"past"', 0)
            reply = await sock.receive()
            assert (reply.first, reply.type, reply.last) == (first, "PeerwireRpc.Error", True)
            assert "deadline passed before it ran" in repo.decode("PeerwireRpc.Error", reply.data)
            assert conn.last_pong_data == chatter_extension.HELLO
            assert handlers.ran == []

            first = request("wait", b'"bounded"', 300)
            reply = await sock.receive()
            assert (reply.first, reply.type) == (first, "PeerwireRpc.Error")
            error = repo.decode("PeerwireRpc.Error", reply.data)
            assert error == "wait: the caller's deadline passed"
            assert handlers.ran == ["bounded"] and handlers.cancelled.is_set()

            first = request("echo", b'"ok"', None)
            reply = await sock.receive()
            assert (reply.first, reply.type, reply.data) == (first, "PeerwireRpc.Result", b'"ok"')
        finally:
            await sock.close()


# --- codecs ------------------------------------------------------------------------------------


def test_gotalk_metadata_round_trip_and_malformed() -> None:
    meta = metadata.RequestMeta(1500, {"traceparent": "00-abc-def-01", "k": ""})
    data = metadata.encode_gotalk(b"\x01\x02\x03\x04", meta)
    assert metadata.decode_gotalk(data) == (b"\x01\x02\x03\x04", meta)
    none = metadata.decode_gotalk(metadata.encode_gotalk(b"abcd", metadata.RequestMeta()))
    assert none == (b"abcd", metadata.RequestMeta(None, {}))
    for bad in (
        b"",
        b"abcd\x00\x00\x00\x01",  # no count
        b"abcd\x00\x00\x00\x01\x01\x05ab",  # truncated key
        b"abcd\x00\x00\x00\x01\x01\x01k\x00\x09v",  # truncated value
        b"abcd\x00\x00\x00\x01\x40",  # too many entries
        b"abcd\x00\x00\x00\x01\x00x",  # trailing bytes
        b"abcd\x00\x00\x00\x01\x01\x00\x00\x00",  # empty key
        b"abcd\x00\x00\x00\x01\x02\x01k\x00\x00\x01k\x00\x00",  # a repeated key
    ):
        with pytest.raises(MalformedMessage):
            metadata.decode_gotalk(bad)
    with pytest.raises(ValueError):
        metadata.encode_gotalk(b"abcd", metadata.RequestMeta(None, {"": "empty key"}))
    with pytest.raises(ValueError):
        entries = {str(i): "" for i in range(metadata.MAX_ENTRIES + 1)}
        metadata.encode_gotalk(b"abcd", metadata.RequestMeta(None, entries))
    assert metadata.timeout_ms(-1.0) == 0 and metadata.timeout_ms(0.0019) == 1
    assert metadata.timeout_ms(float("inf")) == metadata.MAX_TIMEOUT_MS  # it raised


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_call_with_no_deadline_reaches_a_peer_that_takes_timeouts(flavour: str) -> None:
    """``timeout=float("inf")`` to a peer that takes the caller's timeout (a peerwire
    server): it goes as the longest timeout there is. Its conversion to ms raised
    OverflowError, so the call failed before it was sent."""
    async with served(flavour, timing_registry()) as (_, peer):
        await wait_until(lambda: peer.adapter.metadata)
        assert await peer.request("left", timeout=float("inf")) > 3600


def test_time_left_in_whole_ms_survives_a_millisecond_clock() -> None:
    """uvloop's ``loop.time()`` counts whole ms: a call's time left is its deadline less
    such a reading, and a call that crossed one tick since its deadline was set has 1 ms
    less, not 2 (``1.999`` in floating point is ``1.99899...``), so the next call with the
    same timeout and no tick crossed (2000 ms) is still covered by the first's default."""
    for tick in range(123_456_000, 123_456_200):
        now = tick / 1000
        deadline = now + 2.0
        crossed = metadata.timeout_ms(deadline - (tick + 1) / 1000)
        assert crossed == 1999
        assert metadata.covers(metadata.default_for(crossed), metadata.timeout_ms(deadline - now))


def test_chatter_metadata_round_trip_and_malformed() -> None:
    """Our SBS codec of ``PeerwireRpc.Meta`` against hat-sbs' on the same records (the
    property tests in test_metadata_fuzz.py cover arbitrary ones)."""
    repo = schemas.repository()
    meta = metadata.RequestMeta(250, {"traceparent": "00-abc-def-01"})
    encoded = repo.encode(
        "PeerwireRpc.Meta",
        {
            "first": 7,
            "timeoutMs": ("value", 250),
            "entries": [{"key": "traceparent", "value": "00-abc-def-01"}],
        },
    )
    assert metadata.encode_sbs(7, meta) == encoded
    assert metadata.decode_sbs(encoded) == (7, meta)
    empty = metadata.encode_sbs(8, metadata.RequestMeta())
    assert metadata.decode_sbs(empty) == (8, metadata.RequestMeta(None, {}))
    assert repo.decode("PeerwireRpc.Meta", empty) == {
        "first": 8,
        "timeoutMs": ("none", None),
        "entries": [],
    }

    def record(timeout: tuple[str, Any], entries: list[dict[str, str]]) -> bytes:
        value = {"first": 1, "timeoutMs": timeout, "entries": entries}
        return bytes(repo.encode("PeerwireRpc.Meta", value))

    for bad in (
        b"",
        b"\x81",  # no timeout
        record(("none", None), [])[:-1],  # no entry count
        record(("none", None), [{"key": "", "value": ""}]),  # empty key
        record(("value", -5), []),
        record(("none", None), [{"key": "a", "value": "1"}, {"key": "a", "value": "2"}]),
        record(("none", None), []) + b"\x00",  # trailing bytes
        b"\x81\x82\x80",  # Optional index 2
        b"\x81\x80\x81\x81\xff\x80",  # a key that is not UTF-8
    ):
        with pytest.raises(MalformedMessage):
            metadata.decode_sbs(bad)
    with pytest.raises(ValueError):
        metadata.encode_sbs(1, metadata.RequestMeta(None, {"": "empty key"}))


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_call_with_minus_infinite_timeout_times_out_as_a_negative_one(
    flavour: str,
) -> None:
    """``timeout=-inf`` to a peer that takes the caller's timeout: none left, as for
    ``-1.0`` (RequestTimeout). 6fcc4b3 bounded ``inf`` in ``timeout_ms``; ``-inf`` still
    raised OverflowError converting to int, out of ``request``."""
    assert metadata.timeout_ms(float("-inf")) == 0
    async with served(flavour, timing_registry()) as (_, peer):
        await wait_until(lambda: peer.adapter.metadata)
        for timeout in (-1.0, float("-inf")):
            with pytest.raises(rpc.RequestTimeout):
                await peer.request("left", timeout=timeout)
