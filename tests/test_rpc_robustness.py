"""Bad input never wins: protocol answers, disconnects, other connections unaffected;
and liveness (Gotalk heartbeats / read timeout, Chatter ping) on real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import warnings
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rpc
from tests.chatter_socket import ChatterSocket
from tests.rpc_helpers import wait_until
from wire.chatter import ChatterConnection, Dialect, Msg, encode_frame


def registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("echo")
    def echo(value):
        return value

    @reg.handle_stream("sum")
    async def total(parts):
        return sum([p async for p in parts])

    return reg


async def read_all(reader: asyncio.StreamReader, timeout: float = 5) -> bytes:
    """Everything until EOF (fails the test if the peer never closes)."""
    chunks = []
    async with asyncio.timeout(timeout):
        while chunk := await reader.read(65536):
            chunks.append(chunk)
    return b"".join(chunks)


async def raw_connect(server: rpc.Server) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.url.port)


async def check_other_client_still_works(server: rpc.Server, query: str = "") -> None:
    async with rpc.connect(f"{server.url}{query}", registry=rpc.Registry()) as peer:
        assert await peer.request("echo", "still here") == "still here"


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        (b"01x000100000000", b"01f00000002"),  # unknown message type
        (b"02", b"01f00000001"),  # unsupported version
        (b"xx", b"01f00000001"),  # non-hex version
        (b"01r0001zzzecho00000007", b"01f00000002"),  # non-hex text3 size
        (b"01r0001004echo0000000g", b"01f00000002"),  # non-hex payload size
        (b"01r0001004echoffffffff", b"01f00000002"),  # 4 GiB payload announced
        (b"01pzzzz00000003abc", b"01f00000002"),  # part of an unknown stream
        (b"01s0001003sum000000011s0001003sum000000012", b"01f00000002"),  # duplicate stream id
    ],
)
async def test_gotalk_bad_input_gets_fault_and_close(sent: bytes, expected: bytes) -> None:
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry()) as server:
        reader, writer = await raw_connect(server)
        bystander = await rpc.connect(str(server.url), registry=rpc.Registry())
        writer.write(sent)
        assert await read_all(reader) == expected
        writer.close()
        assert await bystander.request("echo", 1) == 1
        await bystander.close()
        await check_other_client_still_works(server)


@pytest.mark.parametrize(
    "sent",
    [
        b"\x05\x10\x00\x00\x00\x00",  # announces 2**40 bytes
        b"\x01\x03\xff\xff\xff",  # garbage envelope
        # a reply in a conversation that does not exist
        encode_frame(Msg(1, 7, False, True, True, "X", b""), Dialect.CURRENT),
        # id going backwards
        encode_frame(Msg(2, 2, True, True, True, "echo", b"1"), Dialect.CURRENT)
        + encode_frame(Msg(1, 1, True, True, True, "echo", b"1"), Dialect.CURRENT),
    ],
)
async def test_chatter_bad_input_closes_connection(sent: bytes) -> None:
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry()) as server:
        reader, writer = await raw_connect(server)
        writer.write(sent)
        assert await read_all(reader) == b""  # Chatter closes without a word
        writer.close()
        await check_other_client_still_works(server, "?dialect=HatChatter")


async def test_chatter_token_violation_closes_connection() -> None:
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry()) as server:
        reader, writer = await raw_connect(server)
        # a stream request keeps the token with the client; a second "first" message in it
        # from the client is fine, but a client message after passing the token is not
        frames = [
            Msg(1, 1, True, False, False, "sum", b"1"),
            Msg(2, 1, True, True, False, "PeerwireRpc.End", b""),
            Msg(3, 1, True, True, False, "PeerwireRpc.Part", b"2"),
        ]
        writer.write(b"".join(encode_frame(m, Dialect.CURRENT) for m in frames))
        data = await read_all(reader)
        # read_all returned: the server closed on us. Frames read together are dropped with
        # the violation; if TCP split them, the stream's result (sum = 1) may precede it.
        sent_back = ChatterConnection(Dialect.CURRENT, strict=False).receive_data(data)
        assert [(m.type, m.data, m.last) for m in sent_back] in (
            [],
            [("PeerwireRpc.Result", b"1", True)],
        )
        writer.close()
        await check_other_client_still_works(server, "?dialect=HatChatter")


async def test_gotalk_heartbeats_and_read_timeout() -> None:
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=registry(), heartbeat_interval=0.1, read_timeout=0.5
    ) as server:
        reader, writer = await raw_connect(server)
        writer.write(b"01")
        data = await read_all(reader)
        assert data.startswith(b"01h0000")
        assert data.count(b"h0000") >= 2
        assert data.endswith(b"f00000003")
        writer.close()


async def test_gotalk_client_heartbeats_keep_go_style_server_happy() -> None:
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=registry(), heartbeat_interval=None, read_timeout=0.4
    ) as server:
        async with rpc.connect(str(server.url), heartbeat_interval=0.1) as peer:
            # five heartbeats 0.1 s apart: past the server's read timeout, kept open by them
            await wait_until(lambda: any(p.heartbeats_received >= 5 for p in server.peers))
            assert await peer.request("echo", "alive") == "alive"


@contextlib.asynccontextmanager
async def idle_pair(scheme: str, liveness: dict[str, float]) -> AsyncIterator[tuple[Any, Any]]:
    """A server and one plain client with the same liveness settings: (server's peer, client)."""
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=registry(), **liveness) as server:
        async with rpc.connect(
            str(server.url), registry=rpc.Registry(), reconnect=False, **liveness
        ) as client:
            await wait_until(lambda: len(server.peers) == 1)
            (peer,) = server.peers
            yield peer, client


async def test_idle_gotalk_pair_wakes_once_per_heartbeat() -> None:
    """Two peerwire peers at the same interval: one side's timer sends a heartbeat, the other
    answers it at once and moves its read check on, so the pair's timers wake once per
    interval (before: both sides, for a heartbeat and a read check each)."""
    liveness = {"heartbeat_interval": 0.2, "read_timeout": 0.3}
    async with idle_pair("tcp+gotalk", liveness) as (peer, client):
        await wait_until(lambda: peer.heartbeats_received >= 12, timeout=10)
        beats = peer.heartbeats_received + client.heartbeats_received
        assert client.heartbeats_received >= 10  # both ways, the read limit never hit
        assert peer.deadlines.wakeups + client.deadlines.wakeups <= beats // 2 + 4
        assert await client.request("echo", "alive") == "alive"


async def test_idle_chatter_pair_wakes_once_per_ping_exchange() -> None:
    """One side pings and the other answers: a Pong moves the pinger's silence deadline at
    once, and a Ping moves the answerer's past the pinger's next one, so the pair's timers
    wake once per exchange (before: both sides pinged, each woke again for its Pong)."""
    liveness = {"ping_interval": 0.2, "ping_timeout": 0.15}
    async with idle_pair("tcp+sbs", liveness) as (peer, client):
        ours, theirs = peer.adapter.codec, client.adapter.codec

        def exchanges() -> int:
            return ours.pongs_received + theirs.pongs_received

        await wait_until(lambda: exchanges() >= 12, timeout=10)
        assert peer.deadlines.wakeups + client.deadlines.wakeups <= exchanges() + 4
        assert await client.request("echo", "alive") == "alive"


async def test_chatter_ping_closes_silent_peer_and_keeps_answering_one() -> None:
    async with rpc.serve(
        "tcp+sbs://127.0.0.1:0", registry=registry(), ping_interval=0.2, ping_timeout=0.2
    ) as server:
        # a peer that never answers pings is dropped
        reader, writer = await raw_connect(server)
        writer.write(encode_frame(Msg(1, 1, True, True, True, "hi", b""), Dialect.CURRENT))
        data = await read_all(reader, timeout=3)
        assert b"HatChatter.Ping" in data
        writer.close()
        # a peer that answers (our codec does) stays connected
        sock = await ChatterSocket.connect("127.0.0.1", server.url.port, Dialect.CURRENT)
        sock.conn.send("hi")
        sock.flush()
        # a second ping comes only after the first was answered in time
        await sock.pump_until(lambda: sock.conn.pings_received >= 2)
        assert len(server.peers) == 1
        await sock.close()


@settings(max_examples=25)
@given(garbage=st.binary(min_size=1, max_size=200), codec=st.sampled_from(["gotalk", "sbs"]))
async def test_random_bytes_never_hang_or_hurt_others(garbage: bytes, codec: str) -> None:
    async with rpc.serve(
        f"tcp+{codec}://127.0.0.1:0", registry=registry(), options=rpc.Options(max_size=1024)
    ) as server:
        _reader, writer = await raw_connect(server)
        writer.write((b"01" if codec == "gotalk" else b"") + garbage)
        await writer.drain()
        # either the server closes on us, or it waits for more bytes: never stuck busy (the
        # garbage is in its socket before the other client connects)
        writer.close()
        query = "?dialect=HatChatter" if codec == "sbs" else ""
        await check_other_client_still_works(server, query)
        for peer in server.peers:
            codec_obj = peer.codec  # type: ignore[attr-defined]
            assert codec_obj.buffered <= 1024 + 4200


@pytest.mark.parametrize("module", ["PwTest", None])
async def test_chatter_requests_ended_by_their_requester_leave_nothing_behind(
    module: str | None,
) -> None:
    """A stream request whose requester keeps the token and then, in a later read, ends
    the conversation itself (a message with ``last``) can never be answered: the reply
    held for the token, and the mark of a plain Hat peer's request (module other than
    PeerwireRpc), go with it. Before, a legacy peer grew the marks by one per such pair."""
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry()) as server:
        reader, writer = await raw_connect(server)
        sock = ChatterSocket(reader, writer, ChatterConnection(Dialect.LEGACY, strict=False))
        opened = [Msg(i, i, True, False, False, "Nothing", b"", module) for i in range(1, 101)]
        ended = [Msg(101 + i, i, True, True, True, "Bye", b"", module) for i in range(1, 101)]
        for batch, echo_id in ((opened, 101), (ended, 202)):  # ended in a later read
            echo = Msg(echo_id, echo_id, True, True, False, "echo", b'"after"')
            writer.write(b"".join(encode_frame(m, Dialect.LEGACY) for m in [*batch, echo]))
            reply = await sock.receive()
            assert (reply.first, reply.type, reply.data) == (echo_id, "Result", b'"after"')
        [server_peer] = server.peers
        adapter: Any = server_peer.adapter
        assert (len(adapter._foreign), len(adapter._waits.waiting)) == (0, 0)
        await sock.close()


class BuggyRegistry(rpc.Registry):
    """Stands for a bug of ours: looking up ``bug`` raises."""

    def get(self, op: str) -> Any:
        if op == "bug":
            raise RuntimeError("a bug of ours")
        return super().get(op)


async def test_a_bug_of_ours_on_held_input_closes_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Input held back (every handler slot taken, a peer that takes no retry results) and
    handled later, outside the read, closes its connection on a bug of ours as input
    handled at once does, instead of leaving it unread for good."""
    reg = BuggyRegistry()
    reg.handle("echo")(lambda value: value)
    release = asyncio.Event()

    @reg.handle("slow")
    async def slow(value: Any) -> Any:
        await release.wait()
        return value

    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, options=options, retry_results=False
    ) as server:
        peer = await rpc.connect(str(server.url), registry=rpc.Registry(), reconnect=False)
        slow_call = asyncio.ensure_future(peer.request("slow", 1, timeout=10))
        bug_call = asyncio.ensure_future(peer.request("bug", 2, timeout=10))
        [server_peer] = server.peers
        await wait_until(lambda: server_peer._kept.messages)  # "bug" held back
        with caplog.at_level(logging.ERROR, logger="peerwire.rpc"):
            release.set()
            async with asyncio.timeout(5):
                await peer.closed
        assert "unexpected error handling input; closing" in caplog.text
        for call in (slow_call, bug_call):
            with contextlib.suppress(rpc.ConnectionClosed):
                await call
        assert bug_call.exception() is not None
        await peer.close()
        await check_other_client_still_works(server)


async def test_chatter_replies_held_for_a_kept_token_are_bounded_in_bytes() -> None:
    """A requester that keeps its stream's token holds our stream handler's results: at
    most max_size bytes of them wait, past which the stream's replies become one error."""
    reg = registry()
    produced = 0

    @reg.handle_stream("big")
    async def big(parts: Any) -> Any:
        nonlocal produced
        async for _ in parts:
            produced += 1
            yield b"x" * 300_000

    options = rpc.Options(max_size=1_000_000)
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=reg, options=options) as server:
        reader, writer = await raw_connect(server)
        sock = ChatterSocket(reader, writer, ChatterConnection(Dialect.CURRENT, strict=False))
        frames = [Msg(1, 1, True, False, False, "big", b"0")]
        frames += [Msg(i, 1, True, False, False, "PeerwireRpc.Part", b"0") for i in range(2, 8)]
        writer.write(b"".join(encode_frame(m, Dialect.CURRENT) for m in frames))
        [server_peer] = server.peers
        adapter: Any = server_peer.adapter
        await wait_until(lambda: produced == 7)
        assert adapter._waits.held_bytes <= 1_000_000
        end = Msg(8, 1, True, True, False, "PeerwireRpc.End", b"")
        writer.write(encode_frame(end, Dialect.CURRENT))
        reply = await sock.receive()
        assert (reply.type, reply.last) == ("PeerwireRpc.Error", True)
        assert b"bytes of results waiting" in reply.data
        assert adapter._waits.held_bytes == 0
        await sock.close()
        await check_other_client_still_works(server, "?dialect=HatChatter")


@pytest.mark.parametrize("scheme", ["tcp+gotalk", "ws+gotalk"])
async def test_a_refused_protocol_option_leaves_no_socket_behind(scheme: str) -> None:
    """The peer is made before the connection: an option it does not take raises there,
    with no socket connected and left to the garbage collector."""
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=rpc.Registry()) as server:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            with pytest.raises(TypeError, match="no_such_option"):
                await rpc.connect(str(server.url), reconnect=False, no_such_option=1)
            gc.collect()
        assert [str(w.message) for w in caught if w.category is ResourceWarning] == []
        assert not server.peers


@pytest.mark.both_loops
@pytest.mark.parametrize("scheme", ["tcp+gotalk", "tcp+sbs"])
async def test_a_streamed_result_cut_off_at_a_yield_is_closed_at_once(scheme: str) -> None:
    """A client that stops reading a streamed result and goes away while the server waits
    for its output to drain: the handler's generator is closed then (its ``async with`` lock
    released), not when a cyclic gc comes. Before, another call needing the lock timed
    out (gc off here, so that none comes by chance)."""
    reg = rpc.Registry()
    lock = asyncio.Lock()

    @reg.handle("export")
    async def export(_: Any) -> Any:
        async with lock:
            for _ in range(10**7):
                yield "x" * 1000

    @reg.handle("locked")
    async def locked(_: Any) -> str:
        async with lock:
            return "got the lock"

    gc.disable()
    try:
        async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=reg) as server:
            url = str(server.url) + ("?dialect=HatChatter" if scheme == "tcp+sbs" else "")
            first = await rpc.connect(url, registry=rpc.Registry(), reconnect=False)
            results = first.stream("export", value=1)
            await anext(results)  # then nothing more is read
            [served] = server.peers
            await wait_until(lambda: served.outbox.blocked)
            first.abort()
            await served.closed
            async with rpc.connect(url, registry=rpc.Registry(), reconnect=False) as second:
                assert await second.request("locked", 1, timeout=2) == "got the lock"
            await results.aclose()
    finally:
        gc.enable()
