"""What is written at once rather than by the flush one loop iteration later (the outbox's
hold): a lone request, stream or upload of ours, and the last word of a handler's job when
it is the only one; and that the hold is let go of before a wait for the transport."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import FLAVOURS, served, wait_until

pytestmark = pytest.mark.parametrize("flavour", list(FLAVOURS))


def make_registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("raw")
    def raw(data: bytes) -> bytes:
        return data[::-1]

    @reg.handle("count")
    async def count(n: int):
        for i in range(1, n + 1):
            yield i

    @reg.handle_stream("sum")
    async def total(parts):
        return sum([p async for p in parts])

    return reg


async def pass_through(call: rpc.Call, call_next: Any) -> Any:
    return await call_next(call)


@pytest.mark.parametrize("kind", ["request", "stream", "upload"])
@pytest.mark.parametrize("middleware", [False, True], ids=["plain", "middleware"])
async def test_lone_request_is_written_at_once(flavour: str, kind: str, middleware: bool) -> None:
    """A request (or a stream's, without parts or with a list's parts and their end) with
    no other call in flight is written by the call itself, not by a flush at the end of
    the loop iteration; requests made together still share a write. The same through
    middleware, whose path sends its own requests."""
    loop = asyncio.get_running_loop()
    chain = {"middleware": [pass_through]} if middleware else {}
    async with served(flavour, make_registry(), **chain) as (_, peer):
        queued: list[int] = []

        def look() -> None:  # runs after the steps scheduled before it, before any flush
            queued.append(peer.outbox.queued)

        async def call() -> Any:
            if kind == "request":
                return await peer.request("raw", b"abc", raw=True)
            if kind == "upload":
                return [x async for x in peer.stream("sum", parts=[1, 2])]
            return [x async for x in peer.stream("count", value=2)]

        expected = {"request": b"cba", "stream": [1, 2], "upload": [3]}[kind]
        alone = asyncio.create_task(call())
        loop.call_soon(look)
        assert await alone == expected
        together = [asyncio.create_task(call()) for _ in range(5)]
        loop.call_soon(look)
        assert await asyncio.gather(*together) == [expected] * 5
        assert queued[0] == 0  # handed to the transport in the task's first step
        assert queued[1] > 0  # the first of five went at once, four wait for the flush


async def test_lone_upload_waits_for_the_transport_to_drain(flavour: str) -> None:
    """A lone upload of a plain iterable's parts is written under the outbox's hold, which
    it lets go of before it waits for the transport to drain: the server, which runs only
    while the caller waits, never finds the hold taken, and every part arrives."""
    reg = rpc.Registry()
    held_while_served: list[bool] = []

    async with served(flavour, reg) as (_, peer):

        @reg.handle_stream("size")
        async def size(parts: AsyncIterator[bytes]) -> int:
            total = 0
            async for part in parts:
                held_while_served.append(peer.outbox.held)
                total += len(part)
            return total

        # a small send buffer: the transport pushes back after a few parts on any host
        sock = peer.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        chunk = b"x" * (128 * 1024)
        seen: list[tuple[bool, bool]] = []  # (held, blocked) as each part is taken

        def parts() -> Iterator[bytes]:  # a plain generator: never returns to the loop
            for _ in range(64):
                seen.append((peer.outbox.held, peer.outbox.blocked))
                yield chunk

        results = [x async for x in peer.stream("size", parts=parts())]
    assert results == [64 * len(chunk)]
    assert seen[1] == (True, False)  # the hold was taken for the parts
    assert any(blocked for _, blocked in seen)  # and the upload had to wait
    assert len(held_while_served) == 64 and not any(held_while_served)


@pytest.mark.parametrize("kind", ["single", "stream"])
@pytest.mark.parametrize("fails", [False, True], ids=["result", "error"])
@pytest.mark.parametrize("middleware", [False, True], ids=["plain", "middleware"])
async def test_last_job_reply_is_written_at_once(
    flavour: str, middleware: bool, fails: bool, kind: str
) -> None:
    """The last word of a handler's job (a coroutine's result or error, a streamed result's
    end or error, with its part) is written at once when the job is the only one (with
    middleware too: that path sends its own replies); while others run, it waits for the
    loop iteration's flush, to share a write with theirs."""
    loop = asyncio.get_running_loop()
    gates = {n: asyncio.Event() for n in (1, 2, 3)}
    waiting: list[int] = []
    queued: list[tuple[int, int]] = []
    reg = rpc.Registry()

    async def gate(n: int) -> None:
        """Wait for ``n``'s gate, then look at the server's queued bytes once this step
        (which sends the reply or the part and the end) is done, before any flush."""
        waiting.append(n)
        await gates[n].wait()
        server_side = rpc.current_peer.get()
        loop.call_soon(lambda: queued.append((n, server_side.outbox.queued)))

    @reg.handle("gated")
    async def gated(n: int) -> int:
        await gate(n)
        if fails:
            raise ValueError(f"failed {n}")
        return n

    @reg.handle("gated_stream")
    async def gated_stream(n: int):
        await gate(n)
        yield n
        if fails:
            raise ValueError(f"failed {n}")

    async def call(n: int) -> Any:
        if kind == "single":
            return await peer.request("gated", n)
        return [x async for x in peer.stream("gated_stream", value=n)]

    chain = {"middleware": [pass_through]} if middleware else {}
    async with served(flavour, reg, **chain) as (_, peer):
        calls = {n: asyncio.create_task(call(n)) for n in (1, 2, 3)}
        await wait_until(lambda: sorted(waiting) == [1, 2, 3])
        for n in (2, 3, 1):
            gates[n].set()  # one at a time: 2 and 3 end while others still run, 1 last
            if fails:
                with pytest.raises(rpc.RemoteError, match=f"failed {n}"):
                    await calls[n]
            else:
                assert await calls[n] == (n if kind == "single" else [n])
    assert [n for n, _ in queued] == [2, 3, 1]
    assert queued[0][1] > 0 and queued[1][1] > 0  # others ran: these waited for the flush
    assert queued[2][1] == 0  # the only job: handed to the transport in its last step
