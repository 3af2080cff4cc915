"""A Hat-style peer's Ping with flags we cannot answer under the conversation rules (sent
with ``last``, or keeping the token) leaves its connection serving: it counts as a sign of
life and gets no Pong (the references check no flags and close for none)."""

from __future__ import annotations

import pytest

import rpc
from tests.chatter_socket import ChatterSocket
from tests.rpc_helpers import wait_until
from wire.chatter import Dialect
from wire.chatter.connection import PING_TYPES


@pytest.mark.parametrize("dialect", list(Dialect))
@pytest.mark.parametrize(("token", "last"), [(True, True), (False, False)])
async def test_unanswerable_ping_then_a_request_is_served(
    dialect: Dialect, token: bool, last: bool
) -> None:
    reg = rpc.Registry()

    @reg.handle("echo")
    def echo(value: int) -> int:
        return value

    module, ping, _ = PING_TYPES[dialect]
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=reg) as server:
        sock = await ChatterSocket.connect("127.0.0.1", server.url.port, dialect)
        try:
            sock.conn.send(ping, token=token, last=last, module=module)
            sock.conn.send("echo", b"7", last=False)  # one write with the Ping
            sock.flush()
            reply = await sock.receive()
            name = f"{reply.module}.{reply.type}" if reply.module else reply.type
            assert (name, reply.data, reply.last) == ("PeerwireRpc.Result", b"7", True)
            assert sock.conn.pongs_received == 0
            await wait_until(lambda: len(server.peers) == 1)
            (peer,) = server.peers
            assert peer.adapter.codec.pings_received == 1  # type: ignore[attr-defined]
        finally:
            await sock.close()


async def test_ping_defaults_are_the_reference_implementations() -> None:
    """Both ends default to a Ping after 20 s of inbound silence, answered within 20 s, as
    hat-drivers and hat-chatter run (not the Hat Chatter documents' 30 s / 5 s, in no code):
    a Hat peer that a long handler keeps from answering for 5-20 s keeps its connection
    to a reference peer, so it must keep ours. Our ping_timeout was 5 s."""
    async with rpc.serve("tcp+sbs://127.0.0.1:0") as server:
        async with rpc.connect(f"tcp+sbs://127.0.0.1:{server.url.port}", reconnect=False) as peer:
            await wait_until(lambda: server.peers)
            [served] = server.peers
            for pings in (peer.adapter.pings, served.adapter.pings):
                assert (pings.interval, pings.timeout) == (20.0, 20.0)
