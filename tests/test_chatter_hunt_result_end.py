"""A streamed result ends when its server can send no more in our conversation: its End,
but also a ``PeerwireRpc.Part`` with ``last`` (the conversation is over) or one passing the
token back to us (only the token holder sends). Before, only the End ended it: the caller
read the parts, then waited for the rest until its timeout (for good with
``timeout=None``)."""

from __future__ import annotations

import asyncio

import pytest

import rpc
from wire.chatter import ChatterConnection, Conversation, Dialect


@pytest.mark.parametrize(("token", "last"), [(True, True), (False, True), (True, False)])
async def test_a_streamed_result_ends_with_a_part_that_leaves_the_server_no_turn(
    token: bool, last: bool
) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        codec = ChatterConnection(Dialect.CURRENT)
        while data := await reader.read(65536):
            for msg in codec.receive_data(data):
                if msg.type == "count":
                    conv = Conversation.of_received(msg)
                    codec.send("PeerwireRpc.Part", b"1", conversation=conv, token=False, last=False)
                    codec.send("PeerwireRpc.Part", b"2", conversation=conv, token=token, last=last)
            writer.write(codec.data_to_send())
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with rpc.connect(
            f"tcp+sbs://127.0.0.1:{port}?dialect=HatChatter", reconnect=False
        ) as peer:
            async with asyncio.timeout(1.5):
                got = [x async for x in peer.stream("count", value=2, timeout=None)]
            assert got == [1, 2]
            assert peer.codec.open_conversations == 0  # type: ignore[attr-defined]
    finally:
        server.close()
        await server.wait_closed()
