"""transports.read_buffer: stream connections read into one buffer per thread.

Every connection of a thread reads into the same buffer, so these tests move payloads larger
than it (several reads each) over several connections at once, on every stream transport,
both loops, and in two threads at once, and check that each caller gets its own bytes back,
and that the reads did go through the buffer (the transports called ``buffer_updated``).
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

import rpc
from tests.certs import Pki
from transports.read_buffer import READ_SIZE, SharedBufferProtocol, read_buffer, take
from transports.stream import client_ssl_context, server_ssl_context

pytestmark = pytest.mark.timeout(120)

SIZE = READ_SIZE + READ_SIZE // 2
"""Each payload: more than one read's worth."""


def echo_registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("echo")
    def echo(data: bytes) -> bytes:
        return data

    return reg


async def exchange(url: str, callers: int, rounds: int, client_args: dict[str, object]) -> None:
    """``callers`` connections, each calling ``echo`` with payloads of its own, all at once."""

    async def caller() -> None:
        async with rpc.connect(url, **client_args) as peer:  # type: ignore[arg-type]
            for _ in range(rounds):
                payload = os.urandom(SIZE)
                assert await peer.request("echo", payload, raw=True) == payload

    await asyncio.gather(*(caller() for _ in range(callers)))


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every read the transports made through the shared buffer."""
    sizes: list[int] = []
    buffer_updated = SharedBufferProtocol.buffer_updated

    def counted(self: SharedBufferProtocol, nbytes: int) -> None:
        sizes.append(nbytes)
        buffer_updated(self, nbytes)

    monkeypatch.setattr(SharedBufferProtocol, "buffer_updated", counted)
    return sizes


def test_one_buffer_per_thread_and_take_copies() -> None:
    view = read_buffer()
    assert len(view) == READ_SIZE and read_buffer() is view
    others: list[memoryview] = []
    thread = threading.Thread(target=lambda: others.append(read_buffer()))
    thread.start()
    thread.join()
    assert others[0] is not view and len(others[0]) == READ_SIZE
    view[:5] = b"hello"
    taken = take(5)
    view[:5] = b"HELLO"
    assert taken == b"hello" and isinstance(taken, bytes)


@pytest.mark.both_loops
@pytest.mark.parametrize("scheme", ["tcp+gotalk", "tcp+sbs", "ws+gotalk", "ssl+gotalk", "ssl+sbs"])
async def test_connections_sharing_the_buffer_get_their_own_bytes(
    pki: Pki, scheme: str, reads: list[int]
) -> None:
    server_args: dict[str, object] = {}
    client_args: dict[str, object] = {}
    if scheme.startswith("ssl"):
        server_args["ssl"] = server_ssl_context(pki.server_cert, pki.server_key)
        client_args["ssl"] = client_ssl_context(cafile=pki.ca)
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0", registry=echo_registry(), **server_args
    ) as server:
        await exchange(str(server.url), callers=4, rounds=3, client_args=client_args)
    # both directions of 12 calls of 384 KiB each, all read through the buffer
    assert sum(reads) >= 2 * 12 * SIZE
    assert max(reads) <= READ_SIZE


def test_threads_with_loops_of_their_own_do_not_share_it() -> None:
    failures: list[BaseException] = []

    async def both_ends() -> None:
        async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=echo_registry()) as server:
            await exchange(str(server.url), callers=3, rounds=4, client_args={})

    def run() -> None:
        try:
            asyncio.run(both_ends())
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
