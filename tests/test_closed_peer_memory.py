"""What a connection held goes when it closes, not when its peer is collected: a peer lives
in reference cycles, and a steady server may not run a cyclic collection for a long time,
so a part-read message (up to ``max_size``) or a table of unanswered conversations kept by
a closed peer would hold its memory that long."""

from __future__ import annotations

import asyncio

import pytest

import rpc
from tests.browser import eventually
from tests.gotalk_raw import RawGotalk
from wire import gotalk, metadata

pytestmark = pytest.mark.both_loops

PART_READ = {
    # a request header announcing 8 MiB, then 100 kB of its payload
    "tcp+gotalk": b"01r0001004echo00800000" + b"x" * 100_000,
    # a Chatter frame of 8 MiB (3 size bytes), then 100 kB of it
    "tcp+sbs": b"\x03\x7f\xff\xff" + b"x" * 100_000,
}


@pytest.mark.parametrize("scheme", sorted(PART_READ))
async def test_a_part_read_message_goes_with_the_connection(scheme: str) -> None:
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=rpc.Registry()) as server:
        _, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        writer.write(PART_READ[scheme])
        await eventually(
            lambda: server.peers and next(iter(server.peers)).adapter.codec.buffered >= 100_000,
            "the part-read message is held",
        )
        [peer] = server.peers
        writer.transport.abort()
        await eventually(lambda: not server.peers, "the connection closed")
        assert peer.adapter.codec.buffered == 0


async def test_a_closed_chatter_connection_forgets_its_conversations_and_metadata() -> None:
    never = asyncio.Event()
    registry = rpc.Registry()

    @registry.handle("wait")
    async def wait(_: object = None) -> None:
        await never.wait()

    async with rpc.serve("tcp+sbs://127.0.0.1:0?dialect=HatChatter", registry=registry) as srv:
        url = f"tcp+sbs://127.0.0.1:{srv.url.port}?dialect=HatChatter"
        client = await rpc.connect(url, reconnect=False)
        calls = [asyncio.ensure_future(client.request("wait", timeout=30)) for _ in range(50)]
        await eventually(
            lambda: srv.peers and next(iter(srv.peers)).adapter.codec.open_conversations >= 50,
            "every request open",
        )
        [peer] = srv.peers
        client.abort()  # the calls are not waited for
        await eventually(lambda: not srv.peers, "the connection closed")
        await asyncio.gather(*calls, return_exceptions=True)
        assert peer.adapter.codec.open_conversations == 0


async def test_metadata_waiting_for_its_request_goes_with_the_connection() -> None:
    """A Gotalk peer at extension level 2 sends a request's metadata, then leaves before
    the request: the record (up to 1 MiB of them) goes with the connection."""
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=rpc.Registry()) as server:
        raw = await RawGotalk.connect(server.url.port, level=b"2")
        hello = await raw.next()
        assert isinstance(hello, gotalk.Notification) and hello.payload == b"2"
        raw.metadata(b"\x00\x00\x00\x01", metadata.RequestMeta(5_000, {"k": "v" * 1000}))
        await eventually(
            lambda: server.peers and next(iter(server.peers)).adapter.meta.pending,
            "the metadata waits for its request",
        )
        [peer] = server.peers
        raw.writer.transport.abort()
        await eventually(lambda: not server.peers, "the connection closed")
        assert not peer.adapter.meta.pending and peer.adapter.meta.pending_bytes == 0
