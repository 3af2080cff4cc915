"""``strict=False`` Chatter peers keep no conversation state: they still answer every
request, whatever the peer's conversation did, and still speak to strict peers."""

from __future__ import annotations

import asyncio
from typing import Any

import rpc
from tests.chatter_socket import ChatterSocket
from wire.chatter import ChatterConnection, Dialect, Msg, encode_frame


def registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    @reg.handle("fail")
    def fail(value: Any) -> Any:
        raise ValueError("no such thing")

    @reg.handle_stream("sum")
    async def total(parts: Any) -> int:
        return sum([p async for p in parts])

    @reg.handle("count")
    async def count(n: int) -> Any:
        for i in range(n):
            yield i

    return reg


async def test_lenient_server_answers_a_strict_client() -> None:
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry(), strict=False) as server:
        url = f"{server.url}?dialect=HatChatter"
        async with rpc.connect(url, registry=rpc.Registry()) as peer:
            assert await peer.request("echo", {"a": 1}) == {"a": 1}
            try:
                await peer.request("fail", None)
            except rpc.RemoteError as exc:
                assert "no such thing" in str(exc)
            else:
                raise AssertionError("no error result")
            assert [i async for i in peer.stream("count", value=3)] == [0, 1, 2]
            assert [i async for i in peer.stream("sum", parts=[1, 2, 3])] == [6]


async def test_lenient_client_calls_a_strict_server() -> None:
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry()) as server:
        url = f"{server.url}?dialect=HatChatter"
        async with rpc.connect(url, registry=rpc.Registry(), strict=False) as peer:
            assert await peer.request("echo", "x") == "x"
            assert [i async for i in peer.stream("count", value=2)] == [0, 1]
            assert [i async for i in peer.stream("sum", parts=[4, 5])] == [9]


async def test_lenient_server_answers_where_the_token_never_came_back() -> None:
    """A stream request whose requester ends its parts but keeps the token: a strict
    server would hold the result for the token that never comes; a lenient one answers."""
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry(), strict=False) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        sock = ChatterSocket(reader, writer, ChatterConnection(Dialect.CURRENT, strict=False))
        try:
            frames = [
                Msg(1, 1, True, False, False, "sum", b"5"),
                Msg(2, 1, True, False, False, "PeerwireRpc.End", b""),  # token not handed over
            ]
            sock.writer.write(b"".join(encode_frame(m, Dialect.CURRENT) for m in frames))
            reply = await sock.receive()
            assert (reply.first, reply.owner, reply.type, reply.data) == (
                1,
                False,
                "PeerwireRpc.Result",
                b"5",
            )
        finally:
            await sock.close()


async def test_lenient_server_streams_results_to_a_strict_client_sending_parts() -> None:
    """Handlers that answer each part as it comes, or the first before the rest: a lenient
    server keeps its results until the stream's End (the strict client holds the token
    until then), whether or not the handler still reads the parts."""
    reg = registry()
    answered: asyncio.Queue[int] = asyncio.Queue()  # parts the handlers answered

    @reg.handle_stream("each")
    async def each(parts: Any) -> Any:
        async for part in parts:
            yield part * 10  # resumed once the result has gone to be sent
            answered.put_nowait(part)

    @reg.handle_stream("first")
    async def first(parts: Any) -> Any:  # answers before the rest of the parts
        async for part in parts:
            answered.put_nowait(part)  # its result goes out in this same step
            return part * 100
        return None

    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=reg, strict=False) as server:
        url = f"{server.url}?dialect=HatChatter"
        async with rpc.connect(url, registry=rpc.Registry()) as peer:

            async def parts() -> Any:  # the rest once the first part has been answered
                yield 1
                assert await asyncio.wait_for(answered.get(), 5) == 1
                yield 2
                yield 3

            assert [i async for i in peer.stream("each", parts=parts())] == [10, 20, 30]
            while not answered.empty():  # the answers to parts 2 and 3
                answered.get_nowait()
            assert [i async for i in peer.stream("first", parts=parts())] == [100]
            assert await peer.request("echo", "still open") == "still open"
