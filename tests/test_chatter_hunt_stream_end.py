"""A stream request's parts end when its requester can send no more in its conversation:
its End, but also a message with ``last`` (it ended the conversation) or, under the
conversation checks, one passing the token (only the token holder sends). Before, only a
``PeerwireRpc.End`` ended them: a Chatter peer that closed its stream request with a
``last`` Part (or a type of its own), or handed the token over with its last Part, left the
handler waiting for parts for as long as the connection lasted, holding its slot."""

from __future__ import annotations

from typing import Any

import pytest

import rpc
from tests.chatter_socket import ChatterSocket
from tests.rpc_helpers import wait_until
from wire.chatter import Conversation, Dialect


def _send(sock: ChatterSocket, name: str, data: bytes, conv: Any, token: bool, last: bool) -> Any:
    module = None
    if sock.conn.dialect is Dialect.LEGACY and "." in name:
        module, _, name = name.rpartition(".")
    return sock.conn.send(name, data, conversation=conv, token=token, last=last, module=module)


@pytest.mark.parametrize("dialect", list(Dialect))
@pytest.mark.parametrize(
    ("closing", "token", "last", "answered"),
    [
        ("PeerwireRpc.Part", False, True, False),  # the last part ends the conversation
        ("Other.Type", True, True, False),  # a type of the peer's own, with last
        ("PeerwireRpc.Part", True, False, True),  # the token passed with the last part
    ],
)
async def test_parts_end_when_the_requester_can_send_no_more(
    dialect: Dialect, closing: str, token: bool, last: bool, answered: bool
) -> None:
    reg = rpc.Registry()
    results: list[int] = []

    @reg.handle_stream("sum")
    async def total(parts: Any) -> int:
        results.append(sum([p async for p in parts]))
        return results[-1]

    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=reg) as server:
        sock = await ChatterSocket.connect("127.0.0.1", server.url.port, dialect)
        try:
            conv = Conversation.ours(_send(sock, "sum", b"", None, False, False).id)
            _send(sock, "PeerwireRpc.Part", b"1", conv, False, False)
            _send(sock, closing, b"2", conv, token, last)
            sock.flush()
            await wait_until(lambda: results, timeout=1.5)
            assert results == [3 if closing == "PeerwireRpc.Part" else 1]
            if answered:  # we hold the token: the result goes back
                reply = await sock.receive(timeout=1.5)
                name = f"{reply.module}.{reply.type}" if reply.module else reply.type
                assert (name, reply.data, reply.last) == ("PeerwireRpc.Result", b"3", True)
            else:  # the conversation is over: nothing goes back, the connection serves on
                conv2 = Conversation.ours(_send(sock, "sum", b"", None, False, False).id)
                _send(sock, "PeerwireRpc.End", b"", conv2, True, False)
                sock.flush()
                reply = await sock.receive(timeout=1.5)
                assert (reply.first, reply.data, reply.last) == (conv2.first, b"0", True)
        finally:
            await sock.close()
