"""Replay the bytes real Go gotalk peers sent (recorded transcripts) against our
server, and play the Go server's side against our client."""

from __future__ import annotations

import asyncio

import pytest

import rpc
from tests.rpc_helpers import gotalk_peer_registry, served, wait_until


async def exchange(port: int, steps: list[tuple[bytes, bytes]]) -> None:
    """Send each client chunk and expect exactly the server bytes that follow it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"  # written on accept
        for sent, expected in steps:
            writer.write(sent)
            got = b""
            async with asyncio.timeout(5):
                while len(got) < len(expected):
                    chunk = await reader.read(65536)
                    assert chunk, f"closed after {got!r}"
                    got += chunk
            assert got == expected
        # still alive, and nothing extra came: the server answers in order, so anything more
        # it had to say about the steps would come before this reply
        writer.write(b"r\xff\xff\xff\xff004echo00000001!")
        assert await asyncio.wait_for(reader.read(65536), 5) == b"R\xff\xff\xff\xff00000001!"
    finally:
        writer.close()


SCENARIOS = {
    "handshake + echo": [(b"01", b""), (b'r0001004echo00000007"hello"', b'R000100000007"hello"')],
    "pipelined handshake": [(b'01r0001004echo00000007"hello"', b'R000100000007"hello"')],
    "greet": [(b'01r0002005greet0000000e{"name":"Bob"}', b'R000200000018{"greeting":"Hello Bob"}')],
    "empty payload": [(b"01r0005004echo00000000", b"R000500000000")],
    "uppercase hex size": [(b'01r0006004echo0000000A"abcdefgh"', b'R00060000000a"abcdefgh"')],
    "unknown operation": [(b"01r0003004nope00000002{}", b'E000300000018unknown operation "nope"')],
    "handler error": [(b"01r0004004fail00000000", b"E000400000014something went wrong")],
    "server notification": [
        (b'01r0007008notifyme00000007{"x":1}', b'n004note00000007{"x":1}R000700000004"ok"')
    ],
    "client notification then echo": [
        (b"01n005hello00000002{}", b""),
        (b"r0008004echo00000001x", b"R000800000001x"),
    ],
    "client heartbeat then echo": [
        (b"01h000254d7de9a", b""),
        (b"r0009004echo00000001y", b"R000900000001y"),
    ],
    "stream request": [
        (b"01s000a006stream00000005part1", b"S000a00000005part1"),
        (b"p000a00000005part2", b"S000a00000005part2"),
        (b"p000a00000000", b"S000a00000000"),
    ],
    "pipelining out of order": [
        (
            b'01r000b005sleep0000000a{"ms":300}r000c004echo00000004fast',
            b'R000c00000004fastR000b0000000d{"slept":300}',
        )
    ],
    "binary request id": [(b"01r\x00\x01\xfe\xff004echo00000001z", b"R\x00\x01\xfe\xff00000001z")],
    "response for unknown id ignored": [
        (b"01RABCD00000002{}", b""),
        (b"r000d004echo00000001q", b"R000d00000001q"),
    ],
    "client sends f00000002": [(b"01f00000002", b"")],
    "go client binary little-endian ids": [
        (
            b'01r\x03\x00\x00\x00004echo00000004"hi"r\x04\x00\x00\x00004echo00000004"hi"',
            b'R\x03\x00\x00\x0000000004"hi"R\x04\x00\x00\x0000000004"hi"',
        )
    ],
    "gotalk.js stream ids": [
        (
            b"01s!000006stream00000005part1p!00000000005part2p!00000000000",
            b"S!00000000005part1S!00000000005part2S!00000000000",
        )
    ],
}


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_go_client_bytes_against_our_server(name: str) -> None:
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=gotalk_peer_registry()) as server:
        if name == "client sends f00000002":
            # a Fault from the peer means it is going away: we close too
            reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
            writer.write(b"01f00000002")
            async with asyncio.timeout(5):
                assert await reader.read() == b"01"
            writer.close()
            return
        await exchange(server.url.port, SCENARIOS[name])


async def test_invalid_json_gets_error_result() -> None:
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=gotalk_peer_registry()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        writer.write(b"01r0002005greet00000003{x}")
        data = await asyncio.wait_for(reader.readuntil(b"E0002"), 5)
        assert data == b"01E0002"
        size = int(await reader.readexactly(8), 16)
        assert b"invalid JSON" in await reader.readexactly(size)
        writer.close()


async def test_rate_limited_server_answers_retry_result() -> None:
    options = rpc.Options(max_concurrent=0, retry_wait=3.494)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=gotalk_peer_registry(), options=options
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        writer.write(b'01r0001004echo00000007"hello"')
        expected = b"01e000100000da600000012request rate limit"
        assert await asyncio.wait_for(reader.readexactly(len(expected)), 5) == expected
        writer.close()


# --- our client against a scripted Go server -------------------------------------------------


async def scripted_go_server(script) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"01")
        assert await reader.readexactly(2) == b"01"
        try:
            await script(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


SKIPPED_NOTIFICATIONS: list[bytes] = []
"""Notifications our client sent the scripted Go server, which (like Go) ignores them."""


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes, bytes]:
    """Read one r message (skipping heartbeats and notifications): (id, op, payload)."""
    while True:
        kind = await reader.readexactly(1)
        if kind == b"h":
            await reader.readexactly(12)
            continue
        if kind == b"n":
            name = await reader.readexactly(int(await reader.readexactly(3), 16))
            await reader.readexactly(int(await reader.readexactly(8), 16))
            SKIPPED_NOTIFICATIONS.append(name)
            continue
        assert kind == b"r"
        rid = await reader.readexactly(4)
        op = await reader.readexactly(int(await reader.readexactly(3), 16))
        payload = await reader.readexactly(int(await reader.readexactly(8), 16))
        return rid, op, payload


async def test_our_client_against_go_server_script() -> None:
    notes: asyncio.Queue = asyncio.Queue()
    client_reg = rpc.Registry()

    @client_reg.handle_notification("note")
    def on_note(value):
        notes.put_nowait(value)

    first_read = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rid, op, payload = await read_request(reader)
        assert (op, payload) == (b"echo", b'"hello"')
        writer.write(b"R" + rid + b'00000007"hello"')
        rid, op, _ = await read_request(reader)
        assert op == b"nope"
        writer.write(b"E" + rid + b'00000018unknown operation "nope"')
        rid, op, payload = await read_request(reader)
        # rate limited once (wait 0x0a ms), then answered: the client must retry
        writer.write(b"e" + rid + b"0000000a00000012request rate limit")
        rid2, op2, payload2 = await read_request(reader)
        assert (op2, payload2) == (op, payload)
        writer.write(b'n004note00000007{"x":1}h00006b025d6dR' + rid2 + b'00000004"ok"')
        rid, op, _ = await read_request(reader)
        assert op == b"count"
        writer.write(b"S" + rid + b"000000011S" + rid + b"000000012S" + rid + b"00000000")
        rid, op, _ = await read_request(reader)
        first_read.set()
        # two results out of order, split across writes mid-header
        rid_b, _, _ = await read_request(reader)
        writer.write(b"R" + rid_b + b"0000")
        # the rest goes once our client holds the first 9 bytes, a header cut short
        await wait_until(lambda: peer.adapter.codec.buffered == 9)
        writer.write(b'0003"b"R' + rid + b'00000003"a"')
        await reader.read()  # until the client closes

    SKIPPED_NOTIFICATIONS.clear()
    server, port = await scripted_go_server(script)
    url = f"tcp+gotalk://127.0.0.1:{port}"
    async with server, rpc.connect(url, registry=client_reg, reconnect=False) as peer:
        assert await peer.request("echo", "hello") == "hello"
        with pytest.raises(rpc.RemoteError, match='unknown operation "nope"'):
            await peer.request("nope", {})
        assert await peer.request("limited", 1) == "ok"
        assert await asyncio.wait_for(notes.get(), 5) == {"x": 1}
        assert [x async for x in peer.stream("count", value=2)] == [1, 2]
        first = asyncio.create_task(peer.request("a"))
        await asyncio.wait_for(first_read.wait(), 5)  # the script reads "a" first
        second = asyncio.create_task(peer.request("b"))
        assert await asyncio.gather(first, second) == ["a", "b"]
        # like a Go server, the script ignored our extension announcement: nothing more of
        # the extension (no cancel notifications) was ever sent to it
        assert SKIPPED_NOTIFICATIONS == [b"peerwire/hello"]
        assert not peer.adapter.cancels


async def test_request_ids_skip_one_in_flight_once_the_count_wraps_around() -> None:
    """Our request ids count up from 1 (little-endian); once the count wraps around after
    2**32 ids (set here) a new request skips an id that a call in flight still holds, so
    both calls get their own results."""
    release = asyncio.Event()
    registry = rpc.Registry()

    @registry.handle("wait")
    async def wait(value: object) -> str:
        await release.wait()
        return "waited"

    @registry.handle("echo")
    def echo(value: str) -> str:
        return value

    async with served("gotalk", registry) as (_, peer):
        waiting = asyncio.ensure_future(peer.request("wait"))
        first = (1).to_bytes(4, "little")
        await wait_until(lambda: peer.has_call(first))
        peer.adapter._next_id = 2**32  # as after 2**32 requests: the next id is 1 again
        assert await asyncio.wait_for(peer.request("echo", "after"), 5) == "after"
        assert peer.has_call(first)  # still the waiting call's
        release.set()
        assert await asyncio.wait_for(waiting, 5) == "waited"
